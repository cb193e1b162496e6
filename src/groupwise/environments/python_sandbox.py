"""``python_sandbox``: the model may run Python programs with the ``python`` tool. Reward 1 when the final reply's
last number is the answer.

Each call runs one program in the sandbox (:mod:`groupwise.sandbox.process`: a separate process with wall, CPU,
memory, output, disk and process limits, no network and no view of the run's files where the OS allows it; what is
isolated where is in docs/environments.md). The model reads what the program printed: its stdout, then its stderr,
cut to ``max_answer_chars``. A program that raised, exited with an error or was stopped at a limit is the call's own
failure: the model reads ``error: the program raised …`` with the same output (a :class:`ToolError`, counted in
``episode/tool_errors``). A sandbox that cannot run anything (:class:`SandboxUnavailable`) is not the model's to
read: the episode fails, and is retried with a fresh environment under ``episode.retry_failed_episodes``.

``python`` itself is a plain typed function (the default limits), for any :class:`ToolEnvironment` to offer.
"""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable, Sequence
from typing import Any

from groupwise.data.rewards import final_number
from groupwise.episodes.tool_env import ToolEnvironment
from groupwise.episodes.tools import ERROR_PREFIX, ToolError
from groupwise.sandbox.process import MB, Isolation, Sandbox, SandboxLimits, SandboxRun
from groupwise.types import Completion, Prompt

ISOLATIONS = ("required", "preferred", "off")
DEFAULT_ANSWER_CHARS = 2000


def python(code: str) -> str:
    """Run a Python program and return what it printed.

    Each call runs a new program in an empty folder, with no network and a few seconds of time: print what you
    want to see.

    Args:
        code: The program's Python source code.
    """
    sandbox = _default_sandbox()
    return sandbox_answer(sandbox.run(code), sandbox.limits, DEFAULT_ANSWER_CHARS)


@functools.cache
def _default_sandbox() -> Sandbox:
    return Sandbox(SandboxLimits())


def python_tool(sandbox: Sandbox, max_chars: int) -> Callable[[str], str]:
    """:func:`python` running its programs in ``sandbox``, its answers cut to ``max_chars``."""

    @functools.wraps(python)
    def run(code: str) -> str:
        return sandbox_answer(sandbox.run(code, read_chars=max_chars), sandbox.limits, max_chars)

    return run


def sandbox_answer(run: SandboxRun, limits: SandboxLimits, max_chars: int) -> str:
    """What the model reads of ``run``: its stdout (the first characters) and stderr (the last), together at most
    ``max_chars``; ``(no output)`` for a program that printed nothing. A program that failed raises
    :class:`ToolError` with a line saying how (an exception, an exit status, a limit), then the same output: the
    model reads ``error: `` and that, in ``max_chars`` too."""
    failure = _failure(run, limits)
    output = _output(run, max_chars - (len(ERROR_PREFIX) + len(failure) + 1 if failure else 0))
    if failure is None:
        return output or "(no output)"
    raise ToolError(f"{failure}\n{output}" if output else failure)


def _failure(run: SandboxRun, limits: SandboxLimits) -> str | None:
    if run.timed_out:
        return f"the program ran past its time limit of {limits.wall_s:g} s and was killed"
    if run.exit_code is not None and run.exit_code < 0:
        number = -run.exit_code
        name = signal.Signals(number).name if number in signal.valid_signals() else f"signal {number}"
        if name in ("SIGXCPU", "SIGKILL") and run.cpu_s is not None and run.cpu_s >= limits.cpu_s:
            return f"the program used its {limits.cpu_s} s of CPU time and was killed"
        return f"the program was killed by {name}"
    if run.exception is not None:
        return f"the program raised {run.exception}"
    if run.exit_code:
        return f"the program exited with status {run.exit_code}"
    return None


def _output(run: SandboxRun, room: int) -> str:
    """The stdout's head and the stderr's tail in ``room`` characters: half each, and what one does not need goes
    to the other; a stream that is cut says how many bytes it had."""
    label = "stderr:\n"
    budget = max(0, room - (len(label) + 1 if run.stderr else 0))
    wanted = [
        _wanted(run.stdout, run.stdout_bytes, run.read_bytes),
        _wanted(run.stderr, run.stderr_bytes, run.read_bytes),
    ]
    first = min(wanted[0], max(budget // 2, budget - wanted[1]))
    out = _cut(run.stdout, run.stdout_bytes, run.read_bytes, first, keep_end=False)
    if not run.stderr:
        return out
    err = label + _cut(run.stderr, run.stderr_bytes, run.read_bytes, budget - first, keep_end=True)
    return out + err if not out or out.endswith("\n") else f"{out}\n{err}"


def _mark(total_bytes: int) -> str:
    return f"…[{total_bytes} bytes in all]"


def _wanted(text: str, total_bytes: int, read_bytes: int) -> int:
    return len(text) + (len(_mark(total_bytes)) if total_bytes > read_bytes else 0)


def _cut(text: str, total_bytes: int, read_bytes: int, share: int, keep_end: bool) -> str:
    if len(text) <= share and total_bytes <= read_bytes:
        return text
    mark = _mark(total_bytes)
    if share <= len(mark):
        return ""
    kept = share - len(mark)
    return mark + text[-kept:] if keep_end else text[:kept] + mark


class PythonSandboxEnvironment(ToolEnvironment):
    """The model may call ``python``; its reply without a tool call is its answer. The limits are keyword arguments
    (``episode.kwargs``): ``wall_s``, ``cpu_s``, ``memory_mb`` (each process's address space), ``max_processes``,
    ``max_output_bytes`` (each file the program writes, stdout and stderr included), ``disk_mb`` (its writable
    folders, isolated only); ``isolation`` is ``required`` (default: no run without the namespaces), ``preferred``
    or ``off`` (limits only); ``python`` the interpreter (default: the run's, see :func:`sandbox_python`)."""

    system_prompt = "You can run Python programs with the python tool. Give the final answer as a number."

    def __init__(
        self,
        system_prompt: str | None = None,
        wall_s: float = 10.0,
        cpu_s: int = 5,
        memory_mb: int = 512,
        max_processes: int = 8,
        max_output_bytes: int = 1_000_000,
        disk_mb: int = 32,
        isolation: Isolation = "required",
        python: str | None = None,
        max_answer_chars: int = DEFAULT_ANSWER_CHARS,
    ) -> None:
        super().__init__()
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
        if system_prompt is not None:
            self.system_prompt = system_prompt
        limits = SandboxLimits(wall_s, cpu_s, memory_mb * MB, max_processes, max_output_bytes, disk_mb * MB)
        self.sandbox = Sandbox(limits, isolation, python)
        self.tool_timeout_s = wall_s + 5.0  # the sandbox kills its program at wall_s: the call answers before this
        self.max_answer_chars = max_answer_chars
        self._python = python_tool(self.sandbox, max_answer_chars)

    @property
    def tools(self) -> Sequence[Callable[..., Any]]:
        return (self._python,)

    def score(self, prompt: Prompt, final_reply: str) -> float:
        reply = Completion(token_ids=(), logprobs=(), text=final_reply, finish_reason="stop", weight_version=0)
        return final_number(prompt, reply)
