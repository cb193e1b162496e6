"""Answers from another thread into an asyncio loop: how the runtime awaits a generation stream's callbacks.

A stream calls its callbacks on its serving thread (an environment step on a thread of its own); the coroutine
that waits holds no thread: the callback settles an asyncio future on the waiting loop, and does nothing once
that loop is closed (the run ended; nobody waits any more). :func:`on_daemon_thread` runs a blocking call that
way (a user's environment being made and reset): unlike ``asyncio.to_thread``, whose threads the loop and the
interpreter join at exit, a call that never returns keeps no finished run from exiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
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


async def on_daemon_thread(fn: Callable[[], T], name: str) -> T:
    """``fn()`` on a daemon thread of its own, awaited without holding the loop; cancelling the await abandons the
    call (it ends on its thread, its result dropped), and nothing joins the thread at exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    answer = answer_from_thread(loop, future)

    def run() -> None:
        try:
            outcome: T | BaseException = fn()
        except BaseException as error:  # noqa: BLE001 — handed to the awaiting coroutine
            outcome = error
        answer(outcome)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await future
