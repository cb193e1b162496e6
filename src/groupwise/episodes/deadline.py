"""Environment calls off the generation thread, each with a deadline.

Every call runs on a daemon thread of its own, so the calls of many episodes run at once and a slow one delays
no other. A Python thread cannot be killed: a call past its deadline is abandoned (it keeps its thread until it
returns; its result is then dropped) and the caller gets :class:`StepTimeout`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from groupwise.abandoned import leave_running

T = TypeVar("T")


class StepTimeout(RuntimeError):
    """An environment call ran past ``episode.step_timeout_s`` and was abandoned."""


class PendingCall(Generic[T]):
    """``fn()`` running on its own daemon thread since construction; ``on_done()`` (optional) is called on that
    thread once it returned, so a caller can wait without blocking a thread of its own."""

    def __init__(self, fn: Callable[[], T], name: str, on_done: Callable[[], None] | None = None) -> None:
        self._on_done = on_done
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        self.started = time.perf_counter()
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], T]) -> None:
        try:
            self._value = fn()
        except BaseException as error:  # noqa: BLE001 — handed to the waiting caller
            self._error = error
        self.seconds = time.perf_counter() - self.started
        self._done.set()
        if self._on_done is not None:
            self._on_done()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout_s: float) -> T:
        """The call's value (or its exception) once it returns, waiting at most ``timeout_s`` from its start."""
        left = max(0.0, self.started + timeout_s - time.perf_counter())
        if not self._done.wait(left):
            leave_running(self._thread)
            self.seconds = timeout_s
            raise StepTimeout(f"it took longer than episode.step_timeout_s={timeout_s:g} s and was abandoned")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set by _run before _done


def call_with_deadline(fn: Callable[[], T], timeout_s: float, name: str) -> T:
    """``fn()`` on its own thread, at most ``timeout_s`` seconds (:class:`StepTimeout` past it)."""
    return PendingCall(fn, name).result(timeout_s)
