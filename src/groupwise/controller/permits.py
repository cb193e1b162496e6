"""`Permits`: a counting semaphore that can tell whether anyone is parked on it.

Used for the buffer-capacity valve (``max_buffered_rollouts``) and the in-flight limit
(``max_inflight_prompts``). Unlike ``asyncio.Semaphore`` a waiter counts as parked exactly until a permit is
handed to it (synchronously, in :meth:`release`), so the stall detector never mistakes a woken waiter for a
stuck one. ``on_park`` (set by the controller) is called whenever an acquire has to wait, so the train pump
re-runs its stall check.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable


class Permits:
    """``total`` permits handed out FIFO."""

    def __init__(self, total: int, name: str) -> None:
        if total < 1:
            raise ValueError(f"{name} must be >= 1, got {total}")
        self.total = total
        self.name = name
        self.in_use = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.on_park: Callable[[], None] | None = None

    @property
    def waiting(self) -> int:
        """Waiters not yet handed a permit."""
        return sum(1 for future in self._waiters if not future.done())

    async def acquire(self) -> None:
        if self.in_use < self.total and not self.waiting:
            self.in_use += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        if self.on_park is not None:
            self.on_park()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # handed a permit just as we were cancelled: give it back
            raise

    def take_now(self, count: int) -> None:
        """Claim permits without waiting (groups restored from a checkpoint already hold capacity)."""
        self.in_use += count

    def release(self, count: int = 1) -> None:
        if count > self.in_use:
            raise AssertionError(f"{self.name}: releasing {count} permits but only {self.in_use} are held")
        self.in_use -= count
        while self._waiters and self.in_use < self.total:
            future = self._waiters.popleft()
            if not future.done():
                self.in_use += 1
                future.set_result(None)
