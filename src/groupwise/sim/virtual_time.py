"""Running a coroutine in virtual time with ``looptime``: the clock jumps to the next timer instead of waiting.

The loop is a plain ``asyncio.SelectorEventLoop`` patched by ``looptime.patch_event_loop(start=0,
noop_cycles=0)`` — already in fast-forward mode, so do not also enter ``looptime.enabled()`` inside it. A
simulation does no I/O and starts no threads, which allows three settings that together cut the loop's cost
per simulated group by about half (measured on the million-group benchmark, ``bench/controller.py``):

* ``noop_cycles=0`` — by default looptime spins 42 empty iterations before each clock jump so that I/O and
  threads can catch up; those iterations were three quarters of the CPU time of a simulated group;
* :class:`NoIOSelector` — the loop's selector never polls the OS (there is nothing to poll);
* the loop's set of executor futures, which looptime checks on every iteration, is a plain set rather than
  a weak set (it stays empty: nothing here uses executors), so the check costs a length test, not an
  iteration guard.

Every run is bounded: a run still going after ``max_virtual_seconds`` is cancelled and
:class:`SimulationTimeout` names the bound (an event-less hang jumps straight to it, never blocking).
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import looptime

T = TypeVar("T")


class SimulationTimeout(RuntimeError):
    """A simulated run did not finish within its virtual-time bound (``sim.max_virtual_seconds``)."""


class NoIOSelector(selectors.BaseSelector):
    """A selector that keeps registrations (the loop registers its self-pipe) and never reports an event."""

    def __init__(self) -> None:
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = self._keys[fd] = selectors.SelectorKey(fileobj, fd, events, data)
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(fileobj if isinstance(fileobj, int) else fileobj.fileno())

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


def new_virtual_loop() -> asyncio.AbstractEventLoop:
    """A fresh looptime loop at virtual time 0, tuned for simulations (see the module docstring)."""
    loop = looptime.patch_event_loop(asyncio.SelectorEventLoop(NoIOSelector()), start=0, noop_cycles=0)
    if hasattr(loop, "_LoopTimeEventLoop__sync_futures"):  # looptime internals; harmless to skip if renamed
        loop._LoopTimeEventLoop__sync_futures = set()  # type: ignore[attr-defined]
    return loop


def run_in_virtual_time(main: Callable[[], Awaitable[T]], max_virtual_seconds: float) -> tuple[T, float]:
    """Run ``main()`` on a fresh virtual loop starting at 0; return (its result, the virtual time at its end)."""
    if not max_virtual_seconds > 0:
        raise ValueError(f"max_virtual_seconds must be > 0, got {max_virtual_seconds}")
    loop = new_virtual_loop()
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
