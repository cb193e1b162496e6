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
  to notice that it does not return.

A stuck call keeps running on its daemon thread, which never keeps the process alive: the run exits with code 1
and the newest complete checkpoint stays the place to resume from.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Any, NoReturn


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


async def run_watched(main: Any, watchdog: Any, cancel_grace_s: float = 30.0) -> Any:
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
