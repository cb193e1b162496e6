"""The simulator's model of partial rollouts (``async.partial_rollouts``) and of a weight sync that drains the engine
(``sim.weight_sync_drains``).

Invariants pinned:
- token timing: a completion's k-th token is produced at start + prefill + k · per_token; a switch splits its
  tokens there (a token produced at the switch belongs to the version before it);
- with partial rollouts on, a long completion that spans a weight sync yields tokens of two versions, split where
  the sync ended, and its group says so (``version_tokens``); with them off every token is of ``start_version``;
- with partial rollouts on, a sync does not wait for the completions in flight; with ``weight_sync_drains`` (off)
  it waits until every booked completion has ended;
- partial rollouts change which version produced a token, nothing of the schedule: with a flat learning curve
  (every version equally good) a run with them on writes the same fates and metrics as one with them off;
- on the long-tailed workload, partial rollouts raise throughput over a draining sync, back to the throughput
  of a sync that overlaps generation;
- a draining sync with partial rollouts on, or in mode sync, is a config error naming the key; ``groupwise
  train`` refuses ``partial_rollouts: continue`` (the engine does not do it) before any work.
"""

from __future__ import annotations

import asyncio

import pytest
from test_sim_run import sim_config

from groupwise.config import ConfigError
from groupwise.data.loader import LoadedPrompt
from groupwise.run.fates_file import read_fates
from groupwise.run.metrics import read_metrics
from groupwise.sim.run import simulate
from groupwise.sim.simulated_rollouts import SimulatedRollouts
from groupwise.sim.token_timing import tokens_by, version_counts
from groupwise.sim.variates import VariateStream
from groupwise.sim.virtual_time import run_in_virtual_time
from groupwise.sim.workload import LearningCurve, SimWorkload
from groupwise.types import Prompt


def test_tokens_are_produced_one_per_step_after_the_prefill_and_a_switch_splits_them():
    # start 1.0, prefill 0.5, 0.25 s per token, 10 tokens: token k at 1.5 + 0.25 k, the last at 4.0
    assert [tokens_by(t, 1.0, 0.5, 0.25, 10) for t in (0.0, 1.49, 1.5, 1.75, 2.0, 2.01, 4.0, 9.0)] == [
        0, 0, 0, 1, 2, 2, 10, 10]  # fmt: skip
    assert tokens_by(1.5, 1.0, 0.5, 0.0, 10) == 10  # no per-token time: all at the end of the prefill
    assert version_counts(1.0, 0.5, 0.25, 10, 3, [(2.0, 4)]) == [(3, 2), (4, 8)]
    assert version_counts(1.0, 0.5, 0.25, 10, 3, [(0.5, 4), (2.0, 5), (3.0, 6), (5.0, 7)]) == [(4, 2), (5, 4), (6, 4)]
    assert version_counts(1.0, 0.5, 0.25, 10, 3, []) == [(3, 10)]


def one_long_rollout(partial_rollouts: bool, drains: bool = False):
    """One group of two 100-token completions (1 s per token), and a weight sync that starts 30 s in."""
    workload = SimWorkload(group_size=2, rollout_slots=4, length_median_tokens=100, length_p99_over_p50=1.0,
                           prefill_s=0.0, per_token_s=1.0, weight_sync_s=5.0, weight_sync_drains=drains)  # fmt: skip
    curve = LearningCurve(-1.0, 2000.0)
    rollouts = SimulatedRollouts(workload, curve, {"sim/0": 0.0}, VariateStream(0, 100, 0.0),
                                 partial_rollouts=partial_rollouts)  # fmt: skip
    item = LoadedPrompt(Prompt(uid="sim/0", answer="", text="sim/0"), epoch=0, index_in_epoch=0)
    synced: list[float] = []

    async def main():
        generation = asyncio.ensure_future(rollouts.rollout(item, 0, 0, 0))
        await asyncio.sleep(30.0)
        curve.record_step(16)
        await rollouts.sync_weights(1)
        synced.append(asyncio.get_running_loop().time())
        return await generation

    group, _ = run_in_virtual_time(main, 1e6)
    return group, synced[0]


def test_a_long_generation_spanning_a_weight_sync_yields_tokens_of_two_versions():
    group, synced_at = one_long_rollout(partial_rollouts=True)
    assert synced_at == 35.0  # the sync did not wait for the generation
    # the update reached the completions when the sync ended (35 s): 35 tokens of version 0, 65 of version 1
    assert group.version_tokens == ((0, 2 * 35), (1, 2 * 65))
    assert group.start_version == 0 and group.end_version == 1 and group.completion_tokens == 200
    plain, synced_at = one_long_rollout(partial_rollouts=False)
    assert plain.version_tokens == () and synced_at == 35.0  # off: every token of version 0, no waiting
    drained, synced_at = one_long_rollout(partial_rollouts=False, drains=True)
    assert synced_at == 105.0  # waited until the completions ended at 100 s, then 5 s of sync


def test_partial_rollouts_change_token_versions_but_not_the_schedule(tmp_path):
    flat = {"learning_rate_groups": 1e15}  # every version as good as the first: rewards cannot change
    off = simulate(sim_config(tmp_path, "off", grpo={"dynamic_sampling": {"enabled": True}},
                              sim={"length_p99_over_p50": 8.0, **flat}))  # fmt: skip
    on = simulate(sim_config(tmp_path, "on", grpo={"dynamic_sampling": {"enabled": True}},
                             sim={"length_p99_over_p50": 8.0, **flat},
                             **{"async": {"sampler": {"name": "ready_first", "max_staleness_versions": 1},
                                          "partial_rollouts": "continue"}}))  # fmt: skip
    assert read_fates(on.run_dir.path / "fates.jsonl") == read_fates(off.run_dir.path / "fates.jsonl")
    assert read_metrics(on.run_dir.path / "metrics.jsonl") == read_metrics(off.run_dir.path / "metrics.jsonl")
    # ... while the trained tokens did come from newer versions than their groups' start
    assert on.summary["token_staleness_mean"] < off.summary["token_staleness_mean"]
    assert on.summary["staleness_mean"] == off.summary["staleness_mean"]


def long_tail(tmp_path, name: str, **sections):
    sim = {"rollout_slots": 32, "length_median_tokens": 64, "length_p99_over_p50": 8.0, "per_token_s": 0.01,
           "train_s_per_token": 0.0002, "num_prompts": 800}  # fmt: skip
    return simulate(sim_config(tmp_path, name, run={"max_steps": 30}, grpo={"dynamic_sampling": {"enabled": True}},
                               **{"sim": {**sim, **sections.pop("sim", {})}}, **sections))  # fmt: skip


def test_on_the_long_tailed_workload_partial_rollouts_raise_throughput_over_a_draining_sync(tmp_path):
    drained = long_tail(tmp_path, "drain", sim={"weight_sync_drains": True})
    overlapped = long_tail(tmp_path, "overlap")
    continued = long_tail(tmp_path, "continue", **{
        "async": {"sampler": {"name": "ready_first", "max_staleness_versions": 1}, "partial_rollouts": "continue"}})
    rate = {name: run.summary["trained_groups_per_hour"] for name, run in
            (("drain", drained), ("overlap", overlapped), ("continue", continued))}  # fmt: skip
    assert drained.summary["weight_sync_drain_seconds"] > 0 and continued.summary["weight_sync_drain_seconds"] == 0
    assert rate["continue"] > 1.2 * rate["drain"], rate
    assert rate["continue"] == pytest.approx(rate["overlap"], rel=0.02), rate  # same timing; rewards may differ
    assert drained.summary["trainer_idle_fraction"] > continued.summary["trainer_idle_fraction"]


def test_a_draining_sync_where_nothing_can_drain_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as with_partial:
        long_tail(tmp_path, "a", sim={"weight_sync_drains": True}, **{
            "async": {"sampler": {"name": "ready_first", "max_staleness_versions": 1},
                      "partial_rollouts": "continue"}})  # fmt: skip
    assert "sim.weight_sync_drains" in str(with_partial.value) and "partial_rollouts" in str(with_partial.value)
    with pytest.raises(ConfigError) as in_sync:
        simulate(sim_config(tmp_path, "s", mode="sync", sim={"weight_sync_drains": True}))
    assert "sim.weight_sync_drains" in str(in_sync.value) and "mode sync" in str(in_sync.value)
    assert not (tmp_path / "a").exists() and not (tmp_path / "s").exists()


def test_training_refuses_partial_rollouts_before_any_work(tmp_path):
    from groupwise.trainer.preflight import partial_rollout_issues

    cfg = sim_config(tmp_path, "t", **{"async": {"sampler": {"name": "ready_first", "max_staleness_versions": 1},
                                                 "partial_rollouts": "continue"}})  # fmt: skip
    (issue,) = partial_rollout_issues(cfg)
    assert issue.path == "async.partial_rollouts" and "groupwise simulate" in issue.fix
    assert partial_rollout_issues(sim_config(tmp_path, "u")) == []
