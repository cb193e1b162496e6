"""The wall-clock stall watchdog of real runs: nothing progresses for ``runtime.stall_timeout_s`` → stop, loudly.

The controller's structural stall checks catch every wait that no event can end. They cannot catch a call that
never returns — a wedged verifier, a hung engine, a Ray worker that neither answers nor dies. So a real run also
watches the clock:

* **async** (:func:`watch_progress`, embedded and Ray): a task polls a progress marker — optimizer steps, groups
  committed or filtered, fate records, generation calls returned — and when it has not changed for
  ``stall_timeout_s`` it writes the controller's state to ``events.log`` (trainer version, dispatch index, gate
  window, slots in flight, buffer length, ready/slots per start version, spare pool) and raises
  :class:`RunStalled`; the runtime then cancels the controller, whose shutdown records every unsettled attempt as
  ``pending``;
* **sync** (:mod:`groupwise.runtime.sync_run`): the same watch over optimizer steps and generation rounds
  returned; a round runs on a :class:`~groupwise.runtime.daemon_worker.DaemonWorker`, so the event loop stays free
  to notice that it does not return;
* **liveness** (:func:`watch_liveness`, the embedded streamed client): progress, not the clock. An answer the
  controller awaits from the generation stream (a rollout's completions, a cancelled rollout's cost) while the
  stream has nothing to do — no request queued or decoding, no cancel or weight load pending — can never come: the
  stream lost it. Seen at two polls :data:`IDLE_STALL_S` apart, it is a stall, reported within seconds with the
  same state line, however long ``stall_timeout_s`` is. Nothing legitimate leaves a wait outstanding on an idle
  stream for more than the moment between the serving thread's answer and the event loop taking it in, so the
  bound is fixed, not a setting: raising it could only hide a bug.

A stuck call keeps running on its daemon thread, which never keeps the process alive: the run exits with code 1
and the newest complete checkpoint stays the place to resume from.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Coroutine, Hashable
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")

# Seconds an awaited answer may stay outstanding on an idle generator before the run stops as stalled.
IDLE_STALL_S = 10.0


class RunStalled(RuntimeError):
    """Nothing progressed for ``runtime.stall_timeout_s`` seconds; the run stopped instead of waiting forever."""


def stall_message(timeout_s: float, what: str, state: str) -> str:
    return (
        f"nothing progressed for {timeout_s:g} s (runtime.stall_timeout_s): {what}. State: {state}. A call that "
        "never returns is the usual cause (a verifier stuck on some input: set reward.timeout_s; a hung engine or "
        "worker); if steps are legitimately this slow, raise runtime.stall_timeout_s"
    )


async def watch_progress(
    progress: Callable[[], Hashable],
    timeout_s: float,
    describe: Callable[[], str],
    log: Callable[[str], None],
    poll_s: float | None = None,
) -> NoReturn:
    """Raise :class:`RunStalled` once ``progress()`` has not changed for ``timeout_s`` seconds of wall time.

    ``describe()`` gives the state that goes into ``events.log`` (through ``log``) and into the error; the marker is
    read every ``poll_s`` seconds (a quarter of the timeout, at most 5 s, by default).
    """
    loop = asyncio.get_running_loop()
    poll = poll_s if poll_s is not None else min(timeout_s / 4, 5.0)
    marker, since = progress(), loop.time()
    while True:
        await asyncio.sleep(poll)
        now, current = loop.time(), progress()
        if current != marker:
            marker, since = current, now
        elif now - since >= timeout_s:
            state = describe()
            what = "no group was committed or filtered, no optimizer step ran and no generation call returned"
            log(f"stall watchdog: {what} for {timeout_s:g} s (runtime.stall_timeout_s); controller state: {state}")
            raise RunStalled(stall_message(timeout_s, what, state))


async def watch_liveness(
    idle_waits: Callable[[], Collection[Hashable]],
    bound_s: float,
    describe: Callable[[], str],
    log: Callable[[str], None],
    poll_s: float | None = None,
) -> NoReturn:
    """Raise :class:`RunStalled` once one of the answers ``idle_waits()`` names is still awaited, with the generator
    idle, ``bound_s`` seconds after it was first seen so.

    ``idle_waits()`` names the answers outstanding while the generator has nothing to do (empty while it works:
    then nothing is decided). A wait is forgotten once an idle poll no longer names it (it was answered).
    """
    loop = asyncio.get_running_loop()
    poll = poll_s if poll_s is not None else min(bound_s / 4, 1.0)
    first_seen: dict[Hashable, float] = {}
    while True:
        await asyncio.sleep(poll)
        waits, now = idle_waits(), loop.time()
        if not waits:
            continue
        first_seen = {wait: first_seen.get(wait, now) for wait in waits}
        if now - min(first_seen.values()) >= bound_s:
            state = describe()
            what = (f"{len(waits)} answer(s) awaited from the generator while it has had nothing to do (no request "
                    "queued or decoding, no token produced)")  # fmt: skip
            log(f"liveness watch: {what} for {bound_s:g} s; controller state: {state}")
            raise RunStalled(
                f"{what} for {bound_s:g} s: the generator lost a request or its answer, and the run would have "
                f"waited for runtime.stall_timeout_s. State: {state}. This is a bug in groupwise: please report it "
                "with events.log; --resume continues from the newest checkpoint"
            )


async def first_to_fail(*watchers: Coroutine[Any, Any, NoReturn]) -> NoReturn:
    """Run the watcher coroutines together; the first one's error ends them all and is raised."""
    tasks = [asyncio.ensure_future(watcher) for watcher in watchers]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        error = next(task for task in tasks if task in done).exception()
        assert error is not None, "a watcher only ever ends by raising"
        raise error
    finally:
        for task in tasks:
            task.cancel()


async def run_watched(
    main: Coroutine[Any, Any, T], watchdog: Coroutine[Any, Any, NoReturn], cancel_grace_s: float = 30.0
) -> T:
    """Await the coroutine ``main`` while the coroutine ``watchdog`` runs; if the watchdog raises first, cancel
    ``main`` (waiting at most ``cancel_grace_s`` for its shutdown) and re-raise the watchdog's error."""
    loop = asyncio.get_running_loop()
    main_task, watch_task = loop.create_task(main), loop.create_task(watchdog)
    try:
        await asyncio.wait({main_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
        if main_task.done():
            return main_task.result()
        main_task.cancel()
        await asyncio.wait({main_task}, timeout=cancel_grace_s)
        if main_task.done() and not main_task.cancelled() and main_task.exception() is not None:
            main_task.exception()  # retrieved: the watchdog's error is the one to report
        raise watch_task.exception()  # type: ignore[misc]
    finally:
        for task in (watch_task, main_task):
            if not task.done():
                task.cancel()
