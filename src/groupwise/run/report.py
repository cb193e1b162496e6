"""``groupwise report`` (summary + plots of one or several runs) and ``groupwise compare`` (a side-by-side table).

Both read each run's ``metrics.jsonl`` and ``config.yaml`` (and ``sim/summary.json`` when a simulated run has
one) and write PNGs into the FIRST run directory's ``plots/``. Keys are those of ``docs/metrics.md``; a key a
run never logged shows as ``—`` (sync runs have no async accounting, real runs no simulator summary).

``sim/summary.json`` keys read here: ``rollout_idle_fraction`` and ``trainer_idle_fraction`` (0..1). Without
it the idle fractions come from the step mean of ``perf/rollout_idle_fraction`` / ``perf/trainer_idle_fraction``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from groupwise.run.metrics import read_metrics
from groupwise.run.rundir import RunDir, write_text_atomic

MISSING = "—"
SUMMARY_COLUMNS = ("run", "steps", "final accuracy", "best accuracy", "zero-variance fraction", "groups generated",
                   "groups trained", "wall time")
FATE_KEYS = {
    "trained": "ds/groups_trained",
    "filtered": "ds/groups_filtered",
    "dropped": "accounting/dropped_groups",
    "evicted": "buffer/evicted_groups",
    "aborted": "buffer/aborted_inflight_groups",
}


@dataclass
class RunData:
    """One run as read from disk."""

    run_dir: RunDir
    config: dict[str, Any]
    records: list[dict[str, Any]]
    sim_summary: dict[str, Any] | None

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def group_size(self) -> int | None:
        """G, from ``grpo.num_generations_per_prompt`` in config.yaml (None when absent)."""
        value = self.config.get("grpo", {}).get("num_generations_per_prompt")
        return int(value) if value is not None else None


def load_run(path: str | Path) -> RunData:
    """Read a run directory; a missing ``metrics.jsonl`` is an error naming the directory."""
    run_dir = RunDir(Path(path))
    if not run_dir.metrics_path.is_file():
        raise FileNotFoundError(
            f"{str(run_dir.root)!r} has no metrics.jsonl; pass a groupwise run directory (runs/<name>) "
            "whose training logged at least one step"
        )
    config: dict[str, Any] = {}
    if run_dir.config_path.is_file():
        config = yaml.safe_load(run_dir.config_path.read_text(encoding="utf-8")) or {}
    sim = None
    if run_dir.sim_summary_path.is_file():
        sim = json.loads(run_dir.sim_summary_path.read_text(encoding="utf-8"))
    return RunData(run_dir=run_dir, config=config, records=read_metrics(run_dir.metrics_path), sim_summary=sim)


# --- series and aggregates (pure) ------------------------------------------------------------
def series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the records where ``key`` has a value (absent and null are skipped)."""
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [s for s, _ in points], [v for _, v in points]


def total(records: Sequence[dict[str, Any]], key: str) -> float | None:
    """Σ ``key`` over the steps that logged it; None if no step did."""
    _, values = series(records, key)
    return sum(values) if values else None


def cumulative(records: Sequence[dict[str, Any]], key: str, scale: float = 1.0) -> list[float]:
    """For each record, ``scale × Σ key`` over it and every earlier record (a missing value adds 0)."""
    running, out = 0.0, []
    for record in records:
        running += (record.get(key) or 0) * scale
        out.append(running)
    return out


def weighted_mean(records: Sequence[dict[str, Any]], key: str, weight_key: str) -> float | None:
    """``Σ key·w / Σ w`` over steps with both (w = ``weight_key``); the plain step mean if no step has w."""
    pairs = [(r[key], r.get(weight_key)) for r in records if r.get(key) is not None]
    weighted = [(v, w) for v, w in pairs if w is not None]
    if weighted and sum(w for _, w in weighted) > 0:
        return sum(v * w for v, w in weighted) / sum(w for _, w in weighted)
    return sum(v for v, _ in pairs) / len(pairs) if pairs else None


def _last(records: Sequence[dict[str, Any]], key: str) -> float | None:
    _, values = series(records, key)
    return values[-1] if values else None


def _mean(records: Sequence[dict[str, Any]], key: str) -> float | None:
    _, values = series(records, key)
    return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class RunSummary:
    """The report's summary row. ``zero_variance_fraction`` is over all generated groups (weighted by
    ``ds/groups_generated``); ``wall_seconds`` is Σ ``perf/step_seconds``."""

    name: str
    steps: int
    final_accuracy: float | None
    best_accuracy: float | None
    zero_variance_fraction: float | None
    groups_generated: int | float | None
    groups_trained: int | float | None
    wall_seconds: float | None


def summarize_run(run: RunData) -> RunSummary:
    _, accuracy = series(run.records, "eval/accuracy")
    return RunSummary(
        name=run.name,
        steps=max((r["step"] for r in run.records), default=0),
        final_accuracy=accuracy[-1] if accuracy else None,
        best_accuracy=max(accuracy) if accuracy else None,
        zero_variance_fraction=weighted_mean(run.records, "ds/zero_variance_fraction", "ds/groups_generated"),
        groups_generated=count(total(run.records, "ds/groups_generated")),
        groups_trained=count(total(run.records, "ds/groups_trained")),
        wall_seconds=total(run.records, "perf/step_seconds"),
    )


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
        "groups generated": count(total(records, "ds/groups_generated")),
        "groups filtered": count(total(records, "ds/groups_filtered")),
        "groups trained": count(trained),
        "groups dropped": count(total(records, "accounting/dropped_groups")),
        "groups replaced": count(total(records, "accounting/replaced_groups")),
        "groups evicted": count(total(records, "buffer/evicted_groups")),
        "groups aborted": count(total(records, "buffer/aborted_inflight_groups")),
        "trained groups/h": trained / wall * 3600 if trained is not None and wall else None,
        "rollout idle fraction": sim.get("rollout_idle_fraction", _mean(records, "perf/rollout_idle_fraction")),
        "trainer idle fraction": sim.get("trainer_idle_fraction", _mean(records, "perf/trainer_idle_fraction")),
        "staleness mean": weighted_mean(records, "staleness/mean", "ds/groups_trained"),
        "staleness max": count(max(series(records, "staleness/max")[1], default=None)),
        "final reward (unfiltered)": _last(records, "reward/unfiltered_mean"),
        "final reward (trained)": _last(records, "reward/trained_mean"),
        "final eval accuracy": _last(records, "eval/accuracy"),
    }


def count(value: float | None) -> int | float | None:
    """A count summed from float metrics, as an int when it is whole (so tables show ``36``, not ``36.000``)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def fmt(value: Any, digits: int = 3) -> str:
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


# --- commands --------------------------------------------------------------------------------
def run_report(run_dirs: Sequence[str | Path]) -> Path:
    """Write ``report.md`` and ``plots/*.png`` into the first run dir (runs overlaid); return report.md's path."""
    runs = _load_runs(run_dirs)
    first = runs[0].run_dir
    first.plots_dir.mkdir(parents=True, exist_ok=True)
    plots = _report_plots(runs, first.plots_dir)
    lines = ["# groupwise report", "", f"Runs: {', '.join(r.name for r in runs)}", "", "## Summary", ""]
    lines += ["| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "---|" * len(SUMMARY_COLUMNS)]
    for run in runs:
        s = summarize_run(run)
        cells = [s.name, str(s.steps), fmt(s.final_accuracy), fmt(s.best_accuracy), fmt(s.zero_variance_fraction)]
        cells += [fmt(s.groups_generated), fmt(s.groups_trained), fmt_duration(s.wall_seconds)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Zero-variance fraction is over all generated groups; wall time is the sum of step times.", ""]
    for title, filename in plots:
        if filename is None:
            lines += [f"## {title}", "", f"No run logged the metrics for this plot ({MISSING}).", ""]
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
    first.plots_dir.mkdir(parents=True, exist_ok=True)
    _compare_plots(runs, first.plots_dir)
    return "\n".join(lines) + "\n"


def _load_runs(run_dirs: Sequence[str | Path]) -> list[RunData]:
    if not run_dirs:
        raise ValueError("no run directories given; pass one or more runs/<name> directories")
    return [load_run(path) for path in run_dirs]


# --- plots (matplotlib Figure objects: no pyplot global state, Agg canvas) ------------------
def _new_axes(title: str, xlabel: str, ylabel: str, ncols: int = 1) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4 * ncols if ncols > 1 else 7.0, 4.2), layout="constrained")
    axes = figure.subplots(1, ncols, squeeze=False)[0]
    for ax in axes:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    figure.suptitle(title)
    return figure, axes


def _save(figure: Any, axes: Any, path: Path) -> str:
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    figure.savefig(path, dpi=100)
    return path.name


def _line_plot(runs: Sequence[RunData], path: Path, title: str, ylabel: str, keys: Sequence[tuple[str, str, str]],
               x_of: str = "step") -> str | None:
    """One line per (run, key); ``keys`` = (metric, label suffix, line style). ``x_of``: ``step`` or
    ``generated`` / ``trained`` (cumulative samples = cumulative groups × G). None when nothing to draw."""
    xlabel = "step" if x_of == "step" else f"cumulative {x_of} samples"
    figure, axes = _new_axes(title, xlabel, ylabel)
    drawn = 0
    for index, run in enumerate(runs):
        if x_of == "step":
            xs_all = [float(r["step"]) for r in run.records]
        elif run.group_size is None:
            continue
        else:
            xs_all = cumulative(run.records, f"ds/groups_{x_of}", run.group_size)
        for key, suffix, style in keys:
            points = [(x, r[key]) for x, r in zip(xs_all, run.records, strict=True) if r.get(key) is not None]
            if points:
                xs, ys = zip(*points, strict=True)
                marker = "o" if len(points) < 30 else None
                axes[0].plot(xs, ys, linestyle=style, marker=marker, markersize=3, color=f"C{index}",
                             label=f"{run.name}{suffix}")
                drawn += 1
    if not drawn:
        path.unlink(missing_ok=True)  # never leave a stale plot from an earlier report beside the new one
        return None
    return _save(figure, axes, path)


def trailing_rate(records: Sequence[dict[str, Any]], window: int = 10) -> list[tuple[float, float]]:
    """(wall hours, trained groups/h over the last ``window`` steps) per step: Δ cumulative
    ``ds/groups_trained`` ÷ Δ cumulative ``perf/step_seconds``, from an origin (0 h, 0 groups) before the
    first step; steps where no time passed are skipped."""
    hours = [0.0] + [s / 3600 for s in cumulative(records, "perf/step_seconds")]
    done = [0.0] + cumulative(records, "ds/groups_trained")
    points = []
    for i in range(1, len(hours)):
        j = max(i - window, 0)
        if hours[i] > hours[j]:
            points.append((hours[i], (done[i] - done[j]) / (hours[i] - hours[j])))
    return points


def _report_plots(runs: Sequence[RunData], plots_dir: Path) -> list[tuple[str, str | None]]:
    rewards = [("reward/unfiltered_mean", " unfiltered", "-"), ("reward/trained_mean", " trained", "--")]
    zero_var = [("ds/zero_variance_fraction", " all", "-"), ("ds/zero_variance_max_fraction", " all at max", "--"),
                ("ds/zero_variance_min_fraction", " all at min", ":")]
    specs = [
        ("Reward vs step", "reward_vs_step.png", "mean reward", rewards, "step"),
        ("Reward vs generated samples", "reward_vs_generated_samples.png", "mean reward", rewards, "generated"),
        ("Zero-variance group fraction", "zero_variance_fraction.png", "fraction of groups", zero_var, "step"),
        ("Generation rounds per step", "gen_rounds.png", "rounds", [("ds/gen_rounds", "", "-")], "step"),
        ("Eval accuracy (greedy, held-out)", "eval_accuracy.png", "accuracy", [("eval/accuracy", "", "-")], "step"),
    ]
    return [(title, _line_plot(runs, plots_dir / name, title, ylabel, keys, x_of))
            for title, name, ylabel, keys, x_of in specs]


def _compare_plots(runs: Sequence[RunData], plots_dir: Path) -> list[str | None]:
    reward = [("reward/unfiltered_mean", "", "-")]
    written = [
        _line_plot(runs, plots_dir / "compare_reward_vs_generated.png", "Reward (unfiltered) vs generated samples",
                   "mean reward", reward, "generated"),
        _line_plot(runs, plots_dir / "compare_reward_vs_trained.png", "Reward (unfiltered) vs trained samples",
                   "mean reward", reward, "trained"),
    ]
    figure, axes = _new_axes("Cumulative groups by fate", "step", "groups", ncols=len(runs))
    for ax, run in zip(axes, runs, strict=True):
        ax.set_title(run.name, fontsize="medium")
        steps = [r["step"] for r in run.records]
        for fate, key in FATE_KEYS.items():
            if total(run.records, key) is not None:
                ax.plot(steps, cumulative(run.records, key), label=fate)
    written.append(_save(figure, axes, plots_dir / "compare_fates.png"))
    figure, axes = _new_axes("Throughput (trailing 10 steps)", "wall time (h, sum of step times)", "trained groups/h")
    for index, run in enumerate(runs):
        rate = trailing_rate(run.records)
        if rate:
            xs, ys = zip(*rate, strict=True)
            axes[0].plot(xs, ys, color=f"C{index}", label=run.name)
    written.append(_save(figure, axes, plots_dir / "compare_throughput.png"))
    return written
