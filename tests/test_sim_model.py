"""The simulator's model: lengths, engine slots, learning curve, simulated generator and learner.

Invariants pinned:
- completion lengths have the configured median and p99/p50 ratio (log-normal with σ = ln(r) / z₀.₉₉);
- engine slots are first come, first served: a completion waits for the slot that frees first, so a request
  ends at the hand-computed time; busy slot-seconds and engine-idle seconds are exact at any query time;
- the learning curve adds 1 logit per ``learning_rate_groups`` groups with variance, and refuses future versions;
- the simulated generator's correct-completion rate is ``sigmoid(logit − difficulty)``; its infra and data
  failure rates match the configuration and are classified infra / data by the controller; a straggler attempt
  takes exactly ``straggler_factor`` times as long; a group reports its simulated tokens;
- the simulated learner takes ``tokens × train_s_per_token`` per chunk, counts only groups with variance toward
  the learning curve, and refuses calls out of order;
- the same seed draws the same workload; another seed draws another.
"""

from __future__ import annotations

import asyncio
import math
import statistics

import pytest

from groupwise.chunks import step_chunk
from groupwise.config import GrpoSection
from groupwise.controller.failures import classify_failure
from groupwise.data.loader import LoadedPrompt
from groupwise.sim.simulated_learner import SimulatedTrainer, TrainerProtocolError
from groupwise.sim.simulated_rollouts import SimulatedDataFailure, SimulatedInfraFailure, SimulatedRollouts
from groupwise.sim.slots import EngineSlots
from groupwise.sim.variates import VariateStream
from groupwise.sim.virtual_time import SimulationTimeout, run_in_virtual_time
from groupwise.sim.workload import LearningCurve, SimWorkload, lognormal_sigma, make_sim_prompts, sigmoid


def test_lengths_have_the_configured_median_and_tail_ratio():
    stream = VariateStream(seed=3, length_median=200.0, length_sigma=lognormal_sigma(8.0))
    lengths = sorted(stream.lengths(200_000))
    p50, p99 = lengths[len(lengths) // 2], lengths[int(len(lengths) * 0.99)]
    assert p50 == pytest.approx(200, rel=0.02)
    assert p99 / p50 == pytest.approx(8.0, rel=0.05)
    assert min(lengths) >= 1


def test_ratio_one_means_every_completion_has_the_median_length():
    stream = VariateStream(seed=0, length_median=37.0, length_sigma=lognormal_sigma(1.0))
    assert set(stream.lengths(1000)) == {37}


def test_slots_are_first_come_first_served_and_accounting_is_exact():
    slots = EngineSlots(2)
    assert slots.book(0.0, [4.0, 2.0]) == 4.0  # both slots start at once
    assert slots.book(1.0, [3.0]) == 5.0  # waits for the slot freed at 2, runs 2..5
    assert slots.busy_slot_seconds(1.0) == pytest.approx(2.0)  # two slots busy during [0, 1]
    assert slots.busy_slot_seconds(3.0) == pytest.approx(3.0 + 2.0 + 1.0)
    assert slots.busy_slot_seconds(10.0) == pytest.approx(9.0)
    assert slots.engine_idle_seconds(5.0) == 0.0
    assert slots.book(8.0, [1.0]) == 9.0  # the engine was idle from 5 to 8
    assert slots.engine_idle_seconds(12.0) == pytest.approx(3.0 + 3.0)
    with pytest.raises(ValueError, match="time order"):
        slots.book(7.0, [1.0])


def test_a_request_larger_than_the_engine_queues_its_own_completions():
    slots = EngineSlots(1)
    assert slots.book(0.0, [1.0, 2.0, 3.0]) == 6.0


def test_learning_curve_gains_one_logit_per_learning_rate_groups():
    curve = LearningCurve(initial_success_logit=-2.0, learning_rate_groups=100)
    assert curve.success_logit(0) == -2.0
    curve.record_step(50)
    curve.record_step(150)
    assert curve.success_logit(1) == pytest.approx(-1.5)
    assert curve.success_logit(2) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="does not exist yet"):
        curve.success_logit(3)


def _rollouts(**overrides) -> tuple[SimulatedRollouts, list, dict]:
    workload = SimWorkload(group_size=overrides.pop("group_size", 4), **overrides)
    prompts, difficulty = make_sim_prompts(workload)
    curve = LearningCurve(workload.initial_success_logit, workload.learning_rate_groups)
    return SimulatedRollouts(workload, curve, difficulty), prompts, difficulty


def _attempts(rollouts: SimulatedRollouts, prompts: list, n: int) -> list:
    """Run ``n`` attempts one after the other; each entry is (group or error, virtual seconds taken)."""

    async def main():
        loop = asyncio.get_running_loop()
        out = []
        for i in range(n):
            started = loop.time()
            try:
                result = await rollouts.rollout(LoadedPrompt(prompts[i % len(prompts)], 0, i), i, 0, 0)
            except Exception as error:  # noqa: BLE001 — the outcome under test
                result = error
            out.append((result, loop.time() - started))
        return out

    return run_in_virtual_time(main, 1e9)[0]


def test_correct_rate_follows_the_success_logit_and_difficulty():
    rollouts, prompts, difficulty = _rollouts(num_prompts=1, initial_success_logit=0.7, length_p99_over_p50=1.0)
    outcomes = _attempts(rollouts, prompts, 3000)
    rewards = [r for group, _ in outcomes for r in group.raw_rewards]
    expected = sigmoid(0.7 - difficulty[prompts[0].uid])
    assert statistics.fmean(rewards) == pytest.approx(expected, abs=0.02)
    assert set(rewards) <= {0.0, 1.0}


def test_failure_rates_and_their_classification():
    rollouts, prompts, _ = _rollouts(infra_failure_rate=0.2, data_failure_rate=0.25)
    outcomes = [result for result, _ in _attempts(rollouts, prompts, 4000)]
    infra = [e for e in outcomes if isinstance(e, SimulatedInfraFailure)]
    data = [e for e in outcomes if isinstance(e, SimulatedDataFailure)]
    assert len(infra) / 4000 == pytest.approx(0.2, abs=0.025)
    assert len(data) / (4000 - len(infra)) == pytest.approx(0.25, abs=0.025)  # scored only if it did not crash
    assert classify_failure(infra[0]) == "infra" and classify_failure(data[0]) == "data"
    assert rollouts.counters.infra_failures == len(infra) and rollouts.counters.data_failures == len(data)


def test_a_straggler_takes_exactly_straggler_factor_times_as_long():
    plain, prompts, _ = _rollouts(rollout_slots=64, straggler_rate=0.0)
    slow, _, _ = _rollouts(rollout_slots=64, straggler_rate=1.0, straggler_factor=3.0)
    fast_times = [t for _, t in _attempts(plain, prompts, 50)]
    slow_times = [t for _, t in _attempts(slow, prompts, 50)]  # same seed: the same lengths
    assert slow_times == pytest.approx([3.0 * t for t in fast_times], rel=1e-6)
    assert slow.counters.stragglers == 50 and plain.counters.stragglers == 0


def test_an_attempt_takes_prefill_plus_its_longest_completion_and_reports_its_tokens():
    rollouts, prompts, _ = _rollouts(rollout_slots=8, prefill_s=0.5, per_token_s=0.01)
    (group, seconds), = _attempts(rollouts, prompts, 1)
    lengths = VariateStream(0, 256.0, lognormal_sigma(8.0)).lengths(4)  # the same stream, seeded alike
    assert group.num_completion_tokens == sum(lengths)
    assert seconds == pytest.approx(0.5 + max(lengths) * 0.01)


def test_same_seed_same_workload_other_seed_other_workload():
    def rewards(seed: int) -> list[list[float]]:
        rollouts, prompts, _ = _rollouts(seed=seed)
        return [group.raw_rewards for group, _ in _attempts(rollouts, prompts, 30)]

    assert rewards(5) == rewards(5)
    assert rewards(5) != rewards(6)
    assert make_sim_prompts(SimWorkload(group_size=2, seed=1))[1] != make_sim_prompts(SimWorkload(group_size=2))[1]


def test_learner_time_and_learning_signal():
    rollouts, prompts, _ = _rollouts(initial_success_logit=0.0, difficulty_spread=0.0, train_s_per_token=0.001)
    groups = [group for group, _ in _attempts(rollouts, prompts, 40)]
    trainer = SimulatedTrainer(rollouts.workload, rollouts.curve)

    async def step():
        loop = asyncio.get_running_loop()
        await trainer.train_chunk(0, step_chunk(groups[:25], GrpoSection()), True)
        await trainer.train_chunk(0, step_chunk(groups[25:], GrpoSection()), False)
        metrics = await trainer.finish_step(0)
        return metrics, loop.time()

    (metrics, seconds), _ = run_in_virtual_time(step, 1e9)
    tokens = sum(g.num_completion_tokens for g in groups)
    with_variance = sum(1 for g in groups if len(set(g.raw_rewards)) > 1)
    assert seconds == pytest.approx(tokens * 0.001)
    assert metrics["perf/train_tokens"] == tokens
    assert rollouts.curve.signal_groups(1) == with_variance < len(groups)  # zero-variance groups teach nothing


def test_learner_refuses_calls_out_of_order():
    workload = SimWorkload(group_size=2)
    trainer = SimulatedTrainer(workload, LearningCurve(0.0, 10.0))

    async def finish_without_chunk():
        await trainer.finish_step(0)

    with pytest.raises(TrainerProtocolError, match="open step is None"):
        run_in_virtual_time(finish_without_chunk, 10.0)


def test_bad_workload_names_every_problem():
    with pytest.raises(ValueError, match="rollout_slots must be >= 1.*straggler_rate must be a probability"):
        SimWorkload(group_size=2, rollout_slots=0, straggler_rate=1.5)


def test_virtual_time_bound_names_the_limit():
    async def forever():
        await asyncio.Event().wait()

    with pytest.raises(SimulationTimeout, match="still going after 500 virtual seconds"):
        run_in_virtual_time(forever, 500.0)


def test_virtual_time_is_virtual():
    async def long_sleep():
        await asyncio.sleep(86_400.0)
        return "done"

    result, ended = run_in_virtual_time(long_sleep, 1e6)
    assert result == "done" and math.isclose(ended, 86_400.0)
