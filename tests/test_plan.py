"""``groupwise plan``: a job's grid of settings simulated and ranked (docs/simulator.md, "groupwise plan").

Invariants pinned:
- the grid is every combination of the async settings per GPU split, plus one colocated sync point on all the GPUs;
  splits are whole replicas with at least one replica and one training GPU;
- each point is the job's config with the documented keys replaced, and validates like any config; a plan of S
  steps for a run of more scales the length drift and the learning curve by S / run.max_steps;
- the table has one row per point, the sync row's speed-up is 1, exactly one row is the best and it has the highest
  speed-up; the rows do not depend on ``--jobs``;
- the CLI writes plan.md, plan.json (one entry per row) and plan.png (whose window axis has whole windows only,
  one window included), and a config without ``sim.job`` is refused
  with exit 2 naming the key;
- ``sim.job.lengths.max_tokens`` below the median completion length (or the drifted final median) is refused with
  exit 2 naming it, before anything is simulated; one below the prompt length alone is a warning (a long prompt may
  have a short answer) that says the cap is the completion's, not the sequence's;
- the shipped plans (examples/plan) load and have the grid their comments describe;
- ``config check`` accepts and refuses the same job configs as ``plan`` (the shipped plans, a job with partial
  rollouts, a completion cap below the median), since a job config's model, task and reward are never loaded;
- a job whose trainer cannot hold the model on all its GPUs is refused (70B dense on 8 H100), naming the GPU
  count and the GPUs that would; a grid point whose split cannot is a failed row, not simulated; a KL penalty
  (``loss.kl_coef``) makes the reference model count;
- the sync point may have its own tensor-parallel size and memory fraction (``sim.plan.sync_*``), checked like
  the job's (a size that does not divide its GPUs is refused, naming the point);
- the screen (``sim.plan.screen_steps``) passes the sync and the fastest async points on; a finalist's row is the
  full grid's row and the best point is the full grid's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from groupwise.cli.main import main
from groupwise.config import ConfigError, config_from_dict, load_config
from groupwise.sim.plan import PlanPoint, mark, plan_points, point_config, run_plan, split_gpus
from groupwise.sim.plan_plot import window_ticks

ROOT = Path(__file__).resolve().parents[1]
JOB = {
    "model": {"params": 1.5e9, "layers": 28, "hidden": 1536, "kv_heads": 2, "head_dim": 128},
    "cluster": {"gpu": "H100", "rollout_gpus": 2, "train_gpus": 2, "max_seqs_per_replica": 64},
    "lengths": {"prompt_tokens": 100, "median_tokens": 200, "p99_over_p50": 4.0, "max_tokens": 1024},
}


def plan_data(tmp_path: Path, **plan) -> dict:
    return {
        "mode": "async", "model": {"source": "tiny"}, "logging": {"tensorboard": False},
        "run": {"name": "p", "output_dir": str(tmp_path), "max_steps": 4, "seed": 0},
        "grpo": {"num_prompts_per_step": 8, "num_generations_per_prompt": 4},
        "loss": {"importance_sampling": True}, "async": {"max_buffered_rollouts": 16},
        "sim": {"num_prompts": 400, "job": JOB, "plan": {"samplers": ["in_order", "windowed"], "windows": [1],
                                                           "rollout_fractions": [0.25, 0.75], **plan}},
    }  # fmt: skip


def test_the_grid_and_what_each_point_sets(tmp_path):
    cfg = config_from_dict(plan_data(tmp_path))
    points = plan_points(cfg)
    assert points[0] == PlanPoint("sync", 4, 4)
    assert len(points) == 1 + 2 * 2 * 2  # splits × samplers × partial rollouts (one window)
    assert {(p.rollout_gpus, p.train_gpus) for p in points[1:]} == {(1, 3), (3, 1)}
    assert split_gpus(8, 0.9, 4) == (4, 4) and split_gpus(8, 0.01, 2) == (2, 6)
    sync = point_config(cfg, points[0])
    assert sync.mode == "sync" and sync.sim.job.cluster.colocated and sync.sim.job.cluster.train_gpus == 4
    windowed_off = point_config(cfg, PlanPoint("async", 3, 1, "windowed", 2, "off"))
    assert windowed_off.async_.sampler.max_staleness_versions == 2
    assert windowed_off.async_.rollout_failure.on_dropped_prompt == "shrink" and windowed_off.sim.weight_sync_drains
    assert windowed_off.async_.max_buffered_rollouts == 8 * 3
    assert windowed_off.async_.max_inflight_prompts == 24  # ⌈3 replicas × 64 / 4⌉ = 48, at most the buffer
    in_order = point_config(cfg, PlanPoint("async", 1, 3, "in_order", 1, "continue"))
    assert in_order.async_.sampler.max_lookahead_versions == 1 and in_order.async_.partial_rollouts == "continue"
    assert not in_order.sim.weight_sync_drains and in_order.async_.max_inflight_prompts == 16


def test_the_table_ranks_the_points_and_does_not_depend_on_jobs(tmp_path):
    cfg = config_from_dict(plan_data(tmp_path, samplers=["ready_first"], rollout_fractions=[0.5]))
    rows = run_plan(cfg)
    assert len(rows) == 3 and all(r.error is None and r.steps == 4 for r in rows)
    assert rows[0].point.mode == "sync" and rows[0].speedup == pytest.approx(1.0)
    best = [r for r in rows if r.best]  # a star only when one mode beats the other by more than the band
    assert len(best) <= 1 and all(b.speedup == max(r.speedup for r in rows) for b in best)
    for r in rows:
        assert r.step_seconds > 0 and 0 < r.generator_utilisation <= 1 and r.trained_tokens_per_s > 0
    parallel = run_plan(cfg, jobs=2)
    assert [(r.step_seconds, r.best) for r in parallel] == [(r.step_seconds, r.best) for r in rows]
    mark(rows, band=0.0)
    (best,) = [r for r in rows if r.best]
    assert best.speedup == max(r.speedup for r in rows)


def test_the_cli_writes_the_table_json_and_plot(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(plan_data(tmp_path, samplers=["ready_first"], rollout_fractions=[0.5],
                                         partial_rollouts=["continue"])))  # fmt: skip
    out = tmp_path / "out"
    assert main(["plan", str(path), "--out", str(out)]) == 0
    table, notes = capsys.readouterr().out.strip().split("\n\n")
    lines = table.splitlines()
    assert len(lines) == 4 and lines[1].startswith("|---")  # header, rule, two rows
    assert notes.startswith("Verdict: ") and "Lengths: assumed" in notes and "the GPU H100 is outside" in notes
    rows = json.loads((out / "plan.json").read_text())
    stars = sum(r["best"] for r in rows)
    assert [r["mode"] for r in rows] == ["sync", "async"] and stars <= 1
    assert (out / "plan.md").read_text().count("★") == stars and (out / "plan.png").stat().st_size > 0
    assert notes in (out / "plan.md").read_text().replace("\n\n", "\n")


def test_a_plan_needs_a_job(tmp_path, capsys):
    path = tmp_path / "nojob.yaml"
    path.write_text("model: {source: tiny}\n")
    assert main(["plan", str(path)]) == 2
    assert "sim.job" in capsys.readouterr().err
    with pytest.raises(ConfigError):
        plan_points(load_config(path))


@pytest.mark.parametrize(
    "lengths, words",
    [({"max_tokens": 150}, "median_tokens = 200"),
     ({"max_tokens": 300, "final_median_tokens": 400}, "final_median_tokens = 400"),
     ({"max_tokens": 50}, "median_tokens = 200")],
)
def test_a_completion_cap_below_the_median_is_refused(tmp_path, capsys, lengths, words):
    data = plan_data(tmp_path)
    data["sim"]["job"] = {**JOB, "lengths": {**JOB["lengths"], **lengths}}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(data))  # JSON is YAML
    assert main(["plan", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "sim.job.lengths.max_tokens" in err and words in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_completion_cap_below_the_prompt_length_alone_is_a_warning(tmp_path):
    data = plan_data(tmp_path)
    data["sim"]["job"] = {**JOB, "lengths": {**JOB["lengths"], "prompt_tokens": 2000, "max_tokens": 1024}}
    (warning,) = [w for w in config_from_dict(data).warnings() if w.path == "sim.job.lengths.max_tokens"]
    assert "below the prompt length" in warning.rule and "caps the completion alone" in warning.rule
    assert not [w for w in config_from_dict(plan_data(tmp_path)).warnings() if w.path.startswith("sim.")]


@pytest.mark.parametrize("name,points", [("math_7b_32.yaml", 37), ("math_7b_128.yaml", 37), ("qwen_1p5b_8.yaml", 37)])
def test_the_shipped_plans_load_with_their_grids(name, points):
    cfg = load_config(ROOT / "examples" / "plan" / name)
    grid = plan_points(cfg)
    assert len(grid) == points and grid[0].mode == "sync"
    assert cfg.run.max_steps == 1000 and cfg.grpo.num_prompts_per_step == 512
    point_config(cfg, grid[-1])


def test_a_plan_compresses_the_run_into_its_simulated_steps(tmp_path):
    data = plan_data(tmp_path, steps=10)
    data["run"]["max_steps"] = 1000
    data["sim"]["learning_rate_groups"] = 5000.0
    data["sim"]["job"] = {**JOB, "lengths": {**JOB["lengths"], "final_median_tokens": 400.0, "drift_steps": 500}}
    point = point_config(config_from_dict(data), PlanPoint("sync", 4, 4))
    assert point.run.max_steps == 10 and point.sim.job.lengths.drift_steps == 5
    assert point.sim.learning_rate_groups == pytest.approx(50.0)
    data["sim"]["plan"]["steps"] = None
    assert point_config(config_from_dict(data), PlanPoint("sync", 4, 4)).run.max_steps == 1000


def test_the_screen_passes_the_fastest_on_and_ranks_like_the_full_grid(tmp_path):
    data = plan_data(tmp_path, steps=6, screen_steps=2, finalists=2)
    data["run"]["max_steps"] = 6
    screened = run_plan(config_from_dict(data))
    data["sim"]["plan"]["screen_steps"] = None
    full = run_plan(config_from_dict(data))
    final = [r for r in screened if not r.screened]
    assert len(screened) == len(full) == 9 and len(final) == 3 and final[0].point.mode == "sync"
    assert all(r.steps == 2 for r in screened if r.screened) and all(r.steps == 6 for r in final)
    by_point = {r.point: r for r in full}
    for r in final:  # a finalist's row is the full grid's row
        assert (r.step_seconds, r.speedup) == (by_point[r.point].step_seconds, by_point[r.point].speedup)
    fastest = max(final, key=lambda r: r.speedup).point
    assert fastest == max(full, key=lambda r: r.speedup).point and fastest.mode == "async"
    assert [r.best for r in screened] == [r.best for r in full]  # the same star (or none)


@pytest.mark.parametrize("name", ["math_7b_32.yaml", "math_7b_128.yaml", "qwen_1p5b_8.yaml"])
def test_config_check_accepts_the_shipped_plans(name, capsys):
    assert main(["config", "check", str(ROOT / "examples" / "plan" / name)]) == 0
    assert "checked as groupwise plan checks it" in capsys.readouterr().out


def test_config_check_and_plan_accept_and_refuse_the_same_jobs(tmp_path, capsys):
    data = plan_data(tmp_path)
    data["async"]["partial_rollouts"] = "continue"  # no continuous batching: a simulation needs none
    path = tmp_path / "job.json"
    path.write_text(json.dumps(data))
    assert main(["config", "check", str(path)]) == 0
    run_plan(load_config(path))
    data["sim"]["job"] = {**JOB, "lengths": {**JOB["lengths"], "max_tokens": 150}}
    data["sim"]["num_prompts"] = 4
    path.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["config", "check", str(path)]) == 2
    checked = capsys.readouterr().err
    assert main(["plan", str(path), "--out", str(tmp_path / "out")]) == 2
    planned = capsys.readouterr().err
    for err in (checked, planned):
        assert "sim.job.lengths.max_tokens" in err and "raise sim.num_prompts (now 4)" in err


LLAMA_70B = {"params": 70e9, "layers": 80, "hidden": 8192, "kv_heads": 8, "head_dim": 128}


def test_a_model_its_gpus_cannot_train_is_refused(tmp_path, capsys):
    data = plan_data(tmp_path)
    data["sim"]["job"] = {**JOB, "model": LLAMA_70B,
                          "cluster": {**JOB["cluster"], "rollout_gpus": 4, "train_gpus": 4, "tensor_parallel": 4}}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(data))
    assert main(["plan", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "sim.job.cluster.train_gpus: got 8" in err and "cannot train a 70.0B-parameter model" in err
    assert "train on at least 16 H100 GPUs or a GPU with more memory (B200, GB200 at 8)" in err
    assert main(["config", "check", str(path)]) == 2


def test_a_split_whose_trainer_cannot_hold_the_model_is_a_failed_row(tmp_path):
    data = plan_data(tmp_path, samplers=["ready_first"], partial_rollouts=["continue"], rollout_fractions=[0.75])
    data["sim"]["job"] = {**JOB, "model": {**JOB["model"], "params": 12e9},  # 12B: 192 GB of state
                          "cluster": {**JOB["cluster"], "gpu": "H200"}}
    cfg = config_from_dict(data)
    rows = run_plan(cfg)  # sync trains on 4 GPUs (48 GB each); the 3:1 split on one (192 GB)
    assert rows[0].error is None and rows[0].steps == 4
    assert rows[1].point.train_gpus == 1 and rows[1].steps == 0 and "training does not fit" in rows[1].error
    data["loss"]["kl_coef"] = 0.1
    data["model"]["reference"] = "initial"
    assert "and a reference model" in run_plan(config_from_dict(data))[1].error


def test_the_sync_point_has_its_own_tensor_parallel_and_memory_fraction(tmp_path, capsys):
    data = plan_data(tmp_path, sync_tensor_parallel=2, sync_memory_fraction=0.5)
    data["sim"]["job"] = {**JOB, "cluster": {**JOB["cluster"], "memory_fraction": 0.8}}
    cfg = config_from_dict(data)
    sync, async_ = (point_config(cfg, p) for p in plan_points(cfg)[:2])
    assert (sync.sim.job.cluster.tensor_parallel, sync.sim.job.cluster.memory_fraction) == (2, 0.5)
    assert (async_.sim.job.cluster.tensor_parallel, async_.sim.job.cluster.memory_fraction) == (1, 0.8)
    data["sim"]["plan"]["sync_tensor_parallel"] = 3  # 4 GPUs are not replicas of 3
    path = tmp_path / "job.json"
    path.write_text(json.dumps(data))
    assert main(["config", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "sim.job.cluster.rollout_gpus" in err and "at plan point 'sync, colocated on 4 GPUs'" in err


def test_the_plot_window_axis_has_whole_windows_only():
    assert window_ticks([1.0, 1.0]) == [1]
    assert window_ticks([2.0, 0.0, 1.0]) == [0, 1, 2]
