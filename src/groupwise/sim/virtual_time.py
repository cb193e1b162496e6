"""Running a coroutine in virtual time with ``looptime``: the clock jumps to the next timer instead of waiting.

``looptime.new_event_loop(start=0, noop_cycles=0)`` is already in fast-forward mode (do not also enter
``looptime.enabled()`` inside it). ``noop_cycles=0``: by default looptime spins 42 empty loop iterations
before each clock jump to let I/O or threads catch up; a simulation has neither, and those iterations were
about three quarters of the CPU time of a simulated group (measured: 262 → 67 µs per group). Every run is
bounded: a run still going after ``max_virtual_seconds`` is cancelled and :class:`SimulationTimeout` names
the bound (an event-less hang jumps straight to it, so it never blocks the process).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import looptime

T = TypeVar("T")


class SimulationTimeout(RuntimeError):
    """A simulated run did not finish within its virtual-time bound (``sim.max_virtual_seconds``)."""


def run_in_virtual_time(main: Callable[[], Awaitable[T]], max_virtual_seconds: float) -> tuple[T, float]:
    """Run ``main()`` on a fresh looptime loop starting at 0; return (its result, the virtual time at its end)."""
    if not max_virtual_seconds > 0:
        raise ValueError(f"max_virtual_seconds must be > 0, got {max_virtual_seconds}")
    loop = looptime.new_event_loop(start=0, noop_cycles=0)
    ended: list[float] = []

    async def bounded() -> T:
        try:
            result = await asyncio.wait_for(main(), max_virtual_seconds)
        except asyncio.TimeoutError as exc:
            if loop.time() < max_virtual_seconds:  # a TimeoutError from inside the run, not the bound
                raise
            raise SimulationTimeout(
                f"the simulated run was still going after {max_virtual_seconds:g} virtual seconds "
                f"({max_virtual_seconds / 3600:.1f} h); it hangs or is far longer than intended. Shorten "
                "run.max_steps, or raise sim.max_virtual_seconds"
            ) from exc
        ended.append(loop.time())
        return result

    try:
        result = loop.run_until_complete(bounded())
    finally:
        loop.close()
    return result, ended[0]
