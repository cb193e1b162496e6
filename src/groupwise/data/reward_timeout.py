"""``reward.timeout_s``: a reward function call that takes too long fails instead of stalling the run.

A reward function runs in-process, so a deadline needs a second thread or a second process. A process could be
killed, but every call would pickle the prompt, the completion and the function (closures and lambdas do not
pickle) and pay a process round trip per completion. So the call runs on a helper thread and the caller waits at
most ``timeout_s``: past it, :class:`RewardTimeout` is raised (:func:`~groupwise.data.scoring.score_completions`
turns it into a ``RewardError`` naming the function, the prompt and the completion: a data failure of that prompt
in async mode, a stop in sync mode).

A Python thread cannot be killed. The stuck call keeps running on its (daemon) helper thread until it returns; its
result is then discarded and the thread ends. Later calls get a fresh helper thread, so one stuck call never
delays another; :attr:`TimedReward.abandoned` counts the calls given up on. A daemon thread does
not keep the process alive at exit. A verifier that hangs on every call leaks one thread per failed attempt, until
the run's failure budget (``async.rollout_failure.max_skipped_prompts``) stops the run.

Reward code runs on the helper thread, not the caller's: a verifier that relies on ``signal.alarm`` (which works
only on the main thread) must not (the built-in ``math_verify`` turns its own signal-based timeouts off there).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from groupwise.abandoned import leave_running


class RewardTimeout(RuntimeError):
    """A reward call ran past ``reward.timeout_s``. Not a ``TimeoutError``: that one is classified as an
    infrastructure failure, and a verifier that is too slow on some completion is a property of the data."""


class _Call:
    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: Any = None  # Any: what the user's reward function returned (scoring checks it is a number)
        self.error: BaseException | None = None


class _Helper:
    """One daemon thread running submitted calls in order; once abandoned it ends after its current call."""

    def __init__(self, name: str) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], _Call] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def submit(self, job: Callable[[], Any]) -> _Call:
        call = _Call()
        self.jobs.put((job, call))
        return call

    def abandon(self) -> None:
        self.jobs.put(None)  # served after the stuck call returns: the thread then ends
        leave_running(self.thread)  # until then the process must not wait for it at exit

    def _serve(self) -> None:
        while (item := self.jobs.get()) is not None:
            job, call = item
            try:
                call.result = job()
            except BaseException as error:  # noqa: BLE001 — handed to the waiting caller
                call.error = error
            call.done.set()


class TimedReward:
    """``fn`` called on a helper thread, at most ``timeout_s`` seconds per call (see the module docstring)."""

    def __init__(self, fn: Callable[..., Any], timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError(f"reward.timeout_s must be > 0, got {timeout_s}")
        self.fn = fn
        self.timeout_s = timeout_s
        self.__name__ = getattr(fn, "__name__", repr(fn))  # what RewardError messages name
        self.abandoned = 0
        self._helper: _Helper | None = None
        self._lock = threading.Lock()  # one call at a time, whichever thread scores

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # Any: passed through to and from the user's function
        with self._lock:
            if self._helper is None:
                self._helper = _Helper(f"groupwise-reward-{self.__name__}")
            helper = self._helper
            call = helper.submit(lambda: self.fn(*args, **kwargs))
            if not call.done.wait(self.timeout_s):
                helper.abandon()
                self._helper = None
                self.abandoned += 1
                raise RewardTimeout(
                    f"the call took longer than reward.timeout_s={self.timeout_s:g} s and was abandoned (it keeps "
                    f"its thread until it returns; {self.abandoned} call(s) abandoned so far)"
                )
        if call.error is not None:
            raise call.error
        return call.result


def with_timeout(fn: Callable[..., Any], timeout_s: float | None) -> Callable[..., Any]:
    """``fn`` bounded by ``reward.timeout_s`` (unchanged, called inline, when it is None)."""
    return fn if timeout_s is None else TimedReward(fn, timeout_s)
