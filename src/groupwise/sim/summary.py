"""``sim/summary.json``: what one simulated run did, in one flat JSON object (deterministic for a config + seed).

Identity: ``mode``, ``sampler``, ``sampler_knobs``, ``seed``, ``prompts_per_step``, ``group_size``.
Outcome: ``outcome`` (``completed`` | ``failed``), ``stop_reason`` (``max_steps`` | ``exhausted`` | ``no_signal``: a
sync step dynamic sampling could not fill under ``stop_when_exhausted`` | null),
``error`` (``"<ErrorType>: <message>"`` | null), ``steps``, ``wall_seconds`` (virtual).

Groups (async: from the fate records, one per dispatched attempt; sync: from the step tallies):

- ``attempts``: rollout attempts dispatched; ``generated_groups``: attempts that came back scored;
- ``filtered_groups`` (zero-variance under dynamic sampling), ``trained_groups``;
- ``lost_groups``: prompts lost for good (filtered, failed past their budget or aborted, and no spare took
  over), whoever they were charged to; ``dropped_groups``: those charged to a step in the ledger (Σ
  ``accounting/dropped_groups``; ``windowed`` charges nobody);
- ``spare_substitutions``: losses a spare prompt took over; ``replaced_groups``: dispatch slots that
  committed after at least one substitution (Σ ``accounting/replaced_groups``);
- ``evicted_groups``; ``aborted_groups`` (in flight, cancelled as stale); ``failed_attempts`` (every failed
  attempt, retried or not);
- ``discarded_groups`` (sync: valid surplus discarded); ``pending_groups`` (in flight, buffered, or carried
  when the run ended); ``unused_prompts`` (async: spares and partial batches never dispatched);
- ``zero_variance_fraction``: generated groups whose G rewards are all equal ÷ generated groups.

Throughput and idleness: ``trained_groups_per_hour`` = trained ÷ wall × 3600;
``rollout_idle_fraction`` = engine idle (no completion in progress) ÷ wall; ``rollout_slot_idle_fraction`` =
1 − busy slot-seconds ÷ (slots × wall), the unused engine capacity; ``trainer_idle_fraction`` = 1 − training
seconds ÷ wall (weight syncs count as idle); ``weight_sync_seconds``; ``generation_wall_fraction`` (sync
only) = Σ generation-round seconds ÷ wall, the share of a sync step spent generating.

Generation cost (:mod:`groupwise.algo.waste`, the same figures as the ``waste/*`` metrics, for the whole run
including what settled after the last step): ``generated_tokens``, ``generated_gen_seconds``, ``trained_tokens``,
``pending_tokens``, ``wasted_tokens``, ``wasted_gen_seconds``, ``waste_fraction`` (wasted ÷ generated tokens) and,
per waste fate, ``<fate>_tokens`` / ``<fate>_gen_seconds`` (filtered, discarded, failed, aborted, evicted);
``engine_generated_tokens`` is the simulated engine's own count of what it handed back, which equals
``generated_tokens`` (= trained + wasted + pending once the run has ended). ``weight_sync_drain_seconds``: time
weight syncs waited for the engine to drain (``sim.weight_sync_drains``).

Staleness of trained groups (step − start version): ``staleness_mean``, ``staleness_p50/p90/p99``,
``staleness_max``, ``staleness_histogram`` ``{"<versions>": groups}``; ``token_staleness_mean``: the same over
their tokens, each token's staleness measured from the version that produced it (below ``staleness_mean`` only
with partial rollouts, where tokens of one completion come from several versions). Learning: ``final_unfiltered_reward``
(the last step's ``reward/unfiltered_mean``) and ``final_success_logit`` (the learning curve's last point).

With the job model (``sim.job``) only: ``job_fitted_constants`` (``sim.job.efficiency``, the model's fitted numbers
the run used), ``generator_busy_fraction`` (replica-seconds with a sequence running or waiting ÷ (replicas × wall))
and ``preemptions`` (sequences preempted because a replica's KV cache was full).
Floats are rounded to 6 decimals.
"""

from __future__ import annotations

import math
from typing import Any

from groupwise.sim.job_rollouts import JobRollouts
from groupwise.sim.meter import staleness_stats
from groupwise.sim.simulation import SimRun

LOST_FOR_GOOD = ("charged", "uncharged")


def summarize(run: SimRun, identity: dict[str, Any], final_unfiltered_reward: float | None) -> dict[str, Any]:
    """The summary object of ``run`` (see the module docstring); ``identity`` comes from the config."""
    parts = run.parts
    counters, slots, trainer = parts.rollouts.counters, parts.rollouts.slots, parts.trainer
    wall = run.wall_seconds
    groups = _async_groups(run) if run.mode == "async" else _sync_groups(run)
    trained = groups["trained_groups"]
    summary: dict[str, Any] = {
        **identity,
        "outcome": "completed" if run.completed else "failed",
        "stop_reason": run.stop_reason,
        "error": None if run.error is None else f"{type(run.error).__name__}: {run.error}",
        "steps": run.steps_trained,
        "wall_seconds": wall,
        **groups,
        "zero_variance_fraction": counters.zero_variance_groups / max(counters.returned_groups, 1),
        "trained_groups_per_hour": trained / wall * 3600 if wall > 0 else None,
        "rollout_idle_fraction": slots.engine_idle_seconds(wall) / wall if wall > 0 else None,
        "rollout_slot_idle_fraction": (
            1 - slots.busy_slot_seconds(wall) / (slots.num_slots * wall) if wall > 0 else None
        ),
        "trainer_idle_fraction": 1 - trainer.busy_seconds / wall if wall > 0 else None,
        "weight_sync_seconds": parts.rollouts.sync_seconds,
        "weight_sync_drain_seconds": parts.rollouts.drain_seconds,
        "generation_wall_fraction": (
            run.sync_result.gen_seconds / wall if run.sync_result is not None and wall > 0 else None
        ),
    }
    if run.generation is not None:
        summary.update(run.generation.totals())
    summary["engine_generated_tokens"] = counters.generated_tokens
    histogram = run.meter.staleness if run.meter is not None else {}
    summary.update(staleness_stats(histogram))  # type: ignore[arg-type]
    summary["staleness_histogram"] = {str(k): histogram[k] for k in sorted(histogram)}
    summary["token_staleness_mean"] = run.meter.token_staleness_mean if run.meter is not None else None
    summary["final_unfiltered_reward"] = final_unfiltered_reward
    summary["final_success_logit"] = trainer.curve.success_logit(trainer.curve.latest_version)
    job = parts.workload.job
    if job is not None and isinstance(parts.rollouts, JobRollouts):
        engine = parts.rollouts.engine
        summary["job_fitted_constants"] = job.efficiency.model_dump()
        summary["generator_busy_fraction"] = (
            engine.replica_busy_seconds(wall) / (len(engine.replicas) * wall) if wall > 0 else None
        )
        summary["preemptions"] = engine.preemptions
    return {key: _rounded(value) for key, value in summary.items()}


def _async_groups(run: SimRun) -> dict[str, int]:
    assert run.controller is not None
    fates = run.controller.fates
    by_resolution = fates.by_resolution
    counters = run.parts.rollouts.counters
    ledger = run.controller.ledger
    records = [*ledger.history, *ledger.pending()]
    return {
        "attempts": fates.total,
        "generated_groups": counters.returned_groups,
        "filtered_groups": fates["filtered"],
        "trained_groups": fates["trained"],
        "lost_groups": sum(n for (_, resolution), n in by_resolution.items() if resolution in LOST_FOR_GOOD),
        "dropped_groups": sum(record.charged for record in records),
        "spare_substitutions": sum(n for (_, resolution), n in by_resolution.items() if resolution == "replaced"),
        "replaced_groups": sum(record.replaced for record in records),
        "evicted_groups": fates["evicted"],
        "aborted_groups": fates["aborted"],
        "failed_attempts": fates["failed"],
        "discarded_groups": 0,
        "pending_groups": fates["pending"],
        "unused_prompts": run.controller.rollout_pump.unused_prompts,
    }


def _sync_groups(run: SimRun) -> dict[str, int]:
    counters = run.parts.rollouts.counters
    result = run.sync_result
    filtered = result.filtered_groups if result else 0
    trained = result.trained_groups if result else 0
    discarded = result.discarded_groups if result else 0
    return {
        "attempts": counters.attempts,
        "generated_groups": counters.returned_groups,
        "filtered_groups": filtered,
        "trained_groups": trained,
        "lost_groups": 0,
        "dropped_groups": 0,
        "spare_substitutions": 0,
        "replaced_groups": 0,
        "evicted_groups": 0,
        "aborted_groups": 0,
        "failed_attempts": 0,
        "discarded_groups": discarded,
        "pending_groups": counters.returned_groups - filtered - trained - discarded,
        "unused_prompts": 0,
    }


def _rounded(value: Any) -> Any:  # Any: a JSON-like summary value, floats rounded
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value
