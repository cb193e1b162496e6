"""``groupwise report`` (summary + plots of one or several runs) and ``groupwise compare`` (a side-by-side table).

Both read each run's ``metrics.jsonl`` and ``config.yaml`` (and ``sim/summary.json`` when a simulated run has
one) through :mod:`groupwise.run.run_stats` and write PNGs (:mod:`groupwise.run.plots`) into the FIRST run
directory's ``plots/``. Keys are those of ``docs/metrics.md``; a key a run never logged shows as ``—`` (sync runs
have no async accounting, real runs no simulator summary).

``sim/summary.json`` keys read here: ``rollout_idle_fraction`` and ``trainer_idle_fraction`` (0..1). Without
it the idle fractions come from the step mean of ``perf/rollout_idle_fraction`` / ``perf/trainer_idle_fraction``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from groupwise.run.plots import compare_plots, report_plots
from groupwise.run.run_stats import (
    GROUP_COUNT_KEYS,
    RunData,
    count,
    last,
    load_run,
    mean,
    series,
    summarize_run,
    total,
    weighted_mean,
)
from groupwise.run.rundir import RunDir, linked_entries, write_text_atomic

__all__ = ["compare_values", "fmt", "fmt_duration", "load_run", "run_compare", "run_report"]

MISSING = "—"
SUMMARY_COLUMNS = ("run", "steps", "start accuracy", "final accuracy", "best accuracy (step)",
                   "zero-variance fraction", "groups generated", "groups trained", "wall time")


def compare_values(run: RunData) -> dict[str, Any]:
    """The ``groupwise compare`` column of one run: row label → raw value (None when unknown)."""
    records, cfg = run.records, run.config
    mode = cfg.get("mode")
    sampler = cfg.get("async", {}).get("sampler", {}) if mode == "async" else {}
    knobs = ", ".join(f"{k}={v}" for k, v in sorted(sampler.items()) if k != "name")
    ds = cfg.get("grpo", {}).get("dynamic_sampling", {}).get("enabled")
    trained = total(records, "ds/groups_trained")
    wall = total(records, "perf/step_seconds")
    sim = run.sim_summary or {}
    return {
        "mode": mode,
        "sampler": sampler.get("name"),
        "knobs": knobs or None,
        "dynamic sampling": None if ds is None else ("on" if ds else "off"),
        "seed": cfg.get("run", {}).get("seed"),
        "steps": max((r["step"] for r in records), default=0),
        **{f"groups {label}": count(total(records, key)) for label, key in GROUP_COUNT_KEYS.items()},
        "trained groups/h": trained / wall * 3600 if trained is not None and wall else None,
        "rollout idle fraction": sim.get("rollout_idle_fraction", mean(records, "perf/rollout_idle_fraction")),
        "trainer idle fraction": sim.get("trainer_idle_fraction", mean(records, "perf/trainer_idle_fraction")),
        "staleness mean": weighted_mean(records, "staleness/mean", "ds/groups_trained"),
        "staleness max": count(max(series(records, "staleness/max")[1], default=None)),
        "tokens generated": count(total(records, "waste/generated_tokens")),
        "tokens wasted": count(total(records, "waste/tokens")),
        "wasted share of tokens": last(records, "waste/cumulative_fraction"),
        "generation seconds wasted": total(records, "waste/gen_seconds"),
        "final reward (unfiltered)": last(records, "reward/unfiltered_mean"),
        "final reward (trained)": last(records, "reward/trained_mean"),
        "final eval accuracy": last(records, "eval/accuracy"),
    }


def fmt(value: object, digits: int = 3) -> str:
    """Table cell: ``—`` for None, floats with ``digits`` decimals, anything else (ints, names) as is."""
    if value is None:
        return MISSING
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return MISSING
    total_s = int(round(seconds))
    return f"{total_s // 3600}:{total_s % 3600 // 60:02d}:{total_s % 60:02d}"


def summary_cells(run: RunData) -> list[str]:
    """The report's summary row of one run, in :data:`SUMMARY_COLUMNS` order."""
    s = summarize_run(run)
    acc = s.accuracy
    if acc is None:
        accuracy_cells = [MISSING] * 3
    else:
        accuracy_cells = [fmt(acc.start), fmt(acc.final), f"{acc.best:.3f} (step {acc.best_step})"]
    cells = [s.name, str(s.steps), *accuracy_cells]
    return cells + [fmt(s.zero_variance_fraction), fmt(s.groups_generated), fmt(s.groups_trained),
                    fmt_duration(s.wall_seconds)]


# --- commands --------------------------------------------------------------------------------
def run_report(run_dirs: Sequence[str | Path]) -> Path:
    """Write ``report.md`` and ``plots/*.png`` into the first run dir (runs overlaid); return report.md's path."""
    runs = _load_runs(run_dirs)
    first = runs[0].run_dir
    _plots_dir(first)
    plots = report_plots(runs, first.plots_dir)
    lines = ["# groupwise report", "", f"Runs: {', '.join(r.name for r in runs)}", "", "## Summary", ""]
    lines += ["| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "---|" * len(SUMMARY_COLUMNS)]
    for run in runs:
        lines.append("| " + " | ".join(summary_cells(run)) + " |")
    lines += ["", "Start / final accuracy: the first and last held-out evaluation (step 0 is the policy before "
              "training); zero-variance fraction is over all generated groups; wall time is the sum of step times.",
              ""]
    for title, filename, nothing_to_show in plots:
        if filename is None:
            lines += [f"## {title}", "", nothing_to_show, ""]
        else:
            lines += [f"## {title}", "", f"![{title}](plots/{filename})", ""]
    missing_g = [r.name for r in runs if r.group_size is None]
    if missing_g:
        names = ", ".join(missing_g)
        lines.append(f"Left out of per-sample plots (no grpo.num_generations_per_prompt in config.yaml): {names}")
    write_text_atomic(first.report_path, "\n".join(lines).rstrip() + "\n")
    return first.report_path


def run_compare(run_dirs: Sequence[str | Path]) -> str:
    """A markdown table with one column per run (see :func:`compare_values`); also writes ``plots/compare_*.png``
    into the first run dir. Returns the table."""
    runs = _load_runs(run_dirs)
    columns = [compare_values(run) for run in runs]
    lines = ["| | " + " | ".join(run.name for run in runs) + " |", "|---|" + "---|" * len(runs)]
    for label in columns[0]:
        lines.append(f"| {label} | " + " | ".join(fmt(column[label]) for column in columns) + " |")
    first = runs[0].run_dir
    plots = _plots_dir(first)
    written = [name for name in compare_plots(runs, plots) if name is not None]
    lines += ["", f"plots in {plots}/: " + (", ".join(written) if written else "none (nothing to show)")]
    return "\n".join(lines) + "\n"


def _plots_dir(run_dir: RunDir) -> Path:
    """``plots/`` of the run directory, made when missing; a link there (or in it) is refused, never written
    through (a report writes only inside the run directory)."""
    links = [run_dir.plots_dir] if run_dir.plots_dir.is_symlink() else linked_entries(run_dir.plots_dir)
    if links:
        raise ValueError(f"{links[0]} is a symbolic link; groupwise report writes only inside the run directory, "
                         "never through a link: remove the link")
    run_dir.plots_dir.mkdir(parents=True, exist_ok=True)
    return run_dir.plots_dir


def _load_runs(run_dirs: Sequence[str | Path]) -> list[RunData]:
    if not run_dirs:
        raise ValueError("no run directories given; pass one or more runs/<name> directories")
    return [load_run(path) for path in run_dirs]
