"""`DaemonWorker`: one daemon thread that runs blocking calls (an engine call, a learner step) for the runtime.

``asyncio.to_thread`` and ``ThreadPoolExecutor`` threads are joined when the event loop closes and again when the
interpreter exits, so one call that never returns (a wedged verifier, a stuck device) would keep a run that has
already decided to stop — by the stall watchdog, say — alive forever. A daemon thread is never joined: the run can
stop, report and exit while the stuck call is still running. A worker runs its calls one at a time, in order, on
the same thread, so each role (generation, training, step end) keeps one warm OpenMP team as before.

:meth:`DaemonWorker.run` awaits a call from the event loop (cancelling the await abandons the call; it finishes
in the background and its result is dropped); :meth:`DaemonWorker.close` ends the thread when a run is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from groupwise.abandoned import leave_running

T = TypeVar("T")


class DaemonWorker:
    """Runs submitted calls in order on one daemon thread, started on first use (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        # Any: the queued jobs return different types; each job's own future is typed where it is submitted.
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:  # Any: fn's own arguments, passed through
        """Queue ``fn(*args)``; its result (or exception) arrives on the returned future."""
        future: Future[T] = Future()
        with self._lock:
            self._jobs.put((lambda: fn(*args), future))
            if self._thread is None:
                self._thread = threading.Thread(target=_serve, args=(self._jobs,), name=self.name, daemon=True)
                self._thread.start()
        return future

    async def run(self, fn: Callable[..., T], *args: Any) -> T:  # Any: fn's own arguments, passed through
        """``fn(*args)`` on the worker thread, awaited from the event loop."""
        return await asyncio.wrap_future(self.submit(fn, *args))

    def close(self, timeout_s: float) -> bool:
        """End the thread after its queued and running calls, waiting at most ``timeout_s``; True when it ended.

        Call it when a run ends: a daemon thread still running torch code at interpreter exit makes the process
        abort in native teardown, so a normal end waits for the call in progress (an engine batch, say), as joining
        an executor would. After a stall, pass 0: the stuck call is left to its thread. The next call starts a new
        thread."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return True
            self._jobs.put(None)
            self._jobs = queue.SimpleQueue()
        thread.join(timeout_s)
        if thread.is_alive():
            leave_running(thread)  # a stuck call: the process exits without waiting for it
            return False
        return True


# Any: the jobs' different result types (see DaemonWorker._jobs).
def _serve(jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None]) -> None:
    """A worker thread: run ``jobs`` in order until the ``None`` that :meth:`DaemonWorker.close` queues."""
    while True:
        item = jobs.get()
        if item is None:
            return
        job, future = item
        if not future.set_running_or_notify_cancel():
            continue
        try:
            result = job()
        except BaseException as error:  # noqa: BLE001 — handed to whoever waits on the future
            with contextlib.suppress(Exception):
                future.set_exception(error)
        else:
            with contextlib.suppress(Exception):
                future.set_result(result)
