"""`VersionClock`: the trainer's weight version, with event-driven waits.

The version is the number of optimizer steps completed (resume-adjusted). Gated samplers wait on it
to admit the next prompt batch; waits are woken by :meth:`VersionClock.advance`, never by polling, so a
simulated run of a million groups in virtual time costs no timer wake-ups while nothing changes.

``on_park`` (set by the controller) is called whenever a wait parks, i.e. its predicate does not hold yet: a
parked rollout pump may be the last thing that moves, so the train pump must re-run its stall check then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

VersionPredicate = Callable[[int], bool]


class VersionClock:
    """The current trainer weight version and the coroutines waiting for it to satisfy a predicate."""

    def __init__(self, start: int = 0) -> None:
        if start < 0:
            raise ValueError(f"VersionClock start must be >= 0 (a resume step), got {start}")
        self._value = start
        self._waiters: list[tuple[VersionPredicate, asyncio.Future[int]]] = []
        self.on_park: Callable[[], None] | None = None

    @property
    def value(self) -> int:
        return self._value

    @property
    def waiting(self) -> int:
        """How many waits are still parked (their predicate has not yet held)."""
        return sum(1 for _, future in self._waiters if not future.done())

    def advance(self) -> int:
        """Bump the version by one (one optimizer step finished) and wake every satisfied waiter."""
        self._value += 1
        still_waiting = []
        for predicate, future in self._waiters:
            if future.done():
                continue
            if predicate(self._value):
                future.set_result(self._value)
            else:
                still_waiting.append((predicate, future))
        self._waiters = still_waiting
        return self._value

    def pending_wait(self, predicate: VersionPredicate) -> asyncio.Future[int]:
        """A future resolved with the version as soon as ``predicate(version)`` holds (maybe already)."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if predicate(self._value):
            future.set_result(self._value)
        else:
            self._waiters.append((predicate, future))
            if self.on_park is not None:
                self.on_park()
        return future

    async def wait_until(self, predicate: VersionPredicate) -> int:
        """Return the version once ``predicate(version)`` holds; returns at once if it already does."""
        future = self.pending_wait(predicate)
        try:
            return await future
        finally:
            if not future.done():
                future.cancel()
