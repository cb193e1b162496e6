"""`TrainPump`: assembles each RL step from streamed chunks of whole groups, then one optimizer step.

Per step ``s`` (= the trainer version ``v``):

1. evict what the sampler says can never be selected (capacity released, fate ``evicted``);
2. while the ledger has open slots: ``select`` a chunk of at least ``min(streaming_min, open)`` groups —
   synchronously, and record it in the ledger in the same step, so no loss can be charged against it —
   release their capacity, train the chunk (``train_chunk``); if nothing is selectable, wait for progress;
3. close the step (ledger asserts ``selected + charged == P``), ``finish_step`` (one optimizer step), and only
   then write the step's ``trained`` fates; advance the version clock, abort stale in-flight attempts,
   ``sync_weights``, emit metrics. Groups selected for a step whose optimizer step never ran (the run stopped
   first) get ``pending`` fates saying so (:func:`untrained_record`, written by the controller at shutdown).

At the end of data: a step with nothing selected and an empty buffer ends the run cleanly; a closes-short
sampler closes its last step short (above the floor); anything else raises
:class:`RolloutExhaustedError`. When the rollout pump is parked on the gate or on capacity with nothing in
flight and nothing is selectable, no event can ever arrive: :class:`ControllerStalled` names the state
instead of hanging (a weight_fifo bucket that can never fill is reported this way). The check runs whenever the
train pump wakes, and the rollout pump parking wakes it (``VersionClock.on_park``, ``Permits.on_park``), so a pump
that parks after everything else settled is always seen.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from groupwise.algo.waste import ASYNC_WASTE_FATES
from groupwise.chunks import TrainChunk, step_chunk
from groupwise.controller.buffer import Slot
from groupwise.controller.context import PumpContext
from groupwise.controller.fate_records import FateRecord
from groupwise.controller.interfaces import RolloutClient, TrainerClient
from groupwise.controller.ledger import LedgerInvariantError, StepRecord
from groupwise.controller.rollout_pump import RolloutPump
from groupwise.controller.state_report import describe_state
from groupwise.types import Group

StepEndHook = Callable[[int, dict[str, float], list[TrainChunk]], "Awaitable[None] | None"]


class RolloutExhaustedError(RuntimeError):
    """The data ran out before a step could be assembled (and the sampler does not close short)."""


class ControllerStalled(RuntimeError):
    """Neither pump can make progress: nothing in flight, the rollout pump parked, nothing selectable."""


class TrainPump:
    """Consumes the buffer step by step (see the module docstring)."""

    def __init__(
        self,
        ctx: PumpContext,
        rollout_pump: RolloutPump,
        trainer: TrainerClient,
        rollouts: RolloutClient,
        on_step_end: StepEndHook | None = None,
    ) -> None:
        self.ctx = ctx
        self.rollout = rollout_pump
        self.trainer = trainer
        self.rollouts = rollouts
        self.on_step_end = on_step_end
        self.steps_trained = 0
        self.evicted_total = 0
        self.aborted_total = 0
        self.step_sizes: list[int] = []
        # ``trained`` records of the step being assembled, written once its optimizer step has run.
        self.selected: list[FateRecord] = []

    async def run(self) -> str:
        """Train until ``max_steps`` or the end of data; return the stop reason."""
        max_steps = self.ctx.settings.max_steps
        while max_steps is None or self.ctx.clock.value < max_steps:
            step = self.ctx.clock.value
            try:
                assembled = await self._assemble(step)
                if assembled is None:
                    return "exhausted"
                await self._finish(step, *assembled)
            except Exception as error:
                error.add_note(f"in the train pump while assembling/finishing step {step}")
                raise
        return "max_steps"

    async def _assemble(self, step: int) -> tuple[list[TrainChunk], int, bool] | None:
        """Select chunks until the step is fully accounted; (chunks, evicted, closes short) or None at the end."""
        ctx = self.ctx
        chunks: list[TrainChunk] = []
        evicted = 0
        while True:
            ctx.progress.clear()
            evicted += self._evict(step)
            remaining = ctx.ledger.open_slots(step)
            if remaining <= 0:
                return chunks, evicted, False
            min_groups = min(ctx.settings.streaming_min_groups, remaining)
            if self.rollout.exhausted and ctx.accounting.closes_short_at_exhaustion:
                min_groups = 1  # the last step closes on whatever is left
            slots = ctx.sampler.select(step, min_groups, remaining)
            if slots is None:
                if self.rollout.exhausted:
                    return self._at_exhaustion(step, chunks, evicted, min_groups)
                if self.rollout.parked() and self.rollout.active_slots == 0:
                    raise ControllerStalled(self._stall_report(step))
                await ctx.progress.wait()
                continue
            if not min_groups <= len(slots) <= remaining or any(not slot.ready for slot in slots):
                raise LedgerInvariantError(
                    f"sampler returned {len(slots)} slots (ready: {[s.ready for s in slots]}) for "
                    f"select(min={min_groups}, max={remaining}) at step {step}"
                )
            ctx.ledger.record_selected(step, len(slots))
            ctx.capacity.release(len(slots))
            selected = [slot.group for slot in slots if slot.group is not None]
            # ``trained`` is a promise that the step's optimizer step ran: recorded by _finish after it did.
            self.selected.extend(_selected_record(slot, step) for slot in slots)
            ctx.tally.record_trained(step, selected)
            chunk = step_chunk(selected, ctx.settings.advantages)
            first = not chunks
            chunks.append(chunk)
            await self.trainer.train_chunk(step, chunk, first)

    def _evict(self, version: int) -> int:
        slots = self.ctx.sampler.evict(version)
        if slots:
            self.ctx.capacity.release(len(slots))
            for slot in slots:
                self.ctx.record_fate(
                    FateRecord(
                        slot.slot_id,
                        _uid(slot.group),
                        slot.group.attempt if slot.group else 0,
                        slot.start_version,
                        "evicted",
                        version,
                        epoch=_epoch(slot.group),
                        tokens=_tokens(slot.group),
                        gen_seconds=_seconds(slot.group),
                    )
                )
            self.evicted_total += len(slots)
        return len(slots)

    def _at_exhaustion(
        self, step: int, chunks: list[TrainChunk], evicted: int, min_groups: int
    ) -> tuple[list[TrainChunk], int, bool] | None:
        ctx = self.ctx
        record = ctx.ledger.peek(step)
        ready = ctx.buffer.ready_count
        if record.selected == 0 and ready == 0:
            return None
        if ctx.accounting.closes_short_at_exhaustion and record.selected > 0:
            return chunks, evicted, True
        open_slots = ctx.ledger.open_slots(step)
        if ready < min_groups:
            why = f"only {ready} ready group(s) are left for its {open_slots} open slot(s)"
        else:
            why = (
                f"{ready} ready group(s) are left, but sampler {ctx.settings.sampler.name!r} selects none of them at "
                f"version {step} (it takes at least {min_groups} at once)"
            )
        raise RolloutExhaustedError(
            f"rollout exhausted before step {step} was assembled: selected {record.selected} + charged "
            f"{record.charged} of P {ctx.settings.prompts_per_step} groups; {why}. Provide more prompts "
            "(run.max_epochs), or choose a sampler that closes short (windowed)"
        )

    async def _finish(self, step: int, chunks: list[TrainChunk], evicted: int, short: bool) -> None:
        ctx = self.ctx
        record = ctx.ledger.close_short(step) if short else ctx.ledger.close(step)
        trainer_metrics = await self.trainer.finish_step(step)
        for selected in self.selected:
            ctx.record_fate(selected)
        self.selected = []
        aborted = await self._sync_weights()
        groups = [group for chunk in chunks for group in chunk.groups]
        self.steps_trained += 1
        self.step_sizes.append(len(groups))
        metrics = self._metrics(step, record, groups, evicted, aborted)
        metrics.update(trainer_metrics)
        if self.on_step_end is not None:
            result = self.on_step_end(step, metrics, chunks)
            if inspect.isawaitable(result):
                await result

    async def _sync_weights(self) -> int:
        """Advance the version, abort stale in-flight attempts, push weights; no dispatch meanwhile."""
        ctx = self.ctx
        ctx.rollout_permitted.clear()
        version = ctx.clock.advance()
        aborted = self.rollout.abort_stale(version)
        self.aborted_total += aborted
        await self.rollouts.sync_weights(version)
        ctx.generator_version = version
        ctx.rollout_permitted.set()
        return aborted

    def _metrics(
        self, step: int, record: StepRecord, groups: list[Group], evicted: int, aborted: int
    ) -> dict[str, float]:
        staleness = [step - g.start_version for g in groups]
        metrics = self.ctx.tally.pop_metrics(step)
        metrics.update(self.ctx.fates.generation.step_metrics(ASYNC_WASTE_FATES))
        metrics.update(
            {
                "accounting/dropped_groups": float(record.charged),
                "accounting/replaced_groups": float(record.replaced),
                "accounting/promoted_groups": float(record.promoted),
                "accounting/unfilled_groups": float(record.unfilled),
                "accounting/late_losses": float(self.ctx.ledger.late_losses),
                "buffer/evicted_groups": float(evicted),
                "buffer/aborted_inflight_groups": float(aborted),
                "staleness/mean": sum(staleness) / len(staleness) if staleness else 0.0,
                "staleness/max": float(max(staleness, default=0)),
                "step": float(step),
                "weight_version": float(self.ctx.clock.value),
            }
        )
        return metrics

    def _stall_report(self, step: int) -> str:
        return (
            f"the controller cannot make progress at step {step}: {describe_state(self.ctx, self.rollout)}. Sampler "
            f"{self.ctx.settings.sampler.name!r} selects nothing from this buffer and the rollout pump waits for the "
            "trainer, so nothing can change"
        )


def _selected_record(slot: Slot, step: int) -> FateRecord:
    group = slot.group
    attempt = group.attempt if group else 0
    return FateRecord(slot.slot_id, _uid(group), attempt, slot.start_version, "trained", step, epoch=_epoch(group),
                      tokens=_tokens(group), gen_seconds=_seconds(group))  # fmt: skip


def untrained_record(record: FateRecord, reason: str) -> FateRecord:
    """The ``pending`` record of a group selected for a step whose optimizer step never ran."""
    detail = f"selected for step {record.step}, whose optimizer step never ran: {reason}"
    return FateRecord(record.group_id, record.prompt_uid, record.attempt, record.start_version, "pending",
                      record.step, detail=detail, epoch=record.epoch, tokens=record.tokens,
                      gen_seconds=record.gen_seconds)  # fmt: skip


def _uid(group: Group | None) -> str:
    return group.prompt.uid if group is not None else "?"


def _epoch(group: Group | None) -> int | None:
    return group.epoch if group is not None else None


def _tokens(group: Group | None) -> int:
    return group.num_completion_tokens if group is not None else 0


def _seconds(group: Group | None) -> float:
    return group.gen_seconds if group is not None else 0.0
