"""The plot of ``groupwise plan``: speed-up over sync against the staleness window and against the GPU split.

Left: speed-up against the window, one line per (sampler, partial rollouts) at the split of the best row. Right:
speed-up against the rollout share of the GPUs, one line per (sampler, partial rollouts) at the window of the best
row. The recommended row is a star in both; with none (sync and async within the error band), the lines are drawn
at the fastest async row.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from groupwise.sim.plan import PlanRow


def plot_plan(rows: Sequence[PlanRow], path: str | Path, title: str) -> Path | None:
    """Write the plot to ``path`` (PNG); None when no async row finished (nothing to plot). Without a starred
    async row the plot is drawn at the fastest async row, unstarred."""
    done = [r for r in rows if r.point.mode == "async" and r.speedup is not None]  # screened: over screened sync
    best = next((r for r in rows if r.best), None)
    if not done:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    anchor = best if best is not None and best.point.mode == "async" else max(done, key=lambda r: r.speedup or 0.0)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    by_window: dict[str, list[tuple[float, float]]] = defaultdict(list)
    by_split: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in done:
        p = r.point
        name = f"{p.sampler}, partial {p.partial_rollouts}"
        if p.rollout_gpus == anchor.point.rollout_gpus:
            by_window[name].append((float(p.window or 0), r.speedup or 0.0))
        if p.window == anchor.point.window:
            by_split[name].append((p.rollout_gpus / (p.rollout_gpus + p.train_gpus), r.speedup or 0.0))
    for axis, series, xlabel in ((left, by_window, "staleness window (versions)"),
                                 (right, by_split, "share of GPUs generating")):  # fmt: skip
        for name, points in sorted(series.items()):
            points.sort()
            axis.plot([x for x, _ in points], [y for _, y in points], marker="o", label=name)
        axis.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        axis.set_xlabel(xlabel)
        axis.grid(alpha=0.3)
    windows = window_ticks([float(x) for points in by_window.values() for x, _ in points])
    left.set_xticks(windows)
    left.set_xlim(windows[0] - 0.5, windows[-1] + 0.5)  # one window: a readable column, not a 0.96–1.04 axis
    p = anchor.point
    if anchor is best:
        left.plot([p.window], [anchor.speedup], marker="*", markersize=16, color="black", linestyle="none",
                  label="recommended")  # fmt: skip
        right.plot([p.rollout_gpus / (p.rollout_gpus + p.train_gpus)], [anchor.speedup], marker="*", markersize=16,
                   color="black", linestyle="none")  # fmt: skip
    left.set_ylabel("speed-up over sync (trained tokens/s)")
    left.set_title(f"at {p.rollout_gpus}:{p.train_gpus} GPUs")
    right.set_title(f"at window {p.window}")
    left.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def window_ticks(windows: list[float]) -> list[int]:
    """The staleness axis's ticks: every whole window from the smallest to the largest plotted (windows are whole
    versions, so the axis never shows fractions, even with a single window)."""
    return list(range(int(min(windows)), int(max(windows)) + 1))
