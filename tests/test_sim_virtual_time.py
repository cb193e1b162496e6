"""The simulator's virtual-time loop (looptime, tuned for simulations in ``groupwise.sim.virtual_time``).

Invariants pinned:
- the tuning (a selector that never polls the OS, a plain set for looptime's executor futures) keeps looptime's
  virtual times exactly: the same callbacks run at the same loop times in the same order as on a plain looptime
  loop, for float delays that are not multiples of the 1 µs tick, delays under one tick, and timers due together;
- a run raises the garbage collector's young-generation threshold and restores it after, even on an error.
"""

from __future__ import annotations

import asyncio
import gc
import random

import looptime
import pytest

from groupwise.sim.virtual_time import GC_YOUNG_THRESHOLD, new_virtual_loop, run_in_virtual_time


async def _timeline(seed: int) -> list[tuple[float, str]]:
    """Workers sleeping random (often sub-tick or coinciding) delays; returns (loop time, event) in run order."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    log: list[tuple[float, str]] = []

    async def worker(name: str) -> None:
        for step in range(60):
            delay = rng.choice([rng.random() * 3, rng.random() * 1e-6, 4e-7, 1e-10, 0.5, 1 / 3, 0.0])
            await asyncio.sleep(delay)
            log.append((loop.time(), f"{name}.{step}"))

    def timer(name: str) -> None:
        log.append((loop.time(), name))

    for i in range(20):
        loop.call_at(rng.random() * 50, timer, f"timer{i}")
    await asyncio.gather(*(worker(f"w{i}") for i in range(8)))
    return log


def _on_looptime(seed: int) -> list[tuple[float, str]]:
    loop = looptime.patch_event_loop(asyncio.SelectorEventLoop(), start=0, noop_cycles=0)
    try:
        return loop.run_until_complete(_timeline(seed))
    finally:
        loop.close()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_virtual_times_and_order_are_looptimes(seed):
    loop = new_virtual_loop()
    try:
        ours = loop.run_until_complete(_timeline(seed))
    finally:
        loop.close()
    assert ours == _on_looptime(seed)


def test_a_run_raises_the_young_collection_threshold_and_restores_it():
    before = gc.get_threshold()
    seen: list[tuple[int, int, int]] = []

    async def main() -> None:
        seen.append(gc.get_threshold())
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        run_in_virtual_time(main, 10.0)
    assert gc.get_threshold() == before
    assert seen[0][0] == max(before[0], GC_YOUNG_THRESHOLD) and seen[0][1:] == before[1:]
