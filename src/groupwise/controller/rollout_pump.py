"""`RolloutPump`: dispatches prompt batches, one dispatch slot per prompt (:mod:`~groupwise.controller.dispatch_slot`).

Loop: take a whole loader batch; divert it to the spare pool while the pool is below its low-water mark (never
the very first batch, so no step is burned); otherwise ``sampler.admit`` (gated samplers wait on the version
clock) and launch one *dispatch slot* per prompt. A launch holds a buffer-capacity permit (owned by the group once
committed) and an in-flight permit (held across replacements). At the end of data: let the slots settle, drain the
spare pool in whole steps (then, for a closes-short sampler, the leftover as one short batch), then mark the pump
exhausted.

Snapshots (:meth:`RolloutPump.unsettled`): unsettled slots are re-dispatched under their stamps after a resume
(:meth:`RolloutPump.restore_unsettled`); prompts of a batch still waiting at the gate go back to where they came
from (the loader front, or the spare pool front during the end-of-data drain).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from groupwise.controller.context import PumpContext
from groupwise.controller.dispatch_slot import DispatchSlots, SlotState
from groupwise.controller.fate_records import skipped_record
from groupwise.controller.interfaces import LoaderItem, PromptSource, RolloutClient, SkipsNoSignal
from groupwise.controller.permits import Permits
from groupwise.controller.samplers.base import checked_step
from groupwise.controller.workers import WorkerPool


class RolloutPump:
    """Produces groups into the buffer for the train pump (see the module docstring)."""

    def __init__(
        self, ctx: PumpContext, loader: PromptSource, rollouts: RolloutClient, on_error: Callable[[BaseException], None]
    ) -> None:
        self.ctx = ctx
        self.loader = loader
        self.rollouts = rollouts
        self.inflight = Permits(ctx.settings.max_inflight_prompts, "max_inflight_prompts")
        self.exhausted = False
        self.admitted_batches = 0
        self.unused_prompts = 0
        self._on_error = on_error
        self.dispatch = DispatchSlots(ctx, rollouts, self.inflight, refill=self._refill_spare_pool)
        # Unsettled slots in launch order: shutdown cancels them in a reproducible order, so their fates too.
        self._slots: WorkerPool[SlotState] = WorkerPool(self.dispatch.run, self._on_slot_settled)
        self._in_admit = False
        self._unlaunched: list[SlotState] = []
        self._batch_admitted = False  # whether the batch in ``_unlaunched`` passed the gate (holds its stamp)
        self._batch_from_pool = False

    # -- state the train pump and controller read ---------------------------------------------------

    @property
    def active_slots(self) -> int:
        """Dispatch slots not yet settled (in flight, backing off, or waiting to substitute a spare)."""
        return len(self._slots)

    def parked(self) -> bool:
        """True while the pump waits on something only the train pump can give (the gate or capacity)."""
        return (self._in_admit and self.ctx.clock.waiting > 0) or self.ctx.capacity.waiting > 0

    def unsettled(self) -> tuple[list[SlotState], list[LoaderItem], list[LoaderItem]]:
        """The work a snapshot must save: ``(slots, loader_items, spare_items)``.

        ``slots``: dispatch slots to re-dispatch under their stamps — running (in launch order), then those of an
        admitted batch still waiting for a permit. ``loader_items`` / ``spare_items``: prompts of a batch still
        waiting at the gate, to go back to the loader front or the spare pool front (where they came from).
        """
        slots = self._slots.items()
        if self._batch_admitted:
            return slots + list(self._unlaunched), [], []
        waiting = [slot.item for slot in self._unlaunched]
        return (slots, [], waiting) if self._batch_from_pool else (slots, waiting, [])

    def restore_unsettled(self, slots: list[SlotState]) -> None:
        """Re-dispatch ``slots`` (from a checkpoint) under their stamps before any new batch is admitted."""
        if self._slots or self._unlaunched:
            raise RuntimeError("restore_unsettled must be called before the rollout pump runs")
        self._unlaunched = list(slots)
        self._batch_admitted, self._batch_from_pool = True, False

    @property
    def groups_finished(self) -> int:
        """Groups committed or filtered so far: progress for a stall watchdog."""
        return self.dispatch.groups_finished

    @groups_finished.setter
    def groups_finished(self, value: int) -> None:  # restored from a snapshot
        self.dispatch.groups_finished = value

    def abort_stale(self, version: int) -> int:
        """Cancel in-flight attempts the sampler says can no longer be selected at ``version``."""
        return self.dispatch.abort_stale(version)

    # -- the pump --------------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._launch_admitted()  # slots restored from a checkpoint go first, under their stamps
            await self._dispatch_loader()
            await self._settle()
            await self._drain_spare_pool()
            self.exhausted = True
            self.ctx.signal()
        except BaseException:
            await self.cancel_slots()
            raise

    async def cancel_slots(self) -> None:
        """Cancel every unsettled dispatch slot and wait for them (their attempts record ``pending``)."""
        await self._slots.cancel_all()

    async def _dispatch_loader(self) -> None:
        P = self.ctx.settings.prompts_per_step
        while True:
            batch = self._take(P)
            if not batch:
                return
            if len(batch) < P:
                # A partial last batch: a spare pool takes it (the drain dispatches spares first, so a closes-short
                # sampler's short batch is the very last one); else only a closes-short sampler can train it.
                if self.ctx.replacement_enabled:
                    self.ctx.spare_pool.add_batch(batch)
                    continue
                if not self.ctx.accounting.closes_short_at_exhaustion:
                    self.unused_prompts += len(batch)
                    continue
            if self.ctx.replacement_enabled and self.admitted_batches > 0 and self.ctx.spare_pool.needs_refill():
                self.ctx.spare_pool.add_batch(batch)
                continue
            await self._admit_and_launch(batch)

    async def _admit_and_launch(self, batch: Sequence[LoaderItem], from_pool: bool = False) -> None:
        self._unlaunched = [SlotState(item) for item in batch]
        self._batch_admitted, self._batch_from_pool = False, from_pool
        self._in_admit = True
        try:
            target = checked_step(await self.ctx.sampler.admit(self.ctx.clock), self.ctx.sampler, "admit(clock)")
        finally:
            self._in_admit = False
        self._batch_admitted = True
        self.admitted_batches += 1
        if target is not None:
            # Only after a resume without a dispatch cursor: restored groups, or restored losses charged to this
            # step, already cover part of it; the rest of the batch goes back.
            already = self.ctx.buffer.count_for_target_step(target) + self.ctx.ledger.peek(target).charged
            if already:
                keep = max(0, len(batch) - already)
                self.loader.push_front([slot.item for slot in self._unlaunched[keep:]])
                del self._unlaunched[keep:]
        for slot in self._unlaunched:
            slot.target = target
        await self._launch_admitted()

    async def _launch_admitted(self) -> None:
        while self._unlaunched:
            await self._launch(self._unlaunched[0])
            self._unlaunched.pop(0)

    async def _launch(self, slot: SlotState) -> None:
        await self.ctx.capacity.acquire()
        try:
            await self.inflight.acquire()
        except BaseException:
            self.ctx.capacity.release()
            raise
        try:
            await self.ctx.rollout_permitted.wait()
        except BaseException:
            self.ctx.capacity.release()
            self.inflight.release()
            raise
        self._slots.submit(slot)

    def _refill_spare_pool(self) -> None:
        """A slot needs a spare and the pool is empty: divert the next loader batch into the pool now. The dispatch
        loop refills the pool only between admissions, and it may be parked at the sampler's gate for many
        replacements; without this, a step would close short (a charged loss) while the data lasts. A non-awaiting
        call on the controller's loop: atomic with the dispatch loop, so every prompt is in the loader, the pool,
        the batch at the gate or a slot, as a snapshot expects."""
        batch = self._take(self.ctx.settings.prompts_per_step)
        if batch:
            self.ctx.spare_pool.add_batch(batch)

    def _take(self, n: int) -> Sequence[LoaderItem]:
        """The loader's next ``n`` prompts; the draws it skipped on the way get their fates now (no await)."""
        batch = self.loader.take(n)
        if isinstance(self.loader, SkipsNoSignal):
            for draw in self.loader.drain_skipped():
                self.ctx.record_fate(skipped_record(draw))
        return batch

    def _on_slot_settled(self, error: BaseException | None) -> None:
        self.ctx.signal()
        if error is not None:
            self._on_error(error)

    async def _settle(self) -> None:
        await self._slots.wait_idle()

    async def _drain_spare_pool(self) -> None:
        P = self.ctx.settings.prompts_per_step
        while len(self.ctx.spare_pool) >= P:
            # One whole step at a time, so a snapshot always finds each spare in the pool or in a slot.
            while len(self.ctx.spare_pool) >= P:
                await self._admit_and_launch(self.ctx.spare_pool.take_many(P), from_pool=True)
            await self._settle()
        if self.ctx.accounting.closes_short_at_exhaustion and len(self.ctx.spare_pool):
            # The leftover partial step closes short: admitted last, after every whole step.
            await self._admit_and_launch(self.ctx.spare_pool.discard_leftover(), from_pool=True)
            await self._settle()
        self.unused_prompts += len(self.ctx.spare_pool.discard_leftover())
