"""A run's numbers as read back from its files: series, totals, smoothing and the one-run summary.

``groupwise report``, ``groupwise compare`` and the summary ``groupwise train`` prints at the end all read
``metrics.jsonl`` through these functions, so a number means the same thing in each. Per-step counts are
summed over steps (``docs/metrics.md``); a key a run never logged is ``None`` (shown as ``—``), never 0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from groupwise.config.load import read_config_file
from groupwise.run.metrics import read_metrics
from groupwise.run.rundir import RunDir

# Group counts of a run, by fate: label → per-step metric key (sync and async runs each log their own).
GROUP_COUNT_KEYS = {
    "generated": "ds/groups_generated",
    "trained": "ds/groups_trained",
    "filtered": "ds/groups_filtered",
    "discarded": "ds/discarded_valid_groups",
    "dropped": "accounting/dropped_groups",
    "replaced": "accounting/replaced_groups",
    "evicted": "buffer/evicted_groups",
    "aborted": "buffer/aborted_inflight_groups",
}
MAX_SMOOTHING_WINDOW = 25


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
    if run_dir.config_path.is_file():  # not YAML, or not a mapping: a ConfigError naming the file (exit 2)
        config = read_config_file(run_dir.config_path)
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


def last(records: Sequence[dict[str, Any]], key: str) -> float | None:
    _, values = series(records, key)
    return values[-1] if values else None


def mean(records: Sequence[dict[str, Any]], key: str) -> float | None:
    _, values = series(records, key)
    return sum(values) / len(values) if values else None


def count(value: float | None) -> int | float | None:
    """A count summed from float metrics, as an int when it is whole (so tables show ``36``, not ``36.000``)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def smoothing_window(num_points: int) -> int:
    """Steps averaged by the smoothed curves and the start/end values: ``W = clamp(n // 5, 1, 25)``."""
    return max(1, min(MAX_SMOOTHING_WINDOW, num_points // 5))


def moving_mean(values: Sequence[float], window: int) -> list[float]:
    """Centred moving mean: ``out[i] = mean(values[i − h .. i + h])`` with ``h = window // 2``, the range cut at
    both ends (so the first and last points average fewer values and the curve has no lag)."""
    half = max(window, 1) // 2
    out = []
    for i in range(len(values)):
        part = values[max(0, i - half) : i + half + 1]
        out.append(sum(part) / len(part))
    return out


def start_end_means(values: Sequence[float], window: int) -> tuple[float, float] | None:
    """``(mean of the first W values, mean of the last W values)``; None for an empty series."""
    if not values:
        return None
    head, tail = values[:window], values[-window:]
    return sum(head) / len(head), sum(tail) / len(tail)


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


# --- the one-run summary ---------------------------------------------------------------------
@dataclass(frozen=True)
class Accuracy:
    """Held-out greedy accuracy over a run: the first and last evaluation, and the best one."""

    start: float
    start_step: int
    final: float
    final_step: int
    best: float
    best_step: int  # the first step that reached ``best``


@dataclass(frozen=True)
class Smoothed:
    """A per-step series reduced to its start and end: means over the first and last ``window`` steps."""

    start: float
    end: float
    window: int


@dataclass(frozen=True)
class RunSummary:
    """What a run did, from its ``metrics.jsonl``.

    ``zero_variance_fraction`` is over all generated groups (weighted by ``ds/groups_generated``);
    ``wall_seconds`` is Σ ``perf/step_seconds``; ``groups`` maps a fate label of :data:`GROUP_COUNT_KEYS` to
    its count summed over steps, for the keys the run logged (in that order).
    """

    name: str
    mode: str | None
    steps: int
    accuracy: Accuracy | None
    final_pass_at_k: float | None
    trained_reward: Smoothed | None
    unfiltered_reward: Smoothed | None
    zero_variance_fraction: float | None
    wall_seconds: float | None
    groups: dict[str, int | float] = field(default_factory=dict)

    @property
    def groups_generated(self) -> int | float | None:
        return self.groups.get("generated")

    @property
    def groups_trained(self) -> int | float | None:
        return self.groups.get("trained")


def accuracy_of(records: Sequence[dict[str, Any]]) -> Accuracy | None:
    steps, values = series(records, "eval/accuracy")
    if not values:
        return None
    best = max(values)
    return Accuracy(values[0], steps[0], values[-1], steps[-1], best, steps[values.index(best)])


def smoothed_of(records: Sequence[dict[str, Any]], key: str) -> Smoothed | None:
    _, values = series(records, key)
    window = smoothing_window(len(values))
    ends = start_end_means(values, window)
    return None if ends is None else Smoothed(ends[0], ends[1], window)


def summarize_run(run: RunData) -> RunSummary:
    records = run.records
    groups = {label: count(total(records, key)) for label, key in GROUP_COUNT_KEYS.items()}
    return RunSummary(
        name=run.name,
        mode=run.config.get("mode"),
        steps=max((r["step"] for r in records), default=0),
        accuracy=accuracy_of(records),
        final_pass_at_k=last(records, "eval/pass_at_k"),
        trained_reward=smoothed_of(records, "reward/trained_mean"),
        unfiltered_reward=smoothed_of(records, "reward/unfiltered_mean"),
        zero_variance_fraction=weighted_mean(records, "ds/zero_variance_fraction", "ds/groups_generated"),
        wall_seconds=total(records, "perf/step_seconds"),
        groups={label: value for label, value in groups.items() if value is not None},
    )
