"""Group-relative baselines and advantages (GRPO), computed per whole group.

Normalisation treats a trivial std by EXACT equality of the rewards it is taken over (the whole group, or the
whole batch), never by a float threshold: a float std of identical rewards can come out as a tiny residue (e.g.
~4.6e-4 in fp32) and dividing by it blows the advantage up to ~−2000 (docs/design.md). The std is the population
std (÷ G), not torch's default unbiased one (÷ G − 1) that TRL divides by: docs/learner.md says what that changes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from groupwise.algo.reward_shaping import check_finite_rewards

BaselineKind = Literal["mean", "leave_one_out"]


def _all_equal(values: Sequence[float]) -> bool:
    return all(v == values[0] for v in values)


def _mean(values: Sequence[float]) -> float:
    """Mean that is exactly the common value when all values are equal (so ``r − mean`` is exactly 0)."""
    return values[0] if _all_equal(values) else math.fsum(values) / len(values)


def group_std(rewards: Sequence[float]) -> float:
    """Population std of one group: ``sqrt(Σ (r_i − mean)² / G)``; exactly 0 when all rewards are equal."""
    mean = _mean(rewards)
    return math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards))


def group_baselines(rewards: Sequence[float], kind: BaselineKind) -> list[float]:
    """One baseline per row of one group.

    ``mean``: ``b_i = mean(r)``. ``leave_one_out``: ``b_i = mean(r_j for j ≠ i)``, the mean of the other
    G − 1 rows (for G = 2, the other row); needs G ≥ 2.
    """
    if len(rewards) == 0:
        raise ValueError("group_baselines: a group needs at least one reward")
    check_finite_rewards(rewards, "group_baselines")
    if kind == "mean":
        return [_mean(rewards)] * len(rewards)
    if kind == "leave_one_out":
        if len(rewards) < 2:
            raise ValueError(
                f"leave_one_out baseline needs at least 2 rows per group, got {len(rewards)}; use "
                "num_generations >= 2 or baseline 'mean'"
            )
        return [_mean([r for j, r in enumerate(rewards) if j != i]) for i in range(len(rewards))]
    raise ValueError(f"unknown baseline kind {kind!r}; use 'mean' or 'leave_one_out'")


def group_advantages(
    rewards: Sequence[float], baseline: BaselineKind, normalize: bool, eps: float = 1e-6
) -> list[float]:
    """Advantages of one group: ``A_i = (r_i − b_i) / (σ + eps)``, or ``r_i − b_i`` when not ``normalize``.

    ``σ`` is the POPULATION std of the whole group, ``sqrt(Σ (r_j − mean)² / G)`` (:func:`group_std`), for both
    baselines, and every row is divided by the same ``σ``: the division is decided on whole-group equality (all
    rewards equal ⇒ every ``A_i`` is exactly 0), never per row. So the advantages of a group sum to 0 with either
    baseline, and ``leave_one_out`` is the ``mean`` baseline scaled by ``G / (G − 1)``:
    ``r_i − mean(r_{j≠i}) = G/(G − 1) · (r_i − mean(r))``. E.g. ``[1, 0, 0, 0]`` gives ``[√3, −1/√3, −1/√3,
    −1/√3]`` with ``mean`` and ``[4/√3, −4/(3√3), …]`` ≈ ``[2.31, −0.77, −0.77, −0.77]`` with ``leave_one_out``;
    ``[1, 0]`` gives ``[1, −1]`` and ``[2, −2]``. With ``mean``, ``|A_i| ≤ sqrt(G − 1)`` whatever the rewards.
    """
    baselines = group_baselines(rewards, baseline)
    if _all_equal(rewards):
        return [0.0] * len(rewards)
    diffs = [r - b for r, b in zip(rewards, baselines, strict=True)]
    if not normalize:
        return diffs
    scale = group_std(rewards) + eps
    return [d / scale for d in diffs]


def batch_normalized_advantages(
    groups_rewards: Sequence[Sequence[float]], baseline: BaselineKind, eps: float = 1e-6
) -> list[list[float]]:
    """Group baselines, batch-level scale: ``A_i = (r_i − b_i) / (std(every reward of the batch) + eps)``.

    The baseline is per group (as :func:`group_baselines`), the std is the population std over the rewards of
    every group given (the step's groups), so one scale serves the whole step: a group whose rewards spread little
    gets small advantages instead of being blown up to unit scale. All rewards of the batch equal ⇒ every ``A_i``
    is exactly 0. "Group mean, batch std": Liu et al. 2025, "Part I: Tricks or Traps? A Deep Dive into RL for LLM
    Reasoning", arXiv:2508.08221 (TRL's ``scale_rewards: batch``).
    """
    diffs = []
    for rewards in groups_rewards:
        baselines = group_baselines(rewards, baseline)
        diffs.append([0.0 if _all_equal(rewards) else r - b for r, b in zip(rewards, baselines, strict=True)])
    every = [r for rewards in groups_rewards for r in rewards]
    if not every or _all_equal(every):
        return [[0.0] * len(rewards) for rewards in groups_rewards]
    scale = group_std(every) + eps
    return [[d / scale for d in group] for group in diffs]


def clip_advantages(values: Sequence[float], low: float | None = None, high: float | None = None) -> list[float]:
    """``min(max(A, low), high)`` per value; a bound that is None is not applied."""
    if low is not None and high is not None and low > high:
        raise ValueError(f"clip_advantages needs low <= high, got low={low}, high={high}")
    clipped = []
    for v in values:
        if low is not None:
            v = max(v, low)
        if high is not None:
            v = min(v, high)
        clipped.append(v)
    return clipped
