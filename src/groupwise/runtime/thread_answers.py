"""Answers from another thread into an asyncio loop: how the runtime awaits a generation stream's callbacks.

A stream calls its callbacks on its serving thread (an environment step on a thread of its own); the coroutine
that waits holds no thread: the callback settles an asyncio future on the waiting loop, and does nothing once
that loop is closed (the run ended; nobody waits any more).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def settle(future: asyncio.Future[T], outcome: T | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def answer_from_thread(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future, unpack: bool = False
) -> Callable[..., None]:
    """A callback for the serving thread that settles ``future`` on ``loop`` (dropped once the loop is closed) with
    its one argument, or with the tuple of its arguments when ``unpack``."""

    def answer(*outcome: Any) -> None:  # Any: whatever the stream answers (the future's value or an error)
        with contextlib.suppress(RuntimeError):  # the run ended and its loop closed: nobody waits any more
            loop.call_soon_threadsafe(settle, future, outcome if unpack else outcome[0])

    return answer


def signal_from_thread(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> Callable[[], None]:
    """A callback for another thread that settles ``future`` with None on ``loop`` (dropped once it is closed)."""

    def signal() -> None:
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, future, None)

    return signal
