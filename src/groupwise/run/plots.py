"""The PNG plots of ``groupwise report`` and ``groupwise compare`` (matplotlib ``Figure`` objects, no pyplot state).

How the plots read:

* per-step series that are noisy (rewards, zero-variance fractions, generation rounds) are drawn twice: each
  step's value as a faint thin line, and over it a bold centred moving mean
  (:func:`groupwise.run.run_stats.moving_mean`, window :func:`~groupwise.run.run_stats.smoothing_window`); the
  subtitle names the window;
* every line of a plot has its own colour: series ``k`` of run ``r`` gets colour ``C(r·K + k)`` for K series per
  run, so paired series (unfiltered / trained, all-at-max / all-at-min) differ in colour, and in dash style too;
* axes of whole quantities (steps, samples, rounds, group counts) get integer ticks;
* legends sit outside the axes, below the plot, so they never cover data;
* wasted generation (``waste/*``) is drawn cumulatively: tokens per waste fate and their sum, one panel per run
  (:func:`draw_waste`), and the wasted share of all generated tokens over the run (``waste_fraction.png``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from groupwise.run.run_stats import (
    GROUP_COUNT_KEYS,
    RunData,
    cumulative,
    moving_mean,
    smoothing_window,
    total,
    trailing_rate,
)

if TYPE_CHECKING:  # matplotlib is imported where a plot is drawn
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis
    from matplotlib.figure import Figure

STYLES = ("-", "--", ":", "-.")
RAW_ALPHA = 0.25
SMOOTH_MIN_POINTS = 8  # fewer points are drawn as they are, with markers
MARKER_MAX_POINTS = 40  # an unsmoothed series with more points is drawn as a plain line
# What became of the generated groups (and slots replaced with a spare prompt): the summary's counts but "generated".
FATE_KEYS = {label: key for label, key in GROUP_COUNT_KEYS.items() if label != "generated"}
# Wasted tokens per fate (each mode logs its own), in groupwise.algo.waste.WASTE_FATES order.
WASTE_KEYS = {fate: f"waste/{fate}_tokens" for fate in ("filtered", "discarded", "failed", "aborted", "evicted")}


@dataclass(frozen=True)
class Series:
    """One metric of a plot: its key and its legend label."""

    key: str
    label: str


def new_axes(title: str, xlabel: str, ylabel: str, ncols: int = 1) -> tuple[Figure, Sequence[Axes]]:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4 * ncols if ncols > 1 else 7.5, 4.8), layout="constrained")
    axes = figure.subplots(1, ncols, squeeze=False)[0]
    for ax in axes:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    figure.suptitle(title)
    return figure, axes


def integer_ticks(axis: Axis) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def finish(figure: Figure, axes: Sequence[Axes], integer_y: bool = False, integer_x: bool = True) -> Figure:
    """Integer x ticks (steps and samples are whole) and y ticks as asked; one legend below the axes."""
    handles, labels = [], []
    for ax in axes:
        if integer_x:
            integer_ticks(ax.xaxis)
        if integer_y:
            integer_ticks(ax.yaxis)
            ax.set_ylim(bottom=0)  # counts start at zero: the axis shows how big they are, not only their wiggle
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    if handles:
        figure.legend(handles, labels, loc="outside lower center", ncols=legend_columns(labels, len(axes)),
                      fontsize="small")
    return figure


def legend_columns(labels: Sequence[str], panels: int = 1) -> int:
    """Up to 3 columns, 2 when labels are long (``run name + series``), so the legend fits the figure's width."""
    widest = 3 * panels if max(len(label) for label in labels) <= 24 else 2 * panels
    return max(1, min(len(labels), widest))


def save(figure: Figure, path: Path) -> str:
    figure.savefig(path, dpi=100)
    return path.name


def x_values(run: RunData, x_of: str) -> list[float] | None:
    """The x of each record: its step, or cumulative ``generated`` / ``trained`` samples (groups × G)."""
    if x_of == "step":
        return [float(r["step"]) for r in run.records]
    if run.group_size is None:
        return None
    return cumulative(run.records, f"ds/groups_{x_of}", run.group_size)


def draw_lines(runs: Sequence[RunData], title: str, ylabel: str, keys: Sequence[Series], x_of: str = "step",
               smooth: bool = True, integer_y: bool = False) -> Figure | None:
    """The figure of a line plot, one line per (run, series), or None when no run logged any of ``keys``."""
    xlabel = "step" if x_of == "step" else f"cumulative {x_of} samples"
    figure, axes = new_axes(title, xlabel, ylabel)
    ax, windows = axes[0], set()
    for run_index, run in enumerate(runs):
        xs_all = x_values(run, x_of)
        if xs_all is None:
            continue
        for key_index, item in enumerate(keys):
            points = [(x, r[item.key]) for x, r in zip(xs_all, run.records, strict=True) if r.get(item.key) is not None]
            if not points:
                continue
            xs, ys = (list(v) for v in zip(*points, strict=True))
            colour, style = f"C{(run_index * len(keys) + key_index) % 10}", STYLES[key_index % len(STYLES)]
            label = item.label if len(runs) == 1 else f"{run.name} {item.label}".strip()
            label = label or run.name
            if smooth and len(ys) >= SMOOTH_MIN_POINTS:
                window = smoothing_window(len(ys))
                windows.add(window)
                ax.plot(xs, ys, color=colour, linewidth=0.8, alpha=RAW_ALPHA)
                ax.plot(xs, moving_mean(ys, window), color=colour, linestyle=style, linewidth=2.0, label=label)
            else:  # markers show where the few measurements are; on a long series they would hide the line
                marker = "o" if len(ys) <= MARKER_MAX_POINTS else None
                ax.plot(xs, ys, color=colour, linestyle=style, marker=marker, markersize=4, label=label)
    if not ax.get_lines():
        return None
    if windows:
        steps = "/".join(str(w) for w in sorted(windows))
        ax.set_title(f"faint: each step; bold: centred mean over {steps} steps", fontsize="small", loc="left")
    return finish(figure, axes, integer_y)


def line_plot(runs: Sequence[RunData], path: Path, title: str, ylabel: str, keys: Sequence[Series],
              x_of: str = "step", smooth: bool = True, integer_y: bool = False) -> str | None:
    """Write :func:`draw_lines`'s figure to ``path``; None (and no stale file left) when there is nothing to draw."""
    figure = draw_lines(runs, title, ylabel, keys, x_of, smooth, integer_y)
    if figure is None:
        path.unlink(missing_ok=True)  # never leave a stale plot from an earlier report beside the new one
        return None
    return save(figure, path)


WASTE_FRACTION = (Series("waste/cumulative_fraction", ""),)
REWARDS = (Series("reward/unfiltered_mean", "unfiltered (every generated row)"),
           Series("reward/trained_mean", "trained rows"))
ZERO_VARIANCE = (Series("ds/zero_variance_fraction", "all equal"),
                 Series("ds/zero_variance_max_fraction", "all at max (solved)"),
                 Series("ds/zero_variance_min_fraction", "all at min (none solved)"))


def no_data_text(keys: Sequence[Series]) -> str:
    """What the report says instead of a line plot none of whose ``keys`` any run logged."""
    return f"No run logged the metrics for this plot ({', '.join(f'`{item.key}`' for item in keys)})."


NO_WASTE_TEXT = "No run wasted a generated token (`waste/tokens` is 0 or absent at every step): nothing to draw."


def report_plots(runs: Sequence[RunData], plots_dir: Path) -> list[tuple[str, str | None, str]]:
    """``(title, file name or None, what to say when None)`` of each report plot, written into ``plots_dir``; a
    plot with nothing to show is not written (and an older file of that name is removed)."""
    specs = [
        ("Reward vs step", "reward_vs_step.png", "mean reward", REWARDS, "step", True, False),
        ("Reward vs generated samples", "reward_vs_generated_samples.png", "mean reward", REWARDS, "generated",
         True, False),
        ("Zero-variance group fraction", "zero_variance_fraction.png", "fraction of generated groups",
         ZERO_VARIANCE, "step", True, False),
        ("Generation rounds per step", "gen_rounds.png", "rounds", (Series("ds/gen_rounds", ""),), "step", True,
         True),
        ("Eval accuracy (greedy, held-out)", "eval_accuracy.png", "accuracy", (Series("eval/accuracy", ""),),
         "step", False, False),
        ("Wasted share of generated tokens (cumulative)", "waste_fraction.png", "wasted ÷ generated tokens",
         WASTE_FRACTION, "step", False, False),
    ]  # fmt: skip
    plots = [(title, line_plot(runs, plots_dir / name, title, ylabel, keys, x_of, smooth, integer_y),
              no_data_text(keys)) for title, name, ylabel, keys, x_of, smooth, integer_y in specs]
    plots.append(("Wasted generation by fate (cumulative tokens)", waste_plot(runs, plots_dir / "waste_tokens.png"),
                  NO_WASTE_TEXT))
    return plots


def draw_fates(runs: Sequence[RunData]) -> Figure | None:
    """Cumulative groups by fate, one panel per run that logged any; a fate has the same colour in every panel.
    None when no run logged a group count."""
    logged = [run for run in runs if any(total(run.records, key) is not None for key in FATE_KEYS.values())]
    if not logged:
        return None
    figure, axes = new_axes("Cumulative groups by fate", "step", "groups", ncols=len(logged))
    for ax, run in zip(axes, logged, strict=True):
        ax.set_title(run.name, fontsize="medium")
        steps = [r["step"] for r in run.records]
        for index, (fate, key) in enumerate(FATE_KEYS.items()):
            if total(run.records, key) is not None:
                ax.plot(steps, cumulative(run.records, key), color=f"C{index}", linestyle=STYLES[index % 4],
                        label=fate)
    return finish(figure, axes, integer_y=True)


def draw_waste(runs: Sequence[RunData]) -> Figure | None:
    """Cumulative wasted tokens per fate and in all, one panel per run that wasted any (None when no run did: a run
    without ``waste/*`` metrics, or whose every step wasted 0 tokens, would be an empty panel)."""
    logged = [run for run in runs if total(run.records, "waste/tokens")]
    if not logged:
        return None
    figure, axes = new_axes("Wasted generation (cumulative)", "step", "completion tokens", ncols=len(logged))
    for ax, run in zip(axes, logged, strict=True):
        ax.set_title(run.name, fontsize="medium")
        steps = [r["step"] for r in run.records]
        wasted = [(index, fate, key) for index, (fate, key) in enumerate(WASTE_KEYS.items())
                  if total(run.records, key)]  # a fate the run never wasted a token on stays out of the legend
        for index, fate, key in wasted:
            ax.plot(steps, cumulative(run.records, key), color=f"C{index}", linestyle=STYLES[index % 4], label=fate)
        if len(wasted) > 1:  # with one fate the sum is that fate's line
            ax.plot(steps, cumulative(run.records, "waste/tokens"), color="black", linewidth=2.0, label="all wasted")
    return finish(figure, axes, integer_y=True)


def waste_plot(runs: Sequence[RunData], path: Path) -> str | None:
    """Write :func:`draw_waste`'s figure to ``path``; None (and no stale file) when no run wasted a token."""
    return save_or_remove(draw_waste(runs), path)


def draw_throughput(runs: Sequence[RunData]) -> Figure | None:
    """Trained groups per hour over a trailing window, one line per run; None when no run has a rate (no
    ``ds/groups_trained`` with ``perf/step_seconds``)."""
    rates = [(index, run, trailing_rate(run.records)) for index, run in enumerate(runs)]
    if not any(rate for _, _, rate in rates):
        return None
    figure, axes = new_axes("Throughput (trailing 10 steps)", "wall time (h, sum of step times)", "trained groups/h")
    for index, run, rate in rates:
        if rate:
            xs, ys = zip(*rate, strict=True)
            axes[0].plot(xs, ys, color=f"C{index % 10}", label=run.name)
    return finish(figure, axes, integer_x=False)  # hours are not whole numbers


def save_or_remove(figure: Figure | None, path: Path) -> str | None:
    """Save ``figure`` to ``path``; with nothing to draw (None), remove a stale file there and return None."""
    if figure is None:
        path.unlink(missing_ok=True)
        return None
    return save(figure, path)


def compare_plots(runs: Sequence[RunData], plots_dir: Path) -> list[str | None]:
    reward = (Series("reward/unfiltered_mean", ""),)
    written = [
        line_plot(runs, plots_dir / "compare_reward_vs_generated.png", "Reward (unfiltered) vs generated samples",
                  "mean reward", reward, "generated"),
        line_plot(runs, plots_dir / "compare_reward_vs_trained.png", "Reward (unfiltered) vs trained samples",
                  "mean reward", reward, "trained"),
    ]
    written.append(save_or_remove(draw_fates(runs), plots_dir / "compare_fates.png"))
    written.append(save_or_remove(draw_throughput(runs), plots_dir / "compare_throughput.png"))
    written.append(waste_plot(runs, plots_dir / "compare_waste_tokens.png"))
    written.append(line_plot(runs, plots_dir / "compare_waste_fraction.png",
                             "Wasted share of generated tokens (cumulative)", "wasted ÷ generated tokens",
                             WASTE_FRACTION, "step", smooth=False))  # fmt: skip
    return written
