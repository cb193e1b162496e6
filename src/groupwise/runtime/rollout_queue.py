"""Rollout requests waiting for a generator, and the one task that serves them (shared by the runtimes).

The controller awaits one group per dispatch slot; a runtime batches whatever is waiting into its next engine
call (embedded) or onto its next idle worker (Ray). The serving task starts on the first request, inside the
running event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from groupwise.types import Group


@dataclass
class PendingRollout:
    """One requested group: what to generate and the future its requester awaits."""

    item: Any
    group_id: int
    attempt: int
    future: asyncio.Future


class RolloutQueue:
    """``items`` waiting in arrival order; ``wake`` is set whenever there is something new for ``serve``."""

    def __init__(self, serve: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        self.items: list[PendingRollout] = []
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self._serve = serve
        self._name = name

    async def submit(self, item: Any, group_id: int, attempt: int) -> Group:
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.done():
            self.task = loop.create_task(self._serve(), name=self._name)
        future = loop.create_future()
        self.items.append(PendingRollout(item, group_id, attempt, future))
        self.wake.set()
        return await future

    def take(self, n: int) -> list[PendingRollout]:
        """The first ``n`` waiting requests, removed from the queue."""
        batch = self.items[:n]
        del self.items[: len(batch)]
        return batch


def resolve_all(batch: list[PendingRollout], groups: list[Group]) -> None:
    """Hand each waiting requester its group (``groups`` in ``batch`` order); a cancelled requester is skipped."""
    for pending, group in zip(batch, groups, strict=True):
        if not pending.future.done():
            pending.future.set_result(group)


def fail_all(batch: list[PendingRollout], error: BaseException) -> None:
    """Every waiting requester of ``batch`` gets ``error`` (one failed generator call fails its whole batch)."""
    for pending in batch:
        if not pending.future.done():
            pending.future.set_exception(error)


def settle_outcomes(batch: list[PendingRollout], outcomes: list[Group | BaseException]) -> int:
    """Hand each requester its own outcome: its group, or the error that failed only it (a reward failure of that
    prompt's completions; a cancelled requester is skipped). Returns the completion tokens generated."""
    tokens = 0
    for pending, outcome in zip(batch, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            if not pending.future.done():
                pending.future.set_exception(outcome)
            continue
        tokens += outcome.num_completion_tokens
        if not pending.future.done():
            pending.future.set_result(outcome)
    return tokens
