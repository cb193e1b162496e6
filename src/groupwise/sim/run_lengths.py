"""Completion lengths read from a real run (``groupwise plan --lengths-from RUN_DIR``), instead of assumed.

A run's ``metrics.jsonl`` gives each step's mean completion length of the trained rows,
``ℓ̄ₛ = perf/train_tokens / (ds/groups_trained · G)`` (``G`` from the run's ``config.yaml``). A least-squares line
``ℓ̄(s) = a + b·s`` over the run's steps gives the mean at its first and last step; the job model's lengths are
log-normal, whose mean is ``median · e^(σ²/2)``, so each mean becomes a median with the job's own spread
(``σ`` from ``lengths.p99_over_p50``, which the metrics do not give)::

    median_tokens = ℓ̄(s₀) / e^(σ²/2)      final_median_tokens = ℓ̄(s₁) / e^(σ²/2)      drift_steps = s₁ − s₀

(flat after the measured steps). The cap's truncation is ignored: with the cap far above the median, as a run
that is not cut short has it, it moves the mean little.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from groupwise.config import ConfigError, ConfigIssue, config_from_dict
from groupwise.sim.workload import lognormal_sigma

if TYPE_CHECKING:
    from groupwise.config import RunConfig
    from groupwise.config.job_schema import JobLengthsSection

OPTION = "--lengths-from"


def step_mean_lengths(run_dir: Path) -> list[tuple[int, float]]:
    """``(step, mean completion length of its trained rows)`` for each step of ``run_dir`` that trained rows."""
    metrics, config = run_dir / "metrics.jsonl", run_dir / "config.yaml"
    missing = [p for p in (metrics, config) if not p.is_file()]
    if missing:
        raise _refused(run_dir, f"{', '.join(str(p) for p in missing)} not found: a run directory holds both")
    group = yaml.safe_load(config.read_text(encoding="utf-8"))["grpo"]["num_generations_per_prompt"]
    means = []
    for line in metrics.read_text(encoding="utf-8").splitlines():
        row = json.loads(line) if line.strip() else {}
        tokens, groups = row.get("perf/train_tokens"), row.get("ds/groups_trained")
        if tokens and groups and "step" in row:
            means.append((int(row["step"]), tokens / (groups * group)))
    if not means:
        raise _refused(run_dir, f"{metrics} has no step with perf/train_tokens and ds/groups_trained")
    return means


def fitted_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``(a, b)`` of ``y = a + b·x`` (``b = 0`` with a single ``x``)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = 0.0 if sxx == 0 else sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def lengths_from_run(run_dir: Path, lengths: JobLengthsSection) -> JobLengthsSection:
    """``lengths`` with the median, its drift and the drift's steps read from ``run_dir`` (module docstring)."""
    means = step_mean_lengths(run_dir)
    a, b = fitted_line(means)
    first, last = means[0][0], means[-1][0]
    spread = math.exp(lognormal_sigma(lengths.p99_over_p50) ** 2 / 2)
    start, end = max(1.0, (a + b * first) / spread), max(1.0, (a + b * last) / spread)
    return lengths.model_copy(update={
        "median_tokens": start, "final_median_tokens": end if last > first else None,
        "drift_steps": max(1, last - first),
    })  # fmt: skip


def _refused(run_dir: Path, rule: str) -> ConfigError:
    return ConfigError([ConfigIssue(OPTION, str(run_dir), rule, "pass the directory of a run that trained at least "
                                    "one step (it holds config.yaml and metrics.jsonl), or leave the option out "
                                    "to plan with the assumed sim.job.lengths")])  # fmt: skip


def with_run_lengths(cfg: RunConfig, run_dir: Path) -> RunConfig:
    """``cfg`` with ``sim.job.lengths`` read from ``run_dir`` (:func:`lengths_from_run`), validated again."""
    job = cfg.sim.job
    if job is None:
        return cfg  # no job to plan: groupwise plan refuses it with its own issue
    data = cfg.model_dump(mode="json", by_alias=True)
    data["sim"]["job"]["lengths"] = lengths_from_run(run_dir, job.lengths).model_dump(mode="json")
    return config_from_dict(data)
