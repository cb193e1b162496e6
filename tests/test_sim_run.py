"""``groupwise simulate``: a config in, a run directory out, deterministic for a seed.

Invariants pinned:
- the run directory holds config.yaml, metrics.jsonl (one line per optimizer step, steps 1..N, known keys only),
  events.log, fates.jsonl (one line per dispatched attempt) and sim/summary.json, whose counts agree with the
  metrics and the fates;
- the same config and seed give byte-identical summary.json, metrics.jsonl and fates.jsonl; another seed does not;
- sync mode alternates strictly: with instant weight syncs, trainer idle time equals generation time;
  async overlaps them and trains the same groups in less virtual time;
- in_order with lookahead 0, full batches and dynamic sampling off trains the same prompts per step as sync
  (invariant 9 in docs/design.md, here under simulated timing);
- the learning curve moves the zero-variance mix: mostly all-wrong groups early, all-right groups late; once
  too few groups carry a signal, a sync run under ``stop_when_exhausted`` ends completed (``no_signal``) where
  the same run without it fails at the same step with ``DynamicSamplingExhausted``;
- a run that stops with a named error still writes its summary (outcome failed, the error named) and the CLI
  exits 1; failures injected into a sync simulation are a config error (exit 2) naming the key;
- a simulated dataset smaller than one generation round (``sim.num_prompts`` 3 for 16 prompts per step, sync
  and async) is refused as ``train`` refuses it (exit 2, ``grpo.num_prompts_per_step`` and ``sim.num_prompts``
  named, no run directory); exactly one round's worth runs;
- ``groupwise compare`` reads the simulator's idle fractions;
- a multi-turn job (``episode.environment`` or a harness) is refused by ``simulate`` and ``plan`` naming the key
  (exit 2, no run directory), never simulated as if it were single-turn.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from groupwise.cli.main import main
from groupwise.config import ConfigError, config_from_dict
from groupwise.run.fates_file import read_fates
from groupwise.run.metric_keys import METRIC_KEYS
from groupwise.run.metrics import read_metrics
from groupwise.run.report import compare_values, load_run
from groupwise.sim.run import simulate

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = {"rollout_slots": 16, "length_median_tokens": 40, "per_token_s": 0.01, "train_s_per_token": 0.0005,
            "num_prompts": 400}  # fmt: skip


def sim_config(tmp_path: Path, name: str, mode: str = "async", sampler: dict | None = None, **sections):
    data: dict = {
        "mode": mode,
        "model": {"source": "tiny"},
        "run": {"name": name, "output_dir": str(tmp_path), "max_steps": 12, "seed": 0},
        "logging": {"tensorboard": False},
        "grpo": {"num_prompts_per_step": 8, "num_generations_per_prompt": 4},
        "sim": dict(WORKLOAD),
    }
    if mode == "async":
        data["loss"] = {"importance_sampling": True}
        data["async"] = {"sampler": sampler or {"name": "ready_first", "max_staleness_versions": 1}}
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return config_from_dict(data)


def test_async_run_writes_a_consistent_run_directory(tmp_path):
    result = simulate(sim_config(tmp_path, "a", sim={"infra_failure_rate": 0.05}, **{
        "async": {"sampler": {"name": "ready_first", "max_staleness_versions": 1},
                  "rollout_failure": {"max_consecutive_dropped_prompts": 5}}}))  # fmt: skip
    root = result.run_dir.path
    assert {p.name for p in root.iterdir()} >= {"config.yaml", "metrics.jsonl", "events.log", "fates.jsonl", "sim"}
    records = read_metrics(root / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 13))
    assert all(set(r) <= set(METRIC_KEYS) for r in records)
    summary = json.loads((root / "sim" / "summary.json").read_text())
    assert summary["outcome"] == "completed" and summary["steps"] == 12
    assert summary["trained_groups"] == 12 * 8 == sum(r["ds/groups_trained"] for r in records)
    fates = read_fates(root / "fates.jsonl")
    by_fate = Counter(line["fate"] for line in fates)
    assert summary["attempts"] == len(fates)
    assert summary["trained_groups"] == by_fate["trained"]
    assert summary["filtered_groups"] == by_fate["filtered"]
    assert summary["failed_attempts"] == by_fate["failed"] > 0
    scored = by_fate["trained"] + by_fate["filtered"]  # + buffered groups still pending at the end
    assert scored <= summary["generated_groups"] <= scored + by_fate["pending"]
    assert summary["wall_seconds"] == pytest.approx(sum(r["perf/step_seconds"] for r in records), abs=1e-5)
    assert 0 <= summary["rollout_idle_fraction"] <= 1 and 0 <= summary["trainer_idle_fraction"] <= 1
    histogram = {int(k): n for k, n in summary["staleness_histogram"].items()}
    assert sum(histogram.values()) == summary["trained_groups"] and min(histogram) >= 0


def test_same_seed_identical_files_other_seed_different(tmp_path):
    overrides = {"sim": {"straggler_rate": 0.1, "infra_failure_rate": 0.05},
                 "async": {"rollout_failure": {"max_consecutive_dropped_prompts": 5}}}  # fmt: skip
    first = simulate(sim_config(tmp_path, "first", **overrides)).run_dir.path
    second = simulate(sim_config(tmp_path, "second", **overrides)).run_dir.path
    other = simulate(sim_config(tmp_path, "other", run={"seed": 1}, **overrides)).run_dir.path
    for name in ("sim/summary.json", "metrics.jsonl", "fates.jsonl"):
        assert (first / name).read_bytes() == (second / name).read_bytes()
        assert (first / name).read_bytes() != (other / name).read_bytes()


def test_sync_alternates_strictly_and_async_overlaps(tmp_path):
    sim = {**WORKLOAD, "weight_sync_s": 0.0}
    sync = simulate(sim_config(tmp_path, "sync", mode="sync", sim=sim)).summary
    # Nothing overlaps in sync: the trainer idles exactly while the engine generates.
    assert sync["trainer_idle_fraction"] == pytest.approx(sync["generation_wall_fraction"], abs=1e-5)
    in_order = simulate(sim_config(tmp_path, "async", sampler={"name": "in_order", "max_lookahead_versions": 1},
                                   sim=sim)).summary  # fmt: skip
    assert in_order["steps"] == sync["steps"] == 12
    assert in_order["trained_groups_per_hour"] > 1.25 * sync["trained_groups_per_hour"]
    assert in_order["trainer_idle_fraction"] < sync["trainer_idle_fraction"]


def test_in_order_lookahead_zero_trains_the_sync_prompts_step_by_step(tmp_path):
    plain = {"grpo": {"dynamic_sampling": {"enabled": False}}}
    sync = simulate(sim_config(tmp_path, "sync", mode="sync", **plain)).run_dir.path
    lockstep = simulate(sim_config(
        tmp_path, "lockstep", sampler={"name": "in_order", "max_lookahead_versions": 0}, **plain,
        **{"async": {"rollout_failure": {"on_dropped_prompt": "shrink"}}},  # no spare pool: nothing is lost
    )).run_dir.path  # fmt: skip

    def per_step(root: Path) -> dict[int, list[str]]:
        steps: dict[int, list[str]] = {}
        for line in read_fates(root / "fates.jsonl"):
            if line["fate"] == "trained":
                steps.setdefault(line["step"], []).append(line["prompt_uid"])
        return {step: sorted(uids) for step, uids in steps.items()}

    assert per_step(sync) == per_step(lockstep)
    assert len(per_step(sync)) == 12


def test_learning_curve_turns_all_wrong_groups_into_all_right_groups(tmp_path):
    cfg = sim_config(tmp_path, "learn", run={"max_steps": 60}, grpo={"dynamic_sampling": {"enabled": False}},
                     sim={"learning_rate_groups": 60.0, "initial_success_logit": -2.5})  # fmt: skip
    records = read_metrics(simulate(cfg).run_dir.path / "metrics.jsonl")
    early, late = records[:10], records[-10:]

    def mean(rows, key):  # over the steps that measured it (an async step may tally no generated group)
        values = [r[key] for r in rows if r.get(key) is not None]
        return sum(values) / len(values)

    assert mean(early, "ds/zero_variance_min_fraction") > 0.3 > mean(late, "ds/zero_variance_min_fraction")
    assert mean(late, "ds/zero_variance_max_fraction") > 0.3 > mean(early, "ds/zero_variance_max_fraction")
    assert mean(late, "reward/unfiltered_mean") > mean(early, "reward/unfiltered_mean") + 0.4


def test_named_failure_is_reported_and_the_cli_exits_1(tmp_path, capsys):
    config = tmp_path / "fail.yaml"
    config.write_text(json.dumps({
        "mode": "async", "model": {"source": "tiny"}, "logging": {"tensorboard": False},
        "run": {"name": "fail", "output_dir": str(tmp_path), "max_steps": 20},
        "grpo": {"num_prompts_per_step": 4, "num_generations_per_prompt": 2},
        "loss": {"importance_sampling": True},
        "sim": {"data_failure_rate": 0.5, "rollout_slots": 8, "length_median_tokens": 10},
    }))  # fmt: skip  (JSON is YAML)
    assert main(["simulate", str(config)]) == 1
    err = capsys.readouterr().err
    assert "the simulated run failed: SimulatedDataFailure" in err
    summary = json.loads((tmp_path / "fail" / "sim" / "summary.json").read_text())
    assert summary["outcome"] == "failed" and summary["error"].startswith("SimulatedDataFailure")


def test_exhausted_data_ends_cleanly_or_with_a_named_error(tmp_path):
    cfg = sim_config(tmp_path, "short", run={"max_steps": 100, "max_epochs": 1}, sim={"num_prompts": 40})
    result = simulate(cfg)
    summary = result.summary
    assert summary["outcome"] == "completed" and summary["stop_reason"] == "exhausted"
    dispatched = {line["prompt_uid"] for line in read_fates(result.run_dir.path / "fates.jsonl")}
    assert len(dispatched) + summary["unused_prompts"] == 40  # every prompt of the one epoch, once
    assert summary["trained_groups"] == summary["steps"] * 8 - summary["dropped_groups"]


def test_failures_in_a_sync_simulation_are_a_config_error(tmp_path, capsys):
    cfg = sim_config(tmp_path, "sync-fail", mode="sync", sim={"infra_failure_rate": 0.1})
    with pytest.raises(ConfigError, match="sim.infra_failure_rate"):
        simulate(cfg)
    config = tmp_path / "sync.yaml"
    config.write_text("mode: sync\nmodel: {source: tiny}\nsim: {data_failure_rate: 0.2}\n")
    assert main(["simulate", str(config), f"run.output_dir={tmp_path}"]) == 2
    assert "sim.data_failure_rate" in capsys.readouterr().err


@pytest.mark.parametrize(("key", "value"), [("environment", "calculator"), ("harness", "agent.py:run")])
def test_a_multi_turn_job_is_refused_by_simulate_and_plan_naming_the_key(tmp_path, capsys, key, value):
    with pytest.raises(ConfigError, match=f"episode.{key}") as refused:
        simulate(sim_config(tmp_path, "episodes", episode={key: value}))
    assert "single-turn completions" in str(refused.value) and not (tmp_path / "episodes").exists()
    plan = ROOT / "examples" / "plan" / "qwen_1p5b_8.yaml"
    assert main(["plan", str(plan), f"episode.{key}={value}", f"run.output_dir={tmp_path}"]) == 2
    assert f"episode.{key}" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_dataset_smaller_than_one_step_is_refused(tmp_path, capsys, mode):
    config = tmp_path / "small.yaml"
    config.write_text(f"mode: {mode}\nmodel: {{source: tiny}}\nloss: {{importance_sampling: true}}\n"
                      "grpo: {num_prompts_per_step: 16, dynamic_sampling: {enabled: false}}\n"
                      f"run: {{name: small, output_dir: {tmp_path}, max_steps: 2}}\n"
                      "logging: {tensorboard: false}\nsim: {num_prompts: 3}\n")
    assert main(["simulate", str(config)]) == 2
    err = capsys.readouterr().err
    assert "grpo.num_prompts_per_step" in err and "the training set holds only 3 prompts" in err
    assert "raise sim.num_prompts (now 3)" in err and "Traceback" not in err
    assert not (tmp_path / "small").exists()
    assert main(["simulate", str(config), "sim.num_prompts=16"]) == 0


def test_virtual_time_bound_is_a_named_failure(tmp_path):
    summary = simulate(sim_config(tmp_path, "bounded", sim={"max_virtual_seconds": 30.0})).summary
    assert summary["outcome"] == "failed" and summary["error"].startswith("SimulationTimeout")
    assert summary["wall_seconds"] == 30.0


def test_compare_reads_the_simulator_idle_fractions(tmp_path):
    runs = [simulate(sim_config(tmp_path, "s", mode="sync")), simulate(sim_config(tmp_path, "a"))]
    for result in runs:
        column = compare_values(load_run(result.run_dir.path))
        assert column["rollout idle fraction"] == result.summary["rollout_idle_fraction"]
        assert column["trainer idle fraction"] == result.summary["trainer_idle_fraction"]
        assert column["groups trained"] == result.summary["trained_groups"]
    assert main(["compare", *(str(r.run_dir.path) for r in runs)]) == 0


def test_a_sync_run_without_signal_left_stops_as_finished_under_stop_when_exhausted(tmp_path):
    ds = {"batch_multiplier": 2.0, "max_gen_rounds": 2, "min_step_batch_fraction": 0.5}
    learns_fast = {"learning_rate_groups": 10.0, "initial_success_logit": 0.0}
    stops = simulate(sim_config(tmp_path, "stops", mode="sync", run={"max_steps": 200}, sim=learns_fast,
                                grpo={"dynamic_sampling": {**ds, "stop_when_exhausted": True}})).summary  # fmt: skip
    assert stops["outcome"] == "completed" and stops["stop_reason"] == "no_signal"
    assert 0 < stops["steps"] < 200 and stops["error"] is None
    fails = simulate(sim_config(tmp_path, "fails", mode="sync", run={"max_steps": 200}, sim=learns_fast,
                                grpo={"dynamic_sampling": ds})).summary  # fmt: skip
    assert fails["outcome"] == "failed" and fails["error"].startswith("DynamicSamplingExhausted")
    assert fails["steps"] == stops["steps"]  # the same run up to the step that could not be filled
