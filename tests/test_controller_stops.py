"""How an async run stops: never a silent hang at the end of data, never a ``trained`` fate without its step.

Pinned:
- weight_fifo (window 1, P = 2, DS off, ``replace``, 4 reserve prompts, 10 prompts) with one data failure that is
  retried under a newer version: the end-of-data spare-pool drain parks at the gate with every slot settled, and
  the run stops with ``ControllerStalled`` naming the per-version buffer — in virtual time well inside its bound,
  instead of hanging (the rollout pump parking wakes the train pump, which re-runs its stall check);
- the same class in the simulator (the configuration that used to run to the 10^7-virtual-second bound) stops
  with ``ControllerStalled`` after 3 steps;
- a custom gated sampler that closes short at exhaustion and keeps the spare pool finishes: its partial last
  batch waits in the pool, the drain dispatches whole steps first and the leftover last, as one short step;
- ``trained`` is written only after the step's optimizer step: a step that failed after selection leaves its
  selected groups ``pending`` with a detail naming the step and the error, and the fate counts (the simulator's
  ``trained_groups`` included) equal the groups of the steps that were stepped;
- a ``RolloutExhaustedError`` with selectable ready groups fewer than the open slots says exactly that (not that
  the sampler cannot select them); a ``StepBelowFloorError`` raised while a dispatch slot charges its loss carries
  a note naming the prompt, its group and attempt, its target step and the step being assembled;
- the weight_fifo config warning is earned: with 2 % of simulated attempts failing (infra, retried once), 5 of 5
  weight_fifo runs stall before 50 steps with replace or shrink, while ready_first finishes all 5.
"""

from __future__ import annotations

import pytest
from fakes import Outcome, RecordingTrainer, ScriptedRollouts, make_loader, run_virtual
from fakes.settings import controller_settings, failure_settings

from groupwise.config import config_from_dict, sampler_config
from groupwise.controller.controller import build_controller
from groupwise.controller.ledger import StepBelowFloorError
from groupwise.controller.settings import ControllerSettings
from groupwise.controller.train_pump import ControllerStalled, RolloutExhaustedError
from groupwise.sim.simulation import simulate_async
from groupwise.sim.summary import summarize
from groupwise.sim.workload import SimWorkload

G = 2


def weight_fifo_settings() -> ControllerSettings:
    failure = failure_settings(
        on_dropped_prompt="replace",
        max_replacement_attempts=1,
        replacement_reserve_prompts=4,
        max_data_attempts_per_prompt=2,
        min_step_batch_fraction=0.5,
    )
    return controller_settings(
        prompts_per_step=2, group_size=G, sampler=sampler_config("weight_fifo", max_staleness_versions=1),
        dynamic_sampling=False, max_buffered_rollouts=16, failure=failure,
    )  # fmt: skip


def test_weight_fifo_end_of_data_drain_stalls_loudly_instead_of_hanging():
    # p0's first attempt fails after 2 s and is retried: its group lands in the newer version's bucket.
    script = {"p0": [Outcome(2.0, fail="data"), Outcome(1.0)]}
    fates = []
    controller = build_controller(
        weight_fifo_settings(), make_loader(10), ScriptedRollouts(G, script=script), RecordingTrainer(),
        on_fate=fates.append,
    )  # fmt: skip
    with pytest.raises(ControllerStalled, match=r"per_start_weight=\{0: '1 ready/1 slots', 1: '3 ready/3 slots'\}"):
        run_virtual(controller.run, timeout=1_000.0)
    assert controller.rollout_pump.active_slots == 0 and len(controller.ctx.spare_pool) == 2
    # Every reserved slot still has exactly one fate.
    reserved = list(range(controller.ctx.buffer.next_slot_id))
    assert sorted(r.group_id for r in fates if r.group_id is not None) == reserved


ISSUE_SIM_CONFIG = {
    "mode": "async",
    "model": {"source": "tiny"},
    "loss": {"importance_sampling": True},
    "sim": {"rollout_slots": 32, "length_median_tokens": 32, "length_p99_over_p50": 4.0},
}
ISSUE_SIM_OVERRIDES = [
    "run.seed=407244", "grpo.num_prompts_per_step=14", "grpo.num_generations_per_prompt=8",
    "grpo.dynamic_sampling.enabled=false", "async.sampler.name=weight_fifo", "async.sampler.max_staleness_versions=3",
    "async.max_buffered_rollouts=83", "async.max_inflight_prompts=140", "async.min_groups_for_streaming_train=5",
    "async.rollout_failure.on_dropped_prompt=replace", "async.rollout_failure.max_replacement_attempts=1",
    "async.rollout_failure.replacement_reserve_prompts=27", "async.rollout_failure.min_step_batch_fraction=0.25",
    "async.rollout_failure.max_infra_attempts_per_prompt=2", "async.rollout_failure.max_data_attempts_per_prompt=2",
    "async.rollout_failure.max_skipped_prompts=1000", "async.rollout_failure.max_consecutive_dropped_prompts=1000",
    "async.rollout_failure.backoff_base_s=0.5", "async.rollout_failure.max_backoff_s=2.0",
    "sim.data_failure_rate=0.02", "sim.initial_success_logit=-3.0", "sim.difficulty_spread=3.0",
    "sim.train_s_per_token=0.0001", "sim.num_prompts=66", "run.max_epochs=2", "run.max_steps=11",
]


def test_simulated_weight_fifo_stall_ends_with_a_named_error_and_honest_counts():
    cfg = config_from_dict(ISSUE_SIM_CONFIG, ISSUE_SIM_OVERRIDES)
    fates = []
    run = simulate_async(
        ControllerSettings.from_config(cfg), SimWorkload.from_config(cfg), max_epochs=cfg.run.max_epochs,
        on_fate=fates.append, max_virtual_seconds=cfg.sim.max_virtual_seconds,
    )  # fmt: skip
    assert isinstance(run.error, ControllerStalled), run.error
    assert run.steps_trained == 3 and run.wall_seconds < 100.0
    # Step 3 had groups selected when it stalled: they are pending, not trained; the summary agrees.
    summary = summarize(run, {}, None)
    assert summary["trained_groups"] == 3 * 14 == sum(1 for r in fates if r.fate == "trained")
    never_stepped = [r for r in fates if r.fate == "pending" and "optimizer step never ran" in r.detail]
    assert never_stepped and {r.step for r in never_stepped} == {3}
    assert all("step 3" in r.detail and "ControllerStalled" in r.detail for r in never_stepped)


def test_gated_closes_short_sampler_with_a_spare_pool_finishes_with_a_short_last_step():
    failure = failure_settings(on_dropped_prompt="replace", max_replacement_attempts=1, replacement_reserve_prompts=2,
                              min_step_batch_fraction=0.25)  # fmt: skip
    settings = controller_settings(
        prompts_per_step=2, group_size=G,
        sampler=sampler_config("custom", target="fakes.samplers:GatedClosesShort", kwargs={"window": 0}),
        dynamic_sampling=False, max_buffered_rollouts=16, failure=failure,
    )  # fmt: skip
    trainer = RecordingTrainer()
    controller = build_controller(settings, make_loader(5), ScriptedRollouts(G), trainer)
    summary = run_virtual(controller.run, timeout=1_000.0)
    # p2, p3 went to the pool, then the partial batch p4; the drain trains p2+p3, then p4 alone (closed short).
    assert summary.stop_reason == "exhausted"
    assert trainer.uids_per_step() == {0: ["p0", "p1"], 1: ["p2", "p3"], 2: ["p4"]}
    assert [rec.unfilled for rec in controller.ledger.history] == [0, 0, 1]


class FailingOptimizerStep(RecordingTrainer):
    async def finish_step(self, step):
        if step == 1:
            raise RuntimeError("optimizer step of step 1 failed")
        return await super().finish_step(step)


def test_groups_of_a_step_whose_optimizer_step_failed_are_pending_not_trained():
    settings = controller_settings(prompts_per_step=2, group_size=G, dynamic_sampling=False,
                                  sampler=sampler_config("in_order", max_lookahead_versions=1))  # fmt: skip
    fates = []
    trainer = FailingOptimizerStep()
    controller = build_controller(settings, make_loader(12), ScriptedRollouts(G), trainer, on_fate=fates.append)
    with pytest.raises(RuntimeError, match="optimizer step of step 1 failed"):
        run_virtual(controller.run)
    trained = [r for r in fates if r.fate == "trained"]
    assert [r.step for r in trained] == [0, 0] and controller.fates["trained"] == 2
    step_one = set(trainer.chunks[-1].group_ids)
    assert trainer.chunks[-1].step == 1 and len(step_one) == 2
    untrained = [r for r in fates if r.group_id in step_one]
    assert [(r.fate, r.step) for r in untrained] == [("pending", 1), ("pending", 1)]
    assert all("selected for step 1, whose optimizer step never ran" in r.detail for r in untrained)
    assert all("RuntimeError: optimizer step of step 1 failed" in r.detail for r in untrained)


def test_exhaustion_with_selectable_groups_fewer_than_the_open_slots_says_so():
    # p2 and p4 fail for good (data, skipped) and shrink the steps being assembled, so the last step is short.
    script = {
        "p0": [Outcome(3.0)], "p1": [Outcome(7.0)], "p2": [Outcome(0.5, fail="data")], "p3": [Outcome(3.0)],
        "p4": [Outcome(1.0, fail="data")], "p5": [Outcome(7.0)],
    }  # fmt: skip
    failure = failure_settings(on_dropped_prompt="shrink", max_data_attempts_per_prompt=1, max_skipped_prompts=5,
                              min_step_batch_fraction=0.25)  # fmt: skip
    settings = controller_settings(prompts_per_step=2, group_size=G, dynamic_sampling=False,
                                  sampler=sampler_config("weight_fifo", max_staleness_versions=1),
                                  max_buffered_rollouts=16, failure=failure)  # fmt: skip
    controller = build_controller(settings, make_loader(6), ScriptedRollouts(G, script=script), RecordingTrainer())
    with pytest.raises(RolloutExhaustedError) as info:
        run_virtual(controller.run)
    message = str(info.value)
    assert "only 1 ready group(s) are left for its 2 open slot(s)" in message
    assert "cannot select" not in message and "selects none" not in message


def test_a_loss_that_breaks_the_floor_names_its_prompt_and_steps():
    failure = failure_settings(on_dropped_prompt="shrink", max_data_attempts_per_prompt=1, max_skipped_prompts=5,
                              min_step_batch_fraction=1.0)  # fmt: skip
    settings = controller_settings(prompts_per_step=2, group_size=G, dynamic_sampling=False,
                                  sampler=sampler_config("in_order", max_lookahead_versions=0),
                                  failure=failure)  # fmt: skip
    script = {"p1": [Outcome(1.0, fail="data")]}
    controller = build_controller(settings, make_loader(4), ScriptedRollouts(G, script=script), RecordingTrainer())
    with pytest.raises(StepBelowFloorError, match="step 0 lost 1 of its 2") as info:
        run_virtual(controller.run)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "prompt 'p1' (group 1, attempt 0, target step 0) while step 0 was being assembled" in notes


@pytest.mark.parametrize("on_dropped", ["replace", "shrink"])
def test_the_weight_fifo_warning_is_earned_it_stalls_where_ready_first_finishes(on_dropped):
    # The evidence behind the config warning (docs/samplers.md): 2 % of attempts failing, retried once.
    outcomes = {}
    for sampler in ("weight_fifo", "ready_first"):
        for seed in range(5):
            workload = SimWorkload(group_size=4, seed=seed, rollout_slots=16, length_median_tokens=32,
                                   infra_failure_rate=0.02, num_prompts=2000)  # fmt: skip
            failure = failure_settings(on_dropped_prompt=on_dropped, min_step_batch_fraction=0.5,
                                      max_skipped_prompts=1000, max_consecutive_dropped_prompts=1000,
                                      max_infra_attempts_per_prompt=2, backoff_base_s=0.5, max_backoff_s=2.0,
                                      replacement_reserve_prompts=8 if on_dropped == "replace" else 1)  # fmt: skip
            settings = controller_settings(prompts_per_step=8, group_size=4, dynamic_sampling=False,
                                          sampler=sampler_config(sampler, max_staleness_versions=1),
                                          max_buffered_rollouts=32, failure=failure, max_steps=50)  # fmt: skip
            run = simulate_async(settings, workload)
            outcomes[sampler, seed] = type(run.error).__name__ if run.error else run.stop_reason
    assert all(outcomes["weight_fifo", seed] == "ControllerStalled" for seed in range(5)), outcomes
    assert all(outcomes["ready_first", seed] == "max_steps" for seed in range(5)), outcomes
