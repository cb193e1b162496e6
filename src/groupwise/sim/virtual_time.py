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

While a run goes, the cyclic garbage collector's young-generation threshold is raised (restored after): see
:data:`GC_YOUNG_THRESHOLD`.

Every run is bounded: a run still going after ``max_virtual_seconds`` is cancelled and
:class:`SimulationTimeout` names the bound (an event-less hang jumps straight to it, never blocking).
"""

from __future__ import annotations

import asyncio
import gc
import selectors
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import looptime

if TYPE_CHECKING:
    from _typeshed import FileDescriptorLike

T = TypeVar("T")


#: Allocations (net of frees) between young collections while a simulation runs; CPython's default is 700. A
#: simulated group allocates a dozen or so futures, handles and records that reference counting frees, but the
#: set of them alive swings by thousands as batches launch and finish, so the default threshold ran a young
#: collection every ~50 groups and a full one (every object alive: ~190k in the benchmark's process, most of
#: them made by imports) every ~5000 — a quarter to a third of the CPU of the million-group benchmark. At 10,000 a
#: 10^5-group run collects about a dozen times. The little cyclic garbage a run makes (exceptions of failed
#: attempts) waits a bit longer to be freed.
GC_YOUNG_THRESHOLD = 10_000


class SimulationTimeout(RuntimeError):
    """A simulated run did not finish within its virtual-time bound (``sim.max_virtual_seconds``)."""


class NoIOSelector(selectors.BaseSelector):
    """A selector that keeps registrations (the loop registers its self-pipe) and never reports an event."""

    def __init__(self) -> None:
        self._keys: dict[int, selectors.SelectorKey] = {}

    # Any: the caller's data on the key, as selectors.BaseSelector declares it.
    def register(self, fileobj: FileDescriptorLike, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = self._keys[fd] = selectors.SelectorKey(fileobj, fd, events, data)
        return key

    def unregister(self, fileobj: FileDescriptorLike) -> selectors.SelectorKey:
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
        loop._LoopTimeEventLoop__sync_futures = set()
    return loop


def run_in_virtual_time(main: Callable[[], Awaitable[T]], max_virtual_seconds: float) -> tuple[T, float]:
    """Run ``main()`` on a fresh virtual loop starting at 0; return (its result, the virtual time at its end)."""
    if not max_virtual_seconds > 0:
        raise ValueError(f"max_virtual_seconds must be > 0, got {max_virtual_seconds}")
    with _fewer_collections():
        return _run(main, max_virtual_seconds)


@contextmanager
def _fewer_collections() -> Iterator[None]:
    """Raise the young-generation threshold to :data:`GC_YOUNG_THRESHOLD` unless it is higher or off (0)."""
    thresholds = gc.get_threshold()
    if 0 < thresholds[0] < GC_YOUNG_THRESHOLD:
        gc.set_threshold(GC_YOUNG_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def _run(main: Callable[[], Awaitable[T]], max_virtual_seconds: float) -> tuple[T, float]:
    loop = new_virtual_loop()
    ended: list[float] = []

    async def bounded() -> T:
        try:
            result = await asyncio.wait_for(main(), max_virtual_seconds)
        except TimeoutError as exc:
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
