"""Running one session's harness: the user's function on a thread of its own, or the user's program in a process
group of its own, each past its deadline stopped and named.

A function ``run(session)`` (plain or ``async``) returns the reward: a real number, or ``None`` to let
``reward.function`` score the session's last reply. A command (``episode.harness_command``, an argv list: no shell)
gets ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``OPENAI_MODEL`` in its environment and the session as JSON on
its standard input (:meth:`~groupwise.harness.session.HarnessSession.as_data`; also in ``GROUPWISE_SESSION``); it
reports the reward by writing it to the file named by ``GROUPWISE_REWARD_FILE`` or as its last line of standard
output (a number, or ``null``; no output: ``reward.function`` scores). It must exit with status 0.

A harness that raises, exits non-zero, answers something else than a number or ``None``, or runs past
``episode.harness_timeout_s`` fails its session with a :class:`SessionFailure` saying which: never a reward of 0. A
command past its deadline is killed with its whole process group; a function's thread cannot be killed, so it is
abandoned and its session's key stops working.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
import numbers
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from groupwise.abandoned import leave_running
from groupwise.data.scoring import MAX_ABS_REWARD
from groupwise.harness.session import HarnessSession

OUTPUT_TAIL_CHARS = 2000


class SessionFailure(RuntimeError):
    """Why a session's harness failed (the message says what it did)."""


@dataclass(frozen=True)
class HarnessSpec:
    """``episode.harness`` (a function) or ``episode.harness_command`` (an argv), and how messages name it."""

    name: str
    function: Callable[[HarnessSession], Any] | None = None
    command: tuple[str, ...] = ()


class RunningHarness:
    """One session's harness, running since construction; ``on_done`` is called on its thread when it ends."""

    def __init__(
        self, spec: HarnessSpec, session: HarnessSession, timeout_s: float, on_done: Callable[[], None] | None = None
    ) -> None:
        self.spec, self.session, self.timeout_s = spec, session, timeout_s
        self.started = time.monotonic()
        self.deadline = self.started + timeout_s
        self._on_done = on_done
        self._done = threading.Event()
        self._outcome: float | None | SessionFailure = SessionFailure("it has not finished")
        self._process: subprocess.Popen[bytes] | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"groupwise-harness-{session.sample_index}", daemon=True)
        self._thread.start()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s)

    def outcome(self) -> float | None | SessionFailure:
        """The reward (None: score the last reply), or the failure; a harness still running past its deadline is
        stopped here first."""
        if not self.done:
            self.stop(f"it ran past episode.harness_timeout_s={self.timeout_s:g} s and was stopped")
        return self._outcome

    def stop(self, why: str) -> None:
        """End the harness now (a command's process group is killed; a function's thread is abandoned)."""
        if self.done:
            return
        self._stopped = True
        self._outcome = SessionFailure(why)
        self._kill()
        leave_running(self._thread)
        self._finish()

    def _run(self) -> None:
        try:
            value = self._call_command() if self.spec.command else self._call_function()
            outcome: float | None | SessionFailure = _checked(value)
        except SessionFailure as failure:
            outcome = failure
        except BaseException as exc:  # noqa: BLE001 — the user's harness: any raise fails its session, named
            outcome = SessionFailure(f"it raised {type(exc).__name__}: {exc}")
        if not self._stopped:
            self._outcome = outcome
            self._finish()

    def _finish(self) -> None:
        if self._done.is_set():
            return
        self._done.set()
        if self._on_done is not None:
            self._on_done()

    def _call_function(self) -> Any:
        assert self.spec.function is not None, "a function harness"
        value = self.spec.function(self.session)
        if inspect.isawaitable(value):
            return asyncio.run(_awaited(value))
        return value

    def _call_command(self) -> Any:
        with tempfile.TemporaryDirectory(prefix="groupwise-harness-") as folder:
            files = Path(folder)
            (files / "session.json").write_text(json.dumps(self.session.as_data()))
            reward_file = files / "reward"
            env = {
                **os.environ,
                "OPENAI_BASE_URL": self.session.base_url,
                "OPENAI_API_KEY": self.session.api_key,
                "OPENAI_MODEL": self.session.model,
                "GROUPWISE_SESSION": json.dumps(self.session.as_data()),
                "GROUPWISE_REWARD_FILE": str(reward_file),
            }
            with (
                open(files / "session.json", "rb") as stdin,
                open(files / "out", "wb") as out,
                open(files / "err", "wb") as err,
            ):
                try:
                    self._process = subprocess.Popen(
                        self.spec.command, stdin=stdin, stdout=out, stderr=err, env=env, start_new_session=True
                    )
                except OSError as exc:
                    raise SessionFailure(f"its command could not start: {exc}") from exc
                status = self._process.wait()
                self._kill()  # whatever it left running in its process group
            stdout, stderr = _tail(files / "out"), _tail(files / "err")
            if status != 0:
                raise SessionFailure(f"its command exited with status {status}; its last output: {stderr or stdout!r}")
            text = reward_file.read_text().strip() if reward_file.exists() else ""
            return _reward_text(text or (stdout.strip().splitlines() or [""])[-1])

    def _kill(self) -> None:
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):  # it is gone already
                os.killpg(self._process.pid, signal.SIGKILL)


async def _awaited(value: Any) -> Any:
    return await value


def _tail(path: Path) -> str:
    data = path.read_bytes()
    return data[-OUTPUT_TAIL_CHARS:].decode("utf-8", errors="replace")


def _reward_text(text: str) -> Any:
    """A command's reward as it wrote it: a number, ``null``/``None`` or nothing (score the last reply)."""
    if text.strip() in ("", "null", "None"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        raise SessionFailure(f"its reward {text[:80]!r} is not a number or null") from None
    return value.get("reward") if isinstance(value, dict) else value


def _checked(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SessionFailure(f"it returned {value!r:.80} of type {type(value).__name__}, not a number or None")
    reward = float(value)
    if not math.isfinite(reward) or abs(reward) > MAX_ABS_REWARD:
        raise SessionFailure(f"it returned {reward}, not a finite number within ±{MAX_ABS_REWARD:g}")
    return reward
