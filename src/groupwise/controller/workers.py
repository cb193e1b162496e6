"""`WorkerPool`: long-lived tasks that run jobs one at a time, instead of one task per job.

The rollout pump runs each dispatch slot as a job. A task per slot cost, per prompt, a task object, its first
step and a done callback in a loop iteration of its own (the pool saved 13 % of the CPU of the simulated
million-group benchmark, ``bench/controller.py``). A worker that settles its job reports it inline and then
waits for the next one on a plain future; a job submitted while no worker is idle starts a new worker, so the
pool never holds more workers than jobs ever ran at once (the rollout pump's in-flight permits bound that).

Ordering is that of a task per job: a job submitted to an idle worker wakes it with one ``call_soon`` at the
moment of submission, as creating its task would have. A settled job's report comes in the same step as its
last statement, one iteration earlier than a done callback would run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class WorkerPool(Generic[T]):
    """Runs ``job(item)`` for each submitted item on a reusable worker task.

    ``on_settled(error)`` is called once per job as it ends: ``error`` is the exception it raised (the worker
    then ends), or None when it returned or was cancelled (a cancelled worker ends too).
    """

    def __init__(self, job: Callable[[T], Awaitable[None]], on_settled: Callable[[BaseException | None], None]) -> None:
        self._job = job
        self._on_settled = on_settled
        self._busy: dict[asyncio.Task[None], T] = {}  # submission order: shutdown cancels reproducibly
        self._idle: list[tuple[asyncio.Task[None], asyncio.Future[T]]] = []
        self._drained: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        """Jobs submitted and not yet settled."""
        return len(self._busy)

    def items(self) -> list[T]:
        """The unsettled jobs' items, in submission order."""
        return list(self._busy.values())

    def submit(self, item: T) -> None:
        if self._idle:
            task, handoff = self._idle.pop()
            handoff.set_result(item)
        else:
            task = asyncio.get_running_loop().create_task(self._work(item))
        self._busy[task] = item

    async def wait_idle(self) -> None:
        """Return once no job is unsettled."""
        while self._busy:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    async def cancel_all(self) -> None:
        """Cancel every worker (busy ones first, in submission order) and wait for them to end."""
        tasks = list(self._busy) + [task for task, _ in self._idle]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._idle.clear()
        for task in list(self._busy):  # a new worker cancelled before its first step never ran its job
            self._settle(task, None)

    async def _work(self, item: T) -> None:
        me = asyncio.current_task()
        assert me is not None, "a worker runs in its own task"
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self._job(item)
            except asyncio.CancelledError:
                self._settle(me, None)
                raise
            except Exception as error:  # reported through on_settled; this worker ends with its job
                self._settle(me, error)
                return
            self._settle(me, None)
            handoff: asyncio.Future[T] = loop.create_future()
            self._idle.append((me, handoff))
            try:
                item = await handoff
            except asyncio.CancelledError:
                if (me, handoff) in self._idle:
                    self._idle.remove((me, handoff))
                elif me in self._busy:  # handed a job just as it was cancelled: the job never started
                    self._settle(me, None)
                raise

    def _settle(self, me: asyncio.Task[None], error: BaseException | None) -> None:
        del self._busy[me]
        self._on_settled(error)
        if not self._busy and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
