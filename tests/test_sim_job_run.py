"""``groupwise simulate`` with the job model (``sim.job``): still the real loops, their files and their checks.

Invariants pinned:
- a simulated job writes fates that pass ``groupwise audit``, in both modes, and the same seed gives the same files;
- the summary names the fitted constants the run used (``job_fitted_constants``, equal to ``sim.job.efficiency``);
- the simulator drives the real samplers: changing a sampler's selection changes the simulated run;
- sync colocated: generation, training and the weight sync strictly in turn (the step is their sum);
- partial rollouts on: completions span weight versions (token staleness below group staleness) and a sync pauses the
  replicas (with ``partial_rollout_kv: recompute`` they also re-prefill, which takes longer than ``keep``);
- bad job settings are refused before anything runs, every one at once with its key: the toy cost keys, colocated
  async, replicas that do not divide the GPUs, a sequence that cannot fit a replica's memory, a plan without a job;
- the resolved config of a run without ``sim.job`` has no ``job`` or ``plan`` key (configs written before the job
  model resolve as before).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from groupwise.cli.main import main
from groupwise.config import ConfigError, config_from_dict
from groupwise.controller.samplers.ready_first import ReadyFirstSampler
from groupwise.controller.settings import ControllerSettings
from groupwise.sim.run import simulate
from groupwise.sim.simulation import simulate_async
from groupwise.sim.workload import SimWorkload

JOB = {
    "model": {"params": 1.5e9, "layers": 28, "hidden": 1536, "kv_heads": 2, "head_dim": 128},
    "cluster": {"gpu": "H100", "rollout_gpus": 2, "train_gpus": 2, "max_seqs_per_replica": 64},
    "lengths": {"prompt_tokens": 100, "median_tokens": 300, "p99_over_p50": 6.0, "max_tokens": 2048},
}


def job_config(tmp_path: Path, name: str, mode: str = "async", job: dict | None = None, **sections):
    data: dict = {
        "mode": mode, "model": {"source": "tiny"}, "logging": {"tensorboard": False},
        "run": {"name": name, "output_dir": str(tmp_path), "max_steps": 8, "seed": 0},
        "grpo": {"num_prompts_per_step": 16, "num_generations_per_prompt": 4},
        "sim": {"num_prompts": 400, "job": {**JOB, **(job or {})}},
    }  # fmt: skip
    if mode == "async":
        data["loss"] = {"importance_sampling": True}
        data["async"] = {"sampler": {"name": "ready_first", "max_staleness_versions": 1},
                         "max_inflight_prompts": 32, "max_buffered_rollouts": 32}  # fmt: skip
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return config_from_dict(data)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_simulated_job_writes_fates_that_pass_the_audit_and_repeats_itself(tmp_path, mode, capsys):
    first = simulate(job_config(tmp_path, "a", mode))
    second = simulate(job_config(tmp_path, "b", mode))
    assert first.summary["outcome"] == "completed" and first.summary["steps"] == 8
    assert main(["audit", str(first.run_dir.path)]) == 0  # groupwise audit: every dispatched prompt has one fate
    for name in ("fates.jsonl", "metrics.jsonl", "sim/summary.json"):
        assert (first.run_dir.path / name).read_bytes() == (second.run_dir.path / name).read_bytes(), name
    assert first.summary["job_fitted_constants"] == job_config(tmp_path, "c", mode).sim.job.efficiency.model_dump()


def test_changing_a_sampler_changes_the_simulated_run(tmp_path, monkeypatch):
    before = simulate(job_config(tmp_path, "before")).summary
    # ready_first's gate one version tighter: a batch is admitted only once the trainer has caught up with it
    monkeypatch.setattr(ReadyFirstSampler, "admission_open", lambda self, version: self.dispatch_index < version)
    after = simulate(job_config(tmp_path, "after")).summary
    assert before["staleness_max"] >= 1 and after["staleness_max"] == 0
    assert after["wall_seconds"] > before["wall_seconds"]


def test_sync_colocated_alternates_generation_training_and_sync(tmp_path):
    cfg = job_config(tmp_path, "s", "sync", job={"cluster": {**JOB["cluster"], "rollout_gpus": 4, "train_gpus": 4,
                                                             "colocated": True}})  # fmt: skip
    result = simulate(cfg)
    metrics = [json.loads(line) for line in (result.run_dir.path / "metrics.jsonl").read_text().splitlines()]
    sync_s = result.run.parts.rollouts.costs.sync_s
    for i, m in enumerate(metrics):  # the loop also syncs version 0 before the first step
        syncs = 2 if i == 0 else 1
        assert m["perf/step_seconds"] == pytest.approx(m["perf/gen_seconds"] + m["perf/train_seconds"] + syncs * sync_s)


def test_partial_rollouts_span_versions_and_recomputing_the_cache_costs_time(tmp_path):
    runs = {}
    for kv in ("recompute", "keep"):
        cfg = job_config(tmp_path, kv, **{"async": {"partial_rollouts": "continue", "partial_rollout_kv": kv}},
                         run={"max_steps": 12})  # fmt: skip
        trained: list = []
        run = simulate_async(ControllerSettings.from_config(cfg), SimWorkload.from_config(cfg),
                             on_step_end=lambda step, metrics, groups, out=trained: out.extend(groups),
                             partial_rollouts=True, recompute_kv=kv == "recompute")  # fmt: skip
        runs[kv] = run.wall_seconds
        spanning = [g for g in trained if len(g.version_tokens) > 1]
        assert spanning, "some completions must span a weight sync"
        for g in spanning:
            assert g.version_tokens[0][0] == g.start_version
            assert sum(n for _, n in g.version_tokens) == pytest.approx(g.completion_tokens, abs=len(g.completions))
    assert runs["recompute"] > runs["keep"]


def test_bad_job_settings_are_refused_at_once_with_their_keys(tmp_path, capsys):
    cfg = job_config(tmp_path, "bad", sim={"per_token_s": 0.02, "straggler_rate": 0.1},
                     job={"cluster": {**JOB["cluster"], "colocated": True, "rollout_gpus": 3, "tensor_parallel": 2},
                          "lengths": {**JOB["lengths"], "max_tokens": 10**9}})  # fmt: skip
    with pytest.raises(ConfigError) as err:
        simulate(cfg)
    paths = [issue.path for issue in err.value.errors]
    assert paths == ["sim.per_token_s", "sim.straggler_rate", "sim.job.cluster.colocated",
                     "sim.job.cluster.train_gpus", "sim.job.cluster.rollout_gpus",
                     "sim.job.cluster.tensor_parallel", "sim.job.cluster.train_gpus"]  # fmt: skip
    assert "one longest sequence's activations do not fit" in err.value.errors[-1].fix  # a 10⁹-token sequence
    assert not (tmp_path / "bad").exists()
    plan_only = config_from_dict({"model": {"source": "tiny"}, "run": {"output_dir": str(tmp_path)},
                                  "sim": {"plan": {"windows": [1]}}})  # fmt: skip
    with pytest.raises(ConfigError) as err:
        simulate(plan_only)
    assert [issue.path for issue in err.value.errors] == ["sim.plan"]
    path = tmp_path / "bad.yaml"
    path.write_text("model: {source: tiny}\nsim:\n  job:\n    model: {params: 1.0e9, layers: 2, hidden: 64, "
                    "kv_heads: 1, head_dim: 8}\n    cluster: {gpu: X100, rollout_gpus: 1, train_gpus: 1}\n")
    assert main(["simulate", str(path), f"run.output_dir={tmp_path}"]) == 2
    assert "sim.job.cluster.gpu" in capsys.readouterr().err


def test_a_config_without_a_job_resolves_without_its_keys(tmp_path):
    cfg = config_from_dict({"model": {"source": "tiny"}})
    assert "job" not in cfg.to_yaml() and "plan" not in cfg.to_yaml()
    assert config_from_dict(json.loads(json.dumps(cfg.model_dump(mode="json", by_alias=True)))) == cfg
