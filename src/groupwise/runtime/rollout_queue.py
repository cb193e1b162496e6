"""Rollout requests waiting for a generator, and the one task that serves them (shared by the runtimes).

The controller awaits one group per dispatch slot; a runtime batches whatever is waiting into its next engine
call (embedded) or onto its next idle worker (Ray). The serving task starts on the first request, inside the
running event loop.

Generation cost (:mod:`groupwise.algo.waste`): when a call ends, :func:`charge_call` splits its wall time among
its requests pro rata by their completion tokens and records each request's cost on its group (or error). A
request cancelled by the controller (an abort) may be in a call that is still running: :meth:`RolloutQueue.spent`
waits for that call to end and returns what the request cost (nothing when it never reached a call).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from groupwise.algo.waste import split_call_seconds
from groupwise.types import NO_COST, GenerationCost, Group, LoaderItem, attach_cost, cost_of


@dataclass
class PendingRollout:
    """One requested group: what to generate and the future its requester awaits."""

    item: LoaderItem
    group_id: int
    attempt: int
    start_version: int  # the generator version the controller dispatched the attempt at (the group carries it)
    future: asyncio.Future
    prefixes: tuple = ()  # a resumed attempt's samples generated so far (continuous batching only)
    in_call: bool = False  # taken for a generator call (or to be dropped from one: then its cost is NO_COST)
    cost: GenerationCost | None = None  # known once that call ended
    _waiter: asyncio.Future | None = None

    def record_cost(self, cost: GenerationCost) -> None:
        self.cost = cost
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait_cost(self) -> GenerationCost:
        if self.cost is None:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        assert self.cost is not None
        return self.cost


class RolloutQueue:
    """``items`` waiting in arrival order; ``wake`` is set whenever there is something new for ``serve``."""

    def __init__(self, serve: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        self.items: list[PendingRollout] = []
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self._cancelled: dict[int, PendingRollout] = {}  # requests the controller cancelled, until spent()
        self._serve = serve
        self._name = name

    async def submit(
        self, item: LoaderItem, group_id: int, attempt: int, start_version: int, prefixes: tuple = ()
    ) -> Group:
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.done():
            self.task = loop.create_task(self._serve(), name=self._name)
        future = loop.create_future()
        pending = PendingRollout(item, group_id, attempt, start_version, future, prefixes)
        self.items.append(pending)
        self.wake.set()
        try:
            return await future
        except asyncio.CancelledError:
            self._cancelled[group_id] = pending
            raise

    def take(self, n: int) -> list[PendingRollout]:
        """The first ``n`` waiting requests, removed from the queue and marked as taken for a call."""
        batch = self.items[:n]
        del self.items[: len(batch)]
        for pending in batch:
            pending.in_call = True
        return batch

    async def spent(self, group_id: int) -> GenerationCost:
        """What the cancelled request of ``group_id`` cost: once the call it is in has ended, its share; nothing
        when it never reached a call."""
        pending = self._cancelled.pop(group_id, None)
        if pending is None or not pending.in_call:
            return NO_COST
        return await pending.wait_cost()


def drop_cancelled(batch: list[PendingRollout]) -> list[PendingRollout]:
    """The requests of ``batch`` still awaited; the cancelled ones leave the call, costing nothing."""
    kept = []
    for pending in batch:
        if pending.future.cancelled():
            pending.record_cost(NO_COST)
        else:
            kept.append(pending)
    return kept


def charge_call(batch: Sequence[PendingRollout], outcomes: Sequence[Group | BaseException] | BaseException,
                seconds: float) -> None:  # fmt: skip
    """Record what each request of a call cost: ``seconds`` split pro rata by completion tokens (a group's, or those a
    reward failure's error carries), on its group or error and on the request. ``outcomes`` is one error when the
    whole call failed: no tokens came back, and the seconds are split evenly."""
    if isinstance(outcomes, BaseException):
        share = seconds / max(1, len(batch))
        attach_cost(outcomes, GenerationCost(0, share))
        for pending in batch:
            pending.record_cost(GenerationCost(0, share))
        return
    tokens = [o.num_completion_tokens if isinstance(o, Group) else cost_of(o).tokens for o in outcomes]
    for pending, outcome, n, share in zip(batch, outcomes, tokens, split_call_seconds(seconds, tokens), strict=True):
        cost = GenerationCost(n, share)
        if isinstance(outcome, Group):
            outcome.gen_seconds = share
        else:
            attach_cost(outcome, cost)
        pending.record_cost(cost)


def charge_reported(batch: Sequence[PendingRollout], outcomes: Sequence[Group | BaseException] | BaseException) -> None:
    """Record what each request of a call cost as its generator reported it, on its group (tokens, ``gen_seconds``)
    or error (``cost_of``): a streamed generator times each request itself. A call that failed as a whole reported
    nothing: its requests cost nothing recorded."""
    if isinstance(outcomes, BaseException):
        charge_call(batch, outcomes, 0.0)
        return
    for pending, outcome in zip(batch, outcomes, strict=True):
        pending.record_cost(outcome.cost if isinstance(outcome, Group) else cost_of(outcome))


def resolve_all(batch: Sequence[PendingRollout], groups: Sequence[Group]) -> None:
    """Hand each waiting requester its group (``groups`` in ``batch`` order); a cancelled requester is skipped."""
    for pending, group in zip(batch, groups, strict=True):
        if not pending.future.done():
            pending.future.set_result(group)


def fail_all(batch: Sequence[PendingRollout], error: BaseException) -> None:
    """Every waiting requester of ``batch`` gets ``error`` (one failed generator call fails its whole batch)."""
    for pending in batch:
        if not pending.future.done():
            pending.future.set_exception(error)


def settle_outcomes(batch: Sequence[PendingRollout], outcomes: Sequence[Group | BaseException]) -> int:
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
