"""`WorkerPool`: the rollout pump's long-lived dispatch-slot workers.

Invariants pinned:
- a job submitted while a worker is idle runs on that worker (no new task), and starts in submission order;
- every job is reported settled exactly once, with the exception it raised (that worker then ends), also
  when it is cancelled before it ever ran;
- ``wait_idle`` returns once every submitted job settled;
- ``cancel_all`` cancels busy workers in submission order, then idle ones, and leaves no task running.
"""

from __future__ import annotations

import asyncio

import pytest
from fakes import run_virtual

from groupwise.controller.workers import WorkerPool


def _pool(log: list, settled: list) -> WorkerPool[tuple[str, float]]:
    async def job(item: tuple[str, float]) -> None:
        name, seconds = item
        log.append(("start", name, asyncio.current_task()))
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            log.append(("cancelled", name))
            raise
        if name.startswith("bad"):
            raise ValueError(name)
        log.append(("end", name))

    return WorkerPool(job, settled.append)


def test_idle_workers_are_reused_and_jobs_start_in_submission_order():
    log: list = []
    settled: list = []

    async def main():
        pool = _pool(log, settled)
        for i in range(3):
            pool.submit((f"a{i}", 1.0 + i))
        assert len(pool) == 3 and [name for name, _ in pool.items()] == ["a0", "a1", "a2"]
        await pool.wait_idle()
        assert len(pool) == 0
        for i in range(3):
            pool.submit((f"b{i}", 1.0))
        await pool.wait_idle()
        await pool.cancel_all()

    run_virtual(main)
    starts = [(name, task) for kind, name, *task in log if kind == "start" for task in task]
    assert [name for name, _ in starts] == ["a0", "a1", "a2", "b0", "b1", "b2"]
    assert {task for _, task in starts[3:]} == {task for _, task in starts[:3]}  # no new task for the b jobs
    assert settled == [None] * 6


def test_a_failed_job_is_reported_once_and_its_worker_ends():
    log: list = []
    settled: list = []

    async def main():
        pool = _pool(log, settled)
        pool.submit(("bad0", 1.0))
        pool.submit(("ok0", 2.0))
        await pool.wait_idle()
        pool.submit(("ok1", 1.0))  # the failed worker ended: only the other one is idle
        await pool.wait_idle()
        await pool.cancel_all()

    run_virtual(main)
    assert [type(e).__name__ if e else None for e in settled] == ["ValueError", None, None]
    tasks = {name: task for kind, name, *task in log if kind == "start" for task in task}
    assert tasks["ok1"] is tasks["ok0"] and tasks["bad0"].done()


def test_cancel_all_cancels_busy_workers_in_order_then_idle_ones():
    log: list = []
    settled: list = []

    async def main():
        pool = _pool(log, settled)
        pool.submit(("short", 1.0))
        await pool.wait_idle()
        for i in (2, 0, 1):  # busy2 goes to the idle worker, busy0 and busy1 start new ones
            pool.submit((f"busy{i}", 100.0 + i))
        pool.submit(("short2", 1.0))
        await asyncio.sleep(5.0)  # short2 ended: its worker is idle
        workers = [task for kind, _, *task in log if kind == "start" for task in task]
        await pool.cancel_all()
        assert len(pool) == 0
        return workers

    workers = run_virtual(main)
    assert all(task.done() for task in workers)
    assert [name for kind, name, *_ in log if kind == "end"] == ["short", "short2"]
    assert [name for kind, name, *_ in log if kind == "cancelled"] == ["busy2", "busy0", "busy1"]
    assert settled == [None] * 5


def test_cancel_all_before_new_workers_ran_leaves_nothing_behind():
    log: list = []
    settled: list = []

    async def main():
        pool = _pool(log, settled)
        for i in range(3):
            pool.submit((f"a{i}", 1.0))
        await pool.cancel_all()  # the workers' first steps never ran
        assert len(pool) == 0 and pool.items() == []

    run_virtual(main)
    assert log == [] and settled == [None] * 3  # settled once each, without running


def test_wait_idle_returns_at_once_when_nothing_is_submitted():
    async def main():
        pool: WorkerPool[int] = WorkerPool(lambda item: asyncio.sleep(item), lambda error: None)
        await asyncio.wait_for(pool.wait_idle(), 1.0)
        await pool.cancel_all()

    run_virtual(main)


def test_a_cancellation_while_handed_a_job_settles_it_without_running_it():
    ran: list = []
    settled: list = []

    async def job(item: int) -> None:
        ran.append(item)
        await asyncio.sleep(1.0)

    async def main():
        pool: WorkerPool[int] = WorkerPool(job, settled.append)
        pool.submit(1)
        await pool.wait_idle()
        pool.submit(2)  # the idle worker is handed job 2 ...
        await pool.cancel_all()  # ... and cancelled before it wakes
        assert len(pool) == 0

    run_virtual(main)
    assert ran == [1] and settled == [None, None]


@pytest.mark.parametrize("jobs", [1, 5])
def test_settled_reports_precede_wait_idle_return(jobs):
    events: list = []

    async def main():
        pool: WorkerPool[float] = WorkerPool(asyncio.sleep, lambda error: events.append("settled"))
        for i in range(jobs):
            pool.submit(float(i + 1))
        await pool.wait_idle()
        events.append("idle")
        await pool.cancel_all()

    run_virtual(main)
    assert events == ["settled"] * jobs + ["idle"]
