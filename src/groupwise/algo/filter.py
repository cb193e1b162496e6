"""The DAPO dynamic-sampling filter: is a prompt group zero-variance? (Invariant 3 in docs/design.md.)

The test is per group, on RAW (unscaled, unshaped) rewards, by ``max − min``: exact equality by default,
so no float-std residue decides it (a float32 std of eight equal rewards of 1/6 is ~1e-8, not 0).
Leave-one-out statistics play no part here; they are for baselines only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

ZeroVarianceKind = Literal["max", "min", "other"]


def _check_group(group_rewards: Sequence[float], tol: float) -> None:
    if len(group_rewards) == 0:
        raise ValueError("a group needs at least one reward to be tested for zero variance; got none")
    if not tol >= 0.0:
        raise ValueError(f"zero-variance tolerance must be >= 0 (0 means exact equality), got {tol}")
    bad = [r for r in group_rewards if not math.isfinite(r)]
    if bad:
        raise ValueError(f"group rewards must be finite to be filtered, got {bad} in {list(group_rewards)}")


def is_zero_variance(group_rewards: Sequence[float], tol: float = 0.0) -> bool:
    """``max(r) − min(r) ≤ tol`` over one group's raw rewards (``tol = 0``: all exactly equal).

    A group of one reward is trivially zero-variance; dynamic sampling requires G ≥ 2.
    """
    _check_group(group_rewards, tol)
    return max(group_rewards) - min(group_rewards) <= tol


def zero_variance_kind(
    group_rewards: Sequence[float], low: float, high: float, tol: float = 0.0
) -> ZeroVarianceKind | None:
    """Which kind of zero-variance group this is, or None when the group has variance.

    ``"max"`` when every reward is within ``tol`` of ``high`` (all correct), ``"min"`` when within ``tol``
    of ``low`` (all wrong), ``"other"`` for any other common value.

    ``low``/``high`` are the reward function's declared raw range chosen by the caller — e.g. 0 and 1 for
    pass/fail rewards, or the reward-scaling source range — not the extremes of the rewards seen, which
    would call an all-wrong step "max". If ``low == high`` the two kinds cannot be told apart and the
    result is ``"other"``.
    """
    if not low <= high:
        raise ValueError(f"zero_variance_kind needs low <= high (the reward range), got low={low}, high={high}")
    if not is_zero_variance(group_rewards, tol):
        return None
    if low == high:
        return "other"
    value = group_rewards[0]
    if abs(value - high) <= tol:
        return "max"
    if abs(value - low) <= tol:
        return "min"
    return "other"


@dataclass(frozen=True)
class FilterDecision:
    """What the filter decided for one group: its zero-variance kind (None: it has variance) and whether it is
    dropped (zero variance while dynamic sampling is on)."""

    kind: ZeroVarianceKind | None
    dropped: bool


@dataclass(frozen=True)
class GroupFilter:
    """A run's dynamic-sampling filter: on or off, its tolerance, and the reward function's declared raw range.

    Built once from the config (``GrpoSection.group_filter``) and handed to both loops, so the sync accumulator and
    the async tally book decide every group the same way. The range only splits zero-variance groups into all-max
    and all-min (metrics and messages); it never decides whether a group is dropped.
    """

    enabled: bool = True
    tol: float = 0.0
    reward_low: float = 0.0
    reward_high: float = 1.0

    def __post_init__(self) -> None:
        if not self.tol >= 0.0:
            raise ValueError(f"zero_variance_tol must be >= 0 (0 = exact equality), got {self.tol}")
        if not self.reward_low <= self.reward_high:
            raise ValueError(f"the reward range needs low <= high, got {self.reward_low} and {self.reward_high}")

    def decide(self, raw_rewards: Sequence[float]) -> FilterDecision:
        """The decision for one group's raw rewards: ``kind`` by :func:`zero_variance_kind`; dropped iff the filter
        is on and the group is zero-variance."""
        kind = zero_variance_kind(raw_rewards, self.reward_low, self.reward_high, self.tol)
        return FilterDecision(kind, self.enabled and kind is not None)
