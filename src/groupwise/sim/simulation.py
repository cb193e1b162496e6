"""One simulated run, async or sync, in virtual time — no files (``groupwise.sim.run`` writes those).

``simulate_async`` runs the REAL controller (``groupwise.controller.controller.build_controller``: pumps,
buffer, sampler, ledger, spare pool, failure budgets) and ``simulate_sync`` the REAL sync loop
(:class:`groupwise.trainer.sync_loop.SyncLoop`: rounds, dynamic-sampling accumulator, surplus, fates), each with a
real :class:`~groupwise.data.loader.PromptLoader` over the simulated prompts, against
:class:`~groupwise.sim.simulated_rollouts.SimulatedRollouts` and
:class:`~groupwise.sim.simulated_learner.SimulatedTrainer`.

A run ends normally (``max_steps`` or the end of data), or with one of :data:`NAMED_FAILURES` — the errors a
real run stops with, kept in ``error`` — or with :class:`SimulationTimeout` when it outlives its virtual-time
bound. Any other exception is a bug and propagates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from groupwise.algo.accumulator import DynamicSamplingExhausted
from groupwise.algo.waste import GenerationAccount
from groupwise.chunks import TrainChunk
from groupwise.controller.controller import Controller, ControllerSummary, build_controller
from groupwise.controller.failures import RolloutDataFailure, RolloutRedispatchExhausted
from groupwise.controller.fate_records import FateRecord
from groupwise.controller.ledger import StepBelowFloorError
from groupwise.controller.settings import ControllerSettings
from groupwise.controller.train_pump import ControllerStalled, RolloutExhaustedError
from groupwise.data.loader import PromptLoader
from groupwise.run.fates_file import FatesWriter
from groupwise.sim.job_rollouts import JobRollouts, JobTrainer
from groupwise.sim.meter import StepMeter
from groupwise.sim.simulated_learner import SimulatedTrainer
from groupwise.sim.simulated_rollouts import SimulatedDataFailure, SimulatedInfraFailure, SimulatedRollouts
from groupwise.sim.virtual_time import SimulationTimeout, run_in_virtual_time
from groupwise.sim.workload import LearningCurve, SimWorkload, make_sim_prompts
from groupwise.trainer.sync_loop import SyncLoop, SyncStep, TrainerState, record_carried_at_end
from groupwise.types import Group, Prompt

if TYPE_CHECKING:
    from groupwise.config import GrpoSection

#: Errors that end a run the way they would end a real one: reported, not raised, by the simulate functions.
NAMED_FAILURES: tuple[type[BaseException], ...] = (
    StepBelowFloorError,
    ControllerStalled,
    RolloutExhaustedError,
    RolloutDataFailure,
    RolloutRedispatchExhausted,
    DynamicSamplingExhausted,
    SimulatedDataFailure,
    SimulatedInfraFailure,
    SimulationTimeout,
)

StepCallback = Callable[[int, dict[str, float], list[Group]], None]


@dataclass
class SimParts:
    """The simulated generator and learner of one run, sharing one learning curve."""

    workload: SimWorkload
    prompts: list[Prompt]
    rollouts: SimulatedRollouts | JobRollouts
    trainer: SimulatedTrainer

    @classmethod
    def build(cls, workload: SimWorkload, partial_rollouts: bool = False, recompute_kv: bool = True) -> SimParts:
        """The toy model's parts, or the job model's when ``workload.job`` is set (``recompute_kv``: a partial
        rollout's KV cache is rebuilt after a weight sync, charged by the job model only)."""
        curve = LearningCurve(workload.initial_success_logit, workload.learning_rate_groups)
        prompts, difficulty = make_sim_prompts(workload)
        if workload.job is not None:
            job_rollouts = JobRollouts(workload, curve, difficulty, partial_rollouts=partial_rollouts,
                                       recompute_kv=recompute_kv)  # fmt: skip
            return cls(workload, prompts, job_rollouts, JobTrainer(workload, curve))
        rollouts = SimulatedRollouts(workload, curve, difficulty, partial_rollouts=partial_rollouts)
        return cls(workload, prompts, rollouts, SimulatedTrainer(workload, curve))

    def loader(self, max_epochs: int | None, shuffle: bool = True) -> PromptLoader:
        return PromptLoader(self.prompts, seed=self.workload.seed, shuffle=shuffle, max_epochs=max_epochs)


@dataclass
class SyncRunResult:
    """Totals over the trained steps of a sync run, for the summary."""

    gen_seconds: float = 0.0
    filtered_groups: int = 0
    trained_groups: int = 0
    discarded_groups: int = 0
    step_sizes: list[int] = field(default_factory=list)

    def add(self, done: SyncStep) -> None:
        tally = done.tally
        self.gen_seconds += done.gen_seconds
        self.filtered_groups += tally.groups_filtered
        self.trained_groups += tally.groups_trained
        self.discarded_groups += tally.discarded_valid_groups
        self.step_sizes.append(len(done.trained))


@dataclass
class SimRun:
    """A finished simulated run: its parts, how it ended, and its virtual wall time."""

    mode: str
    parts: SimParts
    wall_seconds: float = 0.0
    steps_trained: int = 0
    stop_reason: str | None = None
    error: BaseException | None = None
    meter: StepMeter | None = None
    controller: Controller | None = None
    controller_summary: ControllerSummary | None = None
    sync_result: SyncRunResult | None = None
    generation: GenerationAccount | None = None  # the run's generation costs (the controller's, or the sync loop's)

    @property
    def completed(self) -> bool:
        return self.error is None


def simulate_async(
    settings: ControllerSettings,
    workload: SimWorkload,
    *,
    max_epochs: int | None = None,
    shuffle: bool = True,
    on_step_end: StepCallback | None = None,
    on_fate: Callable[[FateRecord], None] | None = None,
    max_virtual_seconds: float = 1.0e7,
    partial_rollouts: bool = False,
    recompute_kv: bool = True,
) -> SimRun:
    """The real controller against the simulated generator and learner (see the module docstring);
    ``partial_rollouts``: weight updates reach the generations in flight (``async.partial_rollouts: continue``);
    ``recompute_kv``: their KV cache is rebuilt after a sync (``async.partial_rollout_kv``, job model only)."""
    if settings.group_size != workload.group_size:
        raise ValueError(
            f"controller group_size {settings.group_size} != simulated group_size {workload.group_size}; "
            "build both from the same config"
        )
    parts = SimParts.build(workload, partial_rollouts, recompute_kv)
    run = SimRun(mode="async", parts=parts)

    async def step_end(step: int, metrics: dict[str, float], chunks: list[TrainChunk]) -> None:
        assert run.meter is not None
        groups = [group for chunk in chunks for group in chunk.groups]
        run.meter.record_trained(step, groups)
        metrics.update(run.meter.step_metrics(async_mode=True))
        run.steps_trained = step + 1 - settings.start_step
        if on_step_end is not None:
            on_step_end(step, metrics, groups)

    loader = parts.loader(max_epochs, shuffle)
    run.controller = controller = build_controller(
        settings, loader, parts.rollouts, parts.trainer, on_step_end=step_end, on_fate=on_fate
    )
    run.generation = controller.fates.generation

    async def main() -> None:
        run.meter = _meter(parts)
        try:
            run.controller_summary = await controller.run()
            run.stop_reason = run.controller_summary.stop_reason
        except NAMED_FAILURES as error:
            run.error = error

    _run_bounded(run, main, max_virtual_seconds)
    return run


def simulate_sync(
    grpo: GrpoSection,
    max_steps: int,
    workload: SimWorkload,
    *,
    max_epochs: int | None = None,
    shuffle: bool = True,
    on_step_end: StepCallback | None = None,
    fates: FatesWriter | None = None,
    max_virtual_seconds: float = 1.0e7,
) -> SimRun:
    """The real sync loop on the simulated workload (``grpo`` is the config's section; see the module docstring)."""
    parts = SimParts.build(workload)
    run = SimRun(mode="sync", parts=parts)
    loader = parts.loader(max_epochs, shuffle)
    state, totals = TrainerState(), SyncRunResult()
    run.generation = state.generation

    def step_end(done: SyncStep) -> None:
        assert run.meter is not None
        metrics, step = done.metrics, done.step
        staleness = [step - g.start_version for g in done.trained]
        metrics.update({
            "perf/gen_seconds": done.gen_seconds,
            "staleness/mean": sum(staleness) / len(staleness),
            "staleness/max": float(max(staleness)),
        })  # fmt: skip
        totals.add(done)
        run.meter.record_trained(step, done.trained)
        metrics.update(run.meter.step_metrics(async_mode=False, gen_seconds=done.gen_seconds))
        run.steps_trained = step + 1
        if on_step_end is not None:
            on_step_end(step, metrics, done.trained)

    async def main() -> None:
        run.meter = _meter(parts)
        loop = SyncLoop(grpo, loader, parts.rollouts, parts.trainer, state, on_step_end=step_end, fates=fates)
        try:
            run.stop_reason = await loop.run(max_steps)
        except NAMED_FAILURES as error:
            run.error = error
            return
        run.sync_result = totals  # a run that failed reports no sync totals (its summary counts come out 0)
        record_carried_at_end(fates, state)

    _run_bounded(run, main, max_virtual_seconds)
    return run


def _meter(parts: SimParts) -> StepMeter:
    return StepMeter(parts.rollouts, parts.trainer, asyncio.get_running_loop().time)


def _run_bounded(run: SimRun, main: Callable[[], Awaitable[object]], max_virtual_seconds: float) -> None:
    try:
        _, run.wall_seconds = run_in_virtual_time(main, max_virtual_seconds)
    except SimulationTimeout as error:
        run.error, run.wall_seconds = error, max_virtual_seconds
