"""One dispatch slot: a prompt's attempts until its group is buffered, or it is replaced, or its loss is charged.

Each attempt reserves a fresh buffer slot at the generator's current version, runs ``rollouts.rollout``, then
either commits the group, or — filtered by dynamic sampling or given up after its failure budget — takes a spare
(per-slot ``max_replacement_attempts``; an ``in_order`` slot first promotes a later step's ready group into its own
step and re-aims itself at the lender) or charges the loss through the sampler's drop accounting. Filtered groups
never consume failure budgets and reset the consecutive-drop streak. Every reserved slot gets exactly one fate
record, carrying the attempt's generation cost (:mod:`groupwise.algo.waste`): a group's, a failed attempt's
(``groupwise.types.cost_of`` its error), or an aborted one's, asked of the rollout client's optional
``spent(group_id)`` once its generator has stopped working on it. Each cost is also counted as generated when it
comes back (``ctx.fates.generation``).

A slot's :class:`SlotState` always names the prompt it works on, its stamp, its attempt number and budgets, so a
checkpoint can re-dispatch it under the same stamp after a resume. A slot restored with ``progress`` (what the
rollout client had generated of its running attempt) continues that attempt — same group id, same start version —
by handing the progress back to the client (``rollout(..., resume=progress)``) instead of starting a new one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from groupwise.controller.context import PumpContext
from groupwise.controller.failures import PromptAttempts
from groupwise.controller.fate_records import Fate, FateRecord
from groupwise.controller.interfaces import CancelledCost, LoaderItem, ResumableRollouts, RolloutClient
from groupwise.controller.permits import Permits
from groupwise.types import NO_COST, GenerationCost, Group, cost_of


@dataclass
class _Attempt:
    """One attempt in flight. Its fate record is built only when the attempt does not commit (a committed
    group's record is written by the train pump): this runs once per group, so it allocates nothing it can skip."""

    task: asyncio.Task[None]  # the worker task running the dispatch slot, and so the attempt
    start_version: int
    group_id: int
    item: LoaderItem
    number: int  # the slot's attempt counter when this attempt started
    aborted: bool = False

    def record(self, fate: Fate = "pending", detail: str = "", cost: GenerationCost = NO_COST) -> FateRecord:
        uid, epoch = self.item.prompt.uid, self.item.epoch
        return FateRecord(self.group_id, uid, self.number, self.start_version, fate, detail=detail, epoch=epoch,
                          tokens=cost.tokens, gen_seconds=cost.seconds)  # fmt: skip


@dataclass
class SlotState:
    """One unsettled dispatch slot: what it works on now, and what a resumed run needs to re-dispatch it."""

    item: LoaderItem
    target: int | None = None
    attempt: int = 0  # the number of the attempt running now, or of the next one after a failure
    attempts: PromptAttempts = field(default_factory=PromptAttempts)
    replacements_used: int = 0
    group_id: int | None = None  # the buffer slot of the attempt running now (None between attempts)
    start_version: int | None = None  # the generator version that attempt started under
    # Restored from a checkpoint: the rollout client's record of that attempt so far.
    progress: dict[str, Any] | None = None


@dataclass
class _Lost:
    """An attempt that did not commit; its fate is recorded once the slot decides what happens next."""

    record: FateRecord
    aborted: bool = False



class DispatchSlots:
    """Runs dispatch slots (see the module docstring); the rollout pump submits them to its worker pool."""

    def __init__(
        self, ctx: PumpContext, rollouts: RolloutClient, inflight: Permits, refill: Callable[[], None] = lambda: None
    ) -> None:
        self.ctx = ctx
        self.rollouts = rollouts
        self.inflight = inflight
        self.refill = refill  # tops the spare pool up from the loader (the rollout pump's; it may be at the gate)
        self.groups_finished = 0  # committed or filtered: progress for a stall watchdog
        self._attempts: dict[int, _Attempt] = {}

    def abort_stale(self, version: int) -> int:
        """Cancel in-flight attempts the sampler says can no longer be selected at ``version``."""
        count = 0
        for attempt in self._attempts.values():
            if not attempt.aborted and self.ctx.sampler.should_abort_inflight(attempt.start_version, version):
                attempt.aborted = True
                attempt.task.cancel()
                count += 1
        return count

    async def run(self, slot: SlotState) -> None:
        """The worker pool's job: one slot from its first attempt until it settles."""
        ctx = self.ctx
        try:
            await self._dispatch_slot(slot)
        except asyncio.CancelledError:
            ctx.capacity.release()  # an unsettled slot still holds its capacity permit
            raise
        finally:
            self.inflight.release()

    async def _dispatch_slot(self, slot: SlotState) -> None:
        ctx = self.ctx
        while True:
            lost = await self._run_prompt(slot)
            if lost is None:
                if slot.replacements_used:
                    ctx.ledger.record_replaced(slot.target if slot.target is not None else ctx.ledger.assembling)
                return
            spare = None if lost.aborted else self._take_replacement(slot.replacements_used)
            if spare is None:
                ctx.capacity.release()
                self._charge(lost.record, slot.target)
                return
            ctx.record_fate(_resolved(lost.record, "replaced", None))
            # From here the slot works on the spare: a snapshot must save the spare, never the settled prompt.
            slot.item, slot.attempt, slot.attempts = spare, 0, PromptAttempts()
            slot.replacements_used += 1
            if slot.target is not None and not ctx.ledger.is_closed(slot.target):
                lender = ctx.buffer.promote_ready_group(slot.target)
                if lender is not None:
                    ctx.ledger.record_promoted(slot.target)
                    slot.target = lender
                    ctx.signal()
            await ctx.rollout_permitted.wait()

    def _take_replacement(self, used: int) -> LoaderItem | None:
        if not self.ctx.replacement_enabled or used >= self.ctx.settings.failure.max_replacement_attempts:
            return None
        if not len(self.ctx.spare_pool):
            self.refill()  # an empty pool while the loader has data must not charge a loss
        return self.ctx.spare_pool.take()

    def _charge(self, record: FateRecord, target: int | None) -> None:
        try:
            step = self.ctx.charge_loss(target)
        except BaseException as fatal:
            self.ctx.record_fate(_resolved(record, "fatal", None))
            where = self._where(record.prompt_uid, record.group_id, record.attempt, target)
            fatal.add_note(f"charging the loss of {where}")
            raise
        self.ctx.record_fate(_resolved(record, "charged" if step is not None else "uncharged", step))

    def _where(self, uid: str, group_id: int | None, attempt: int, target: int | None) -> str:
        """Names the prompt, its attempt and the steps involved, for the notes of an error that stops the run."""
        return (
            f"prompt {uid!r} (group {group_id}, attempt {attempt}, target step {target}) while step "
            f"{self.ctx.ledger.assembling} was being assembled"
        )

    async def _run_prompt(self, slot: SlotState) -> _Lost | None:
        """Attempt the slot's prompt until it commits (None) or is lost (filtered, given up, aborted)."""
        ctx = self.ctx
        item, target = slot.item, slot.target
        while True:
            resume, slot.progress = slot.progress, None
            if resume is not None and slot.group_id is not None and slot.start_version is not None:
                slot_id, start = slot.group_id, slot.start_version  # reserved at restore: the attempt goes on
            else:
                resume, start = None, ctx.generator_version
                slot_id = ctx.buffer.reserve(start, target, payload=item)
                slot.group_id, slot.start_version = slot_id, start
            # The rollout runs in the slot's worker task, not in a task of its own (a task per attempt would be most
            # of the controller's cost per group); an abort cancels that task, and uncancel() tells an abort from a
            # shutdown.
            current = asyncio.current_task()
            assert current is not None, "a dispatch slot runs in a worker task"
            self._attempts[slot_id] = attempt = _Attempt(current, start, slot_id, item, slot.attempt)
            try:
                if resume is None:
                    group = await self.rollouts.rollout(item, slot_id, slot.attempt, start)
                else:  # only a resumable client's snapshot holds progress (restore checks it)
                    assert isinstance(self.rollouts, ResumableRollouts)
                    group = await self.rollouts.resume(item, slot_id, slot.attempt, start, resume)
            except asyncio.CancelledError:
                del self._attempts[slot_id]
                ctx.buffer.remove(slot_id)
                slot.group_id = None
                if attempt.aborted and current.uncancel() == 0:  # only the abort asked: the slot lives on
                    detail = f"stale at trainer version {ctx.clock.value}"
                    return _Lost(attempt.record("aborted", detail, await self._spent(attempt)), True)
                ctx.record_fate(attempt.record())
                raise
            except Exception as error:  # classified below; cancellation is handled above
                del self._attempts[slot_id]
                ctx.buffer.remove(slot_id)
                slot.group_id = None
                cost = cost_of(error)
                ctx.fates.generation.generated(cost.tokens, cost.seconds)
                delay = self._on_failure(slot.attempts, error, attempt, target, cost)
                if delay is None:
                    return _Lost(attempt.record("failed", repr(error), cost))
                ctx.record_fate(_resolved(attempt.record("failed", repr(error), cost), "retried", None))
                slot.attempt += 1
                await self._wait_to_retry(slot, delay)
                continue
            del self._attempts[slot_id]
            slot.group_id = None
            if attempt.aborted:  # the client swallowed the abort's cancellation and returned: balance the count
                current.uncancel()
            return self._finish(group, attempt, target)

    async def _spent(self, attempt: _Attempt) -> GenerationCost:
        """What the generator spent on an aborted attempt, once it stopped working on it (a client that is not a
        :class:`CancelledCost` reports nothing). A shutdown meanwhile records the attempt ``pending``, as for any
        other."""
        if not isinstance(self.rollouts, CancelledCost):
            return NO_COST
        try:
            cost = await self.rollouts.spent(attempt.group_id)
        except asyncio.CancelledError:
            self.ctx.record_fate(attempt.record())
            raise
        self.ctx.fates.generation.generated(cost.tokens, cost.seconds)
        return cost

    async def _wait_to_retry(self, slot: SlotState, delay: float) -> None:
        """Back off, then wait for the gate. A shutdown meanwhile writes a slot-less ``pending`` line: the prompt's
        last line, ``failed``/``retried``, promises an attempt that will not come (``groupwise audit``)."""
        try:
            if delay > 0:
                await asyncio.sleep(delay)
            await self.ctx.rollout_permitted.wait()
        except asyncio.CancelledError:
            uid, epoch = slot.item.prompt.uid, slot.item.epoch
            detail = f"waiting to retry (attempt {slot.attempt}) when the run stopped; no attempt was running"
            self.ctx.record_fate(FateRecord(None, uid, slot.attempt, None, "pending", detail=detail, epoch=epoch))
            raise

    def _on_failure(
        self, attempts: PromptAttempts, error: Exception, attempt: _Attempt, target: int | None, cost: GenerationCost
    ) -> float | None:
        context = "rollout of " + self._where(attempt.item.prompt.uid, attempt.group_id, attempt.number, target)
        try:
            return self.ctx.budgets.on_failure(attempts, error, context)
        except BaseException as fatal:
            self.ctx.record_fate(_resolved(attempt.record("failed", repr(error), cost), "fatal", None))
            fatal.add_note(context)
            raise

    def _finish(self, group: Group, attempt: _Attempt, target: int | None) -> _Lost | None:
        ctx = self.ctx
        slot_id = attempt.group_id
        self._check_group(group, attempt)
        ctx.fates.generation.generated(group.num_completion_tokens, group.gen_seconds)
        if ctx.on_generated is not None:
            ctx.on_generated(group)
        group.target_step = target  # the controller's own stamp (the client knows nothing of steps)
        step, dropped = ctx.tally.record_generated(group)
        ctx.budgets.on_progress()
        self.groups_finished += 1
        if dropped:
            ctx.buffer.remove(slot_id)
            ctx.signal()
            detail = f"tallied to step {step}; raw rewards {group.raw_rewards}"
            return _Lost(attempt.record("filtered", detail, group.cost))
        ctx.buffer.commit(slot_id, group, group.end_version)
        ctx.signal()
        return None

    def _check_group(self, group: Group, attempt: _Attempt) -> None:
        """The group must carry what its attempt was dispatched with (the client sets these fields, once)."""
        slot_id, uid = attempt.group_id, attempt.item.prompt.uid
        given = {"group_id": slot_id, "attempt": attempt.number, "start_version": attempt.start_version,
                 "epoch": attempt.item.epoch}  # fmt: skip
        got = {"group_id": group.group_id, "attempt": group.attempt, "start_version": group.start_version,
               "epoch": group.epoch}  # fmt: skip
        if got != given:
            wrong = ", ".join(f"{key} {got[key]} (given {given[key]})" for key in given if got[key] != given[key])
            raise ValueError(
                f"rollout client returned {wrong} for prompt {uid!r} (group {slot_id}); it must return the group_id "
                "it was given, with the attempt and start_version it was dispatched with and its prompt's epoch"
            )
        if group.size != self.ctx.settings.group_size:
            raise ValueError(
                f"rollout client returned {group.size} completions for prompt {uid!r} (group {slot_id}); "
                f"the run is configured for group_size {self.ctx.settings.group_size}"
            )


def _resolved(record: FateRecord, resolution: str, step: int | None) -> FateRecord:
    """``record`` with its resolution (and step) set; built directly, ``dataclasses.replace`` costs ~3× as much."""
    r = record
    step = step if step is not None else r.step
    return FateRecord(r.group_id, r.prompt_uid, r.attempt, r.start_version, r.fate, step, resolution, r.detail, r.epoch,  # type: ignore[arg-type]
                      r.tokens, r.gen_seconds)  # fmt: skip
