"""`StepMeter`: per-step ``perf/*`` metrics and the run's staleness distribution, read off the simulated parts.

At each step end (virtual time ``t``, previous step end ``t₀``, ``Δ = t − t₀``)::

    perf/step_seconds           = Δ
    perf/rollout_idle_fraction  = (engine idle seconds in [t₀, t]) / Δ      engine idle: no completion in progress
    perf/trainer_idle_fraction  = 1 − (training seconds in [t₀, t]) / Δ     weight syncs count as idle
    perf/gen_tokens_per_s       = completion tokens returned in [t₀, t] / perf/gen_seconds   (sync)

The idle fractions keep the meaning they have in real async runs (``docs/metrics.md``); the share of slot
capacity left unused (long tails, too few prompts in flight) is a whole-run figure in ``sim/summary.json``.
Staleness of a trained group = the step that trains it − its start version; of a token, the step − the version
that produced it (``SimulatedGroup.version_tokens``; every token of ``start_version`` without partial rollouts).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable

from groupwise.sim.simulated_learner import SimulatedTrainer
from groupwise.sim.simulated_rollouts import SimulatedGroup, SimulatedRollouts
from groupwise.types import Group


class StepMeter:
    """Differences of the simulated engine's and learner's running totals between step ends."""

    def __init__(self, rollouts: SimulatedRollouts, trainer: SimulatedTrainer, clock: Callable[[], float]) -> None:
        self.rollouts = rollouts
        self.trainer = trainer
        self.clock = clock
        self.staleness: Counter[int] = Counter()
        self._token_staleness = 0  # Σ over trained tokens of (step − their version)
        self._trained_tokens = 0
        self._last_time = clock()
        self._last_idle = rollouts.slots.engine_idle_seconds(self._last_time)
        self._last_train = trainer.busy_seconds
        self._last_tokens = rollouts.counters.returned_tokens

    def record_trained(self, step: int, groups: Iterable[Group]) -> None:
        """Count the staleness ``step − start_version`` of each trained group, and of its tokens."""
        for group in groups:
            self.staleness[step - group.start_version] += 1
            mixed = group.version_tokens if isinstance(group, SimulatedGroup) else ()
            mix = mixed or ((group.start_version, group.num_completion_tokens),)
            for version, tokens in mix:
                self._token_staleness += (step - version) * tokens
                self._trained_tokens += tokens

    @property
    def token_staleness_mean(self) -> float | None:
        """Mean over trained tokens of ``step − the version that produced the token`` (None before any)."""
        return self._token_staleness / self._trained_tokens if self._trained_tokens else None

    def step_metrics(self, *, async_mode: bool, gen_seconds: float = 0.0) -> dict[str, float]:
        """The ``perf/*`` metrics of the step that just ended (async keys only in async mode, as in real runs)."""
        now = self.clock()
        wall = now - self._last_time
        idle = self.rollouts.slots.engine_idle_seconds(now)
        train = self.trainer.busy_seconds
        tokens = self.rollouts.counters.returned_tokens
        metrics = {"perf/step_seconds": wall}
        if async_mode:
            metrics["perf/rollout_idle_fraction"] = (idle - self._last_idle) / wall if wall > 0 else 0.0
            busy = (train - self._last_train) / wall if wall > 0 else 1.0
            metrics["perf/trainer_idle_fraction"] = max(0.0, 1.0 - busy)
        else:
            metrics["perf/gen_tokens_per_s"] = (tokens - self._last_tokens) / gen_seconds if gen_seconds > 0 else 0.0
        self._last_time, self._last_idle, self._last_train, self._last_tokens = now, idle, train, tokens
        return metrics


def staleness_stats(histogram: Counter[int]) -> dict[str, float | int | None]:
    """Mean, median, 90th/99th percentile (nearest rank) and max of a staleness histogram (None when empty)."""
    total = sum(histogram.values())
    if total == 0:
        return {"staleness_mean": None, "staleness_p50": None, "staleness_p90": None, "staleness_p99": None,
                "staleness_max": None}  # fmt: skip
    ordered = sorted(histogram.items())

    def percentile(q: float) -> int:
        rank = max(1, math.ceil(q * total - 1e-9))  # nearest rank; the epsilon keeps 0.99 × 100 at 99
        seen = 0
        for value, count in ordered:
            seen += count
            if seen >= rank:
                return value
        return ordered[-1][0]

    return {
        "staleness_mean": sum(v * n for v, n in ordered) / total,
        "staleness_p50": percentile(0.5),
        "staleness_p90": percentile(0.9),
        "staleness_p99": percentile(0.99),
        "staleness_max": ordered[-1][0],
    }
