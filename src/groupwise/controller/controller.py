"""The async single controller: wires buffer, sampler, ledger, spare pool and the two pumps, and runs them.

``build_controller(settings, loader, rollouts, trainer, on_step_end=..., on_fate=...)`` checks the setup
(weight_fifo + dynamic sampling is refused, the buffer capacity must cover the sampler's need) and
returns a :class:`Controller`; ``await controller.run()`` trains until ``max_steps`` or the end of data and
returns a :class:`ControllerSummary`. A crash in either pump cancels the other; the error reaches the caller
with notes naming the step and the prompt. Only runtimes and the CLI import this module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from groupwise.config.async_rules import WEIGHT_FIFO_DS_FIX, WEIGHT_FIFO_DS_RULE
from groupwise.controller.buffer import GroupBuffer
from groupwise.controller.clock import VersionClock
from groupwise.controller.context import PumpContext
from groupwise.controller.failures import FailureBudgets
from groupwise.controller.fate_records import FateCounts, FateRecord
from groupwise.controller.interfaces import PromptSource, RolloutClient, SkipsNoSignal, TrainerClient
from groupwise.controller.ledger import StepLedger, StepRecord
from groupwise.controller.permits import Permits
from groupwise.controller.rollout_pump import RolloutPump
from groupwise.controller.samplers import build_sampler, drop_accounting
from groupwise.controller.samplers.base import checked_step
from groupwise.controller.settings import ControllerSettings
from groupwise.controller.snapshot import Decode, Encode, Progress, restore_snapshot, take_snapshot
from groupwise.controller.spare_pool import SparePool
from groupwise.controller.state_report import describe_state
from groupwise.controller.step_tally import StepTallyBook
from groupwise.controller.train_pump import StepEndHook, TrainPump, untrained_record

# The refusal the config rules give (config check, train): the controller says the same when built directly.
WEIGHT_FIFO_WITH_DS = f"{WEIGHT_FIFO_DS_RULE} {WEIGHT_FIFO_DS_FIX}"


@dataclass
class ControllerSummary:
    """What a run did: steps, versions, and the fate of everything dispatched."""

    stop_reason: str
    steps_trained: int
    first_step: int
    final_version: int
    step_sizes: list[int]
    fates: FateCounts
    ledger_history: list[StepRecord]
    pending_charges: list[StepRecord]
    evicted_groups: int
    aborted_inflight_groups: int
    unused_prompts: int
    skipped_prompts: int
    late_losses: int


class Controller:
    """Owns the pumps for one run. Build it with :func:`build_controller`."""

    def __init__(
        self,
        ctx: PumpContext,
        loader: PromptSource,
        rollouts: RolloutClient,
        trainer: TrainerClient,
        on_step_end: StepEndHook | None,
    ) -> None:
        self.ctx = ctx
        self.loader = loader
        self.rollouts = rollouts
        self._failure: asyncio.Future[None] | None = None
        self.rollout_pump = RolloutPump(ctx, loader, rollouts, on_error=self._on_slot_error)
        self.train_pump = TrainPump(ctx, self.rollout_pump, trainer, rollouts, on_step_end)
        self.resume_notes: list[str] = []  # what a restore had to drop, for the runtime to log

    @property
    def ledger(self) -> StepLedger:
        return self.ctx.ledger

    @property
    def fates(self) -> FateCounts:
        return self.ctx.fates

    def state_dict(
        self, encode: Encode = lambda item: item, progress: Progress | None = None
    ) -> dict[str, Any]:
        """A resumable snapshot; take it synchronously between steps (e.g. inside ``on_step_end``).

        Holds the next step, the sampler, its dispatch cursor and whether it stamps, the READY buffered groups,
        the spare pool, the unsettled dispatch slots (re-dispatched first on resume, under their stamps), prompts
        waiting at the gate, the open steps' ledger entries and tallies, failure budgets and run counters — see
        :mod:`groupwise.controller.snapshot`. ``encode`` turns a loader item into plain data; ``progress`` (the
        rollout client's, by group id) saves what each running attempt generated so far, so it can continue.
        """
        return take_snapshot(self, encode, progress)

    def continued_attempts(self) -> list[dict[str, Any]]:
        """The progress of every attempt a restore set to continue (not yet handed back to the rollout client)."""
        return [slot.progress for slot in self.rollout_pump.unsettled()[0] if slot.progress is not None]

    def describe_state(self) -> str:
        """Where the controller stands, on one line (:mod:`groupwise.controller.state_report`)."""
        return describe_state(self.ctx, self.rollout_pump)

    def progress_marker(self) -> tuple[int, int, int]:
        """Changes whenever anything progresses: (optimizer steps, groups committed or filtered, fate records)."""
        return (self.ctx.clock.value, self.rollout_pump.groups_finished, self.ctx.fates.total)

    def _on_slot_error(self, error: BaseException) -> None:
        if self._failure is not None and not self._failure.done():
            self._failure.set_exception(error)

    async def run(self) -> ControllerSummary:
        """Run both pumps until the train pump stops; re-raise the first failure of either."""
        loop = asyncio.get_running_loop()
        self._failure = loop.create_future()
        await self.rollouts.sync_weights(self.ctx.clock.value)
        self.ctx.generator_version = self.ctx.clock.value
        self.ctx.rollout_permitted.set()
        rollout_task = loop.create_task(self.rollout_pump.run(), name="groupwise-rollout-pump")
        train_task = loop.create_task(self.train_pump.run(), name="groupwise-train-pump")
        waiting: set[asyncio.Future[str] | asyncio.Future[None]] = {rollout_task, train_task, self._failure}
        stopped_by: BaseException | None = None
        try:
            while train_task in waiting:
                done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                # A failed dispatch slot is the root cause of whatever the pumps saw after it: surface it first.
                for task in sorted(done, key=lambda t: t is not self._failure):
                    failure = task.exception()
                    if failure is not None:  # a crashed pump or slot: stop everything, surface it
                        raise failure
            stop_reason = train_task.result()
        except BaseException as error:
            stopped_by = error
            raise
        finally:
            await self._shutdown(rollout_task, train_task, stopped_by)
        return self._summary(stop_reason)

    async def _shutdown(
        self, rollout_task: asyncio.Task[None], train_task: asyncio.Task[str], stopped_by: BaseException | None
    ) -> None:
        for task in (train_task, rollout_task):
            if not task.done():
                task.cancel()
        await asyncio.gather(train_task, rollout_task, return_exceptions=True)
        await self.rollout_pump.cancel_slots()
        if self._failure is not None and not self._failure.done():
            self._failure.cancel()
        elif self._failure is not None and not self._failure.cancelled():
            self._failure.exception()  # retrieved: no "never retrieved" warning
        reason = "the run stopped" if stopped_by is None else f"the run stopped on {_brief(stopped_by)}"
        for record in self.train_pump.selected:  # selected, but the step's optimizer step never ran
            self.ctx.record_fate(untrained_record(record, reason))
        self.train_pump.selected = []
        for slot_id in self.ctx.buffer.ready_slot_ids():
            slot = self.ctx.buffer.remove(slot_id)
            group = slot.group
            self.ctx.record_fate(
                FateRecord(
                    slot_id,
                    group.prompt.uid if group else "?",
                    group.attempt if group else 0,
                    slot.start_version,
                    "pending",
                    slot.target_step,
                    epoch=group.epoch if group else None,
                    tokens=group.num_completion_tokens if group else 0,
                    gen_seconds=group.gen_seconds if group else 0.0,
                )
            )

    def _summary(self, stop_reason: str) -> ControllerSummary:
        ctx, train = self.ctx, self.train_pump
        return ControllerSummary(
            stop_reason=stop_reason,
            steps_trained=train.steps_trained,
            first_step=ctx.settings.start_step,
            final_version=ctx.clock.value,
            step_sizes=list(train.step_sizes),
            fates=ctx.fates,
            ledger_history=list(ctx.ledger.history),
            pending_charges=ctx.ledger.pending(),
            evicted_groups=train.evicted_total,
            aborted_inflight_groups=train.aborted_total,
            unused_prompts=self.rollout_pump.unused_prompts,
            skipped_prompts=ctx.budgets.skipped,
            late_losses=ctx.ledger.late_losses,
        )


def _brief(error: BaseException, limit: int = 200) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def build_controller(
    settings: ControllerSettings,
    loader: PromptSource,
    rollouts: RolloutClient,
    trainer: TrainerClient,
    on_step_end: StepEndHook | None = None,
    on_fate: Callable[[FateRecord], None] | None = None,
    state: dict[str, Any] | None = None,
    decode: Decode = lambda data: data,
) -> Controller:
    """Check the setup and wire a :class:`Controller` (see the module docstring).

    ``state`` is a :meth:`Controller.state_dict` to resume from (restore the loader's own state first);
    ``settings.start_step`` must equal its step and P must match. Buffered groups, stamps and ledger entries are
    restored only under the same sampler; otherwise they are dropped with notes in ``Controller.resume_notes``.
    """
    if settings.dynamic_sampling.enabled and settings.sampler.name == "weight_fifo":
        raise ValueError(WEIGHT_FIFO_WITH_DS)
    buffer = GroupBuffer()
    sampler = build_sampler(settings.sampler, buffer)
    sampler.set_dispatch_index(settings.start_step)
    needed = checked_step(sampler.required_buffer_capacity(settings.prompts_per_step), sampler,
                          f"required_buffer_capacity({settings.prompts_per_step})", "a group count")  # fmt: skip
    if needed is not None and settings.max_buffered_rollouts < needed:
        raise ValueError(
            f"max_buffered_rollouts={settings.max_buffered_rollouts} is below what sampler {settings.sampler.name!r} "
            f"needs ({needed} = P × (window + 1)) to avoid a backpressure deadlock; raise it to at least {needed}"
        )
    ledger = StepLedger(settings.prompts_per_step, settings.failure.min_step_batch_fraction, settings.start_step)
    ctx = PumpContext(
        settings=settings,
        clock=VersionClock(settings.start_step),
        buffer=buffer,
        sampler=sampler,
        accounting=drop_accounting(sampler),
        ledger=ledger,
        tally=StepTallyBook(ledger, settings.dynamic_sampling),
        spare_pool=SparePool(settings.failure.replacement_reserve_prompts),
        capacity=Permits(settings.max_buffered_rollouts, "max_buffered_rollouts"),
        budgets=FailureBudgets(settings.failure),
        on_fate=on_fate,
        on_generated=loader.observe if isinstance(loader, SkipsNoSignal) else None,
        generator_version=settings.start_step,
    )
    controller = Controller(ctx, loader, rollouts, trainer, on_step_end)
    if state is not None:
        controller.resume_notes = restore_snapshot(controller, loader, state, decode)
    return controller
