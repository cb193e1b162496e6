"""``groupwise plan --lengths-from RUN_DIR``: completion lengths read from a run's metrics (docs/simulator.md).

Invariants pinned:
- each step's mean completion length is perf/train_tokens ÷ (ds/groups_trained × G), G from the run's config;
- a least-squares line through them gives the first and last step's mean, each turned into a log-normal median
  with the job's spread (mean = median · e^(σ²/2)), the drift over the run's steps;
- the plan says where its lengths come from; a directory without metrics.jsonl or config.yaml is refused with
  exit 2 naming --lengths-from, before anything is simulated;
- with assumed lengths the plan shows the fastest async setting's speed-up over sync with the medians halved,
  as assumed and doubled (the ×1 figure is the table's at the same steps; a factor past the cap is left out).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_plan import plan_data

from groupwise.cli.main import main
from groupwise.config import ConfigError, config_from_dict
from groupwise.config.job_schema import JobLengthsSection
from groupwise.sim.plan import run_plan
from groupwise.sim.plan_sensitivity import scaled_lengths, speedup_by_length
from groupwise.sim.run_lengths import fitted_line, lengths_from_run
from groupwise.sim.workload import lognormal_sigma


def write_run(run_dir: Path, means: list[float], group: int = 4) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(f"grpo:\n  num_generations_per_prompt: {group}\n")
    lines = [json.dumps({"step": s + 1, "perf/train_tokens": mean * 3 * group, "ds/groups_trained": 3})
             for s, mean in enumerate(means)]  # fmt: skip
    lines.insert(1, json.dumps({"step": 1, "eval/accuracy": 0.5}))  # an eval line: no lengths
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run_dir


def test_the_median_and_its_drift_are_read_from_the_run(tmp_path):
    run = write_run(tmp_path / "run", [100.0 + 10.0 * s for s in range(11)])  # mean 100 → 200 over steps 1..11
    lengths = lengths_from_run(run, JobLengthsSection(p99_over_p50=4.0, max_tokens=4096))
    spread = math.exp(lognormal_sigma(4.0) ** 2 / 2)
    assert lengths.median_tokens == pytest.approx(100.0 / spread)
    assert lengths.final_median_tokens == pytest.approx(200.0 / spread)
    assert lengths.drift_steps == 10 and lengths.p99_over_p50 == 4.0
    flat = lengths_from_run(write_run(tmp_path / "one", [300.0]), JobLengthsSection(p99_over_p50=4.0))
    assert flat.median_tokens == pytest.approx(300.0 / spread) and flat.final_median_tokens is None
    assert fitted_line([(1, 2.0), (2, 3.0), (3, 4.0)]) == pytest.approx((1.0, 1.0))


def test_the_plan_says_its_lengths_come_from_the_run(tmp_path, capsys):
    run = write_run(tmp_path / "run", [150.0, 170.0, 190.0])
    data = plan_data(tmp_path, samplers=["ready_first"], partial_rollouts=["continue"])
    path = tmp_path / "job.json"
    path.write_text(json.dumps(data))
    assert main(["plan", str(path), "--out", str(tmp_path / "out"), "--lengths-from", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"Lengths: median and drift read from {run}" in out and "If the lengths are off" not in out
    assert main(["plan", str(path), "--out", str(tmp_path / "out")]) == 0
    assert "If the lengths are off: async ready_first" in capsys.readouterr().out


def test_the_speedup_over_a_range_of_lengths(tmp_path):
    data = plan_data(tmp_path, samplers=["ready_first"], partial_rollouts=["continue"], rollout_fractions=[0.5],
                     screen_steps=None)
    cfg = config_from_dict(data)
    sync, fastest = run_plan(cfg)
    by_length = speedup_by_length(cfg, sync.point, fastest.point, steps=4)
    assert by_length[1.0] == fastest.speedup and set(by_length) == {0.5, 1.0, 2.0}
    assert scaled_lengths(cfg, 2.0).sim.job.lengths.median_tokens == 400
    assert scaled_lengths(cfg, 6.0) is None  # a median of 1,200 past the 1,024-token cap


def test_a_directory_that_is_not_a_run_is_refused(tmp_path, capsys):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(plan_data(tmp_path)))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["plan", str(path), "--out", str(tmp_path / "out"), "--lengths-from", str(empty)]) == 2
    err = capsys.readouterr().err
    assert "--lengths-from" in err and "metrics.jsonl" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError):
        lengths_from_run(write_run(tmp_path / "blank", []), JobLengthsSection())
