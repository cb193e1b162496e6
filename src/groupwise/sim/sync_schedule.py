"""The sync loop's schedule in virtual time: generate a round, wait for all of it, filter, train, sync weights.

Step ``s`` mirrors :mod:`groupwise.trainer.sync_loop`: rounds of ``ceil(P × batch_multiplier)`` prompts are sent to
the simulated engine together and the round ends when its slowest group ends; the real
:class:`~groupwise.algo.accumulator.DynamicSamplingAccumulator` keeps groups with variance until P (or
``max_gen_rounds``, then ``on_exhausted``), surplus is discarded or carried; then the simulated learner
trains all kept groups as one chunk, the optimizer step runs, and the new weights are synced. Generation
and training strictly alternate, so the sync run pays for every round's long tail and for the weight sync.

The sync loop has no rollout-failure handling (a failed rollout stops a real sync run), so a simulation
with injected failures must use ``mode: async``; :func:`check_sync_workload` says so up front.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from groupwise.algo.accumulator import DynamicSamplingAccumulator, DynamicSamplingExhausted
from groupwise.config.issues import ConfigIssue
from groupwise.run.fates_file import FatesWriter, write_sync_step_fates, write_untrained_step_fates
from groupwise.sim.simulated_learner import SimulatedTrainer
from groupwise.sim.simulated_rollouts import SimulatedRollouts
from groupwise.sim.workload import SimWorkload
from groupwise.types import Group

SyncStepHook = Callable[[int, dict[str, float], list[Group]], "Awaitable[None] | None"]


def check_sync_workload(workload: SimWorkload) -> list[ConfigIssue]:
    """Issues for injected failures in mode sync (the real sync loop would stop at the first one)."""
    return [
        ConfigIssue(
            f"sim.{name}",
            getattr(workload, name),
            f"sim.{name} injects rollout failures, but the sync loop has no failure handling (a real sync run "
            "stops at the first failed rollout), so the simulation would only show that",
            f"set sim.{name}: 0 for a sync simulation, or simulate mode: async",
        )
        for name in ("infra_failure_rate", "data_failure_rate")
        if getattr(workload, name) > 0
    ]


@dataclass(frozen=True)
class SyncSettings:
    """The sync loop's knobs: P, run length and the dynamic-sampling section (``grpo.dynamic_sampling``)."""

    prompts_per_step: int
    max_steps: int
    dynamic_sampling: bool = True
    batch_multiplier: float = 1.0
    max_gen_rounds: int = 4
    on_exhausted: str = "train_short"
    min_step_batch_fraction: float = 0.25
    surplus: str = "discard"
    zero_variance_tol: float = 0.0

    @property
    def round_size(self) -> int:
        """``ceil(P × batch_multiplier)`` with dynamic sampling, else P (as the sync loop's ``round_size``)."""
        multiplier = self.batch_multiplier if self.dynamic_sampling else 1.0
        return math.ceil(round(self.prompts_per_step * multiplier, 9))

    @classmethod
    def from_config(cls, cfg: Any) -> SyncSettings:
        ds = cfg.grpo.dynamic_sampling
        return cls(
            prompts_per_step=cfg.grpo.num_prompts_per_step,
            max_steps=cfg.run.max_steps,
            dynamic_sampling=ds.enabled,
            batch_multiplier=ds.batch_multiplier,
            max_gen_rounds=ds.max_gen_rounds,
            on_exhausted=ds.on_exhausted,
            min_step_batch_fraction=ds.min_step_batch_fraction,
            surplus=ds.surplus,
            zero_variance_tol=ds.zero_variance_tol,
        )


@dataclass
class SyncRunResult:
    """What the sync schedule did."""

    stop_reason: str
    steps_trained: int = 0
    gen_seconds: float = 0.0
    filtered_groups: int = 0
    trained_groups: int = 0
    discarded_groups: int = 0
    step_sizes: list[int] = field(default_factory=list)


async def run_sync_schedule(
    settings: SyncSettings,
    loader: Any,
    rollouts: SimulatedRollouts,
    trainer: SimulatedTrainer,
    on_step_end: SyncStepHook | None = None,
    fates: FatesWriter | None = None,
) -> SyncRunResult:
    """Run the sync loop's schedule until ``max_steps`` or the end of data (see the module docstring).

    ``fates`` receives the same ``fates.jsonl`` lines as a real sync run writes (``groupwise.run.fates_file``).
    """
    result = SyncRunResult(stop_reason="max_steps")
    loop = asyncio.get_running_loop()
    carried: list[Group] = []
    next_group_id = 0
    await rollouts.sync_weights(0)
    for step in range(settings.max_steps):
        accumulator = _accumulator(settings, carried)
        exhausted, gen_seconds, generated = False, 0.0, []
        while accumulator.can_generate_more:
            items = loader.take(settings.round_size)
            if not items:
                exhausted = True
                break
            started = loop.time()
            ids = range(next_group_id, next_group_id + len(items))
            next_group_id += len(items)
            calls = [rollouts.rollout(item, gid, 0, step) for item, gid in zip(items, ids, strict=True)]
            groups = await asyncio.gather(*calls)
            for group in groups:
                group.end_version = step
            gen_seconds += loop.time() - started
            generated += groups
            accumulator.add_round(groups)
        if exhausted and not accumulator.is_complete:
            _untrained_fates(fates, settings, step, generated, carried, "the data ran out (max_epochs)")
            result.stop_reason = "exhausted"
            break
        try:
            selection = accumulator.finish()  # DynamicSamplingExhausted (on_exhausted: raise) stops the run
        except DynamicSamplingExhausted:
            _untrained_fates(fates, settings, step, generated, carried, "dynamic sampling exhausted its rounds")
            raise
        if fates is not None:
            write_sync_step_fates(
                fates, step, generated, selection.trained, selection.surplus, selection.surplus_carried,
                settings.dynamic_sampling, settings.zero_variance_tol,
            )  # fmt: skip
        await trainer.train_chunk(step, selection.trained, True)
        metrics = await trainer.finish_step(step)
        await rollouts.sync_weights(step + 1)
        carried = selection.carry_over
        tally = selection.tally
        metrics.update(tally.metrics())
        staleness = [step - g.start_version for g in selection.trained]
        metrics.update({
            "perf/gen_seconds": gen_seconds,
            "staleness/mean": sum(staleness) / len(staleness),
            "staleness/max": float(max(staleness)),
        })  # fmt: skip
        result.steps_trained += 1
        result.gen_seconds += gen_seconds
        result.filtered_groups += tally.groups_filtered
        result.trained_groups += tally.groups_trained
        result.discarded_groups += tally.discarded_valid_groups
        result.step_sizes.append(len(selection.trained))
        if on_step_end is not None:
            outcome = on_step_end(step, metrics, selection.trained)
            if outcome is not None:
                await outcome
    return result


def _untrained_fates(
    fates: FatesWriter | None, settings: SyncSettings, step: int, generated: list[Group], carried: list[Group], why: str
) -> None:
    if fates is not None:
        write_untrained_step_fates(
            fates, step, generated, carried, settings.dynamic_sampling, settings.zero_variance_tol, why
        )


def _accumulator(settings: SyncSettings, carried: list[Group]) -> DynamicSamplingAccumulator:
    return DynamicSamplingAccumulator(
        num_prompts_per_step=settings.prompts_per_step,
        enabled=settings.dynamic_sampling,
        max_gen_rounds=settings.max_gen_rounds if settings.dynamic_sampling else 1,
        on_exhausted=settings.on_exhausted,  # type: ignore[arg-type]
        min_step_batch_fraction=settings.min_step_batch_fraction,
        surplus=settings.surplus,  # type: ignore[arg-type]
        zero_variance_tol=settings.zero_variance_tol,
        carried_in=carried,
    )
