"""Reward post-processing: finiteness check, linear scaling, DAPO overlong shaping.

These produce the *shaped* rewards that advantages use. The zero-variance filter never sees them: it
reads the raw rewards (``Group.raw_rewards``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def check_finite_rewards(values: Sequence[float], context: str) -> None:
    """Raise ValueError naming ``context``, the row and the value if any reward is NaN or ±inf."""
    bad = [(i, v) for i, v in enumerate(values) if not math.isfinite(v)]
    if bad:
        shown = ", ".join(f"row {i}: {v}" for i, v in bad[:5])
        raise ValueError(
            f"{context}: {len(bad)} non-finite reward(s) ({shown}); the reward function must return finite "
            "floats — fix it or map failures to a finite value such as the minimum reward"
        )


def scale_rewards(
    raw: Sequence[float], source_min: float, source_max: float, target_min: float, target_max: float
) -> list[float]:
    """Clamp to the source range, then map linearly onto the target range.

    ``t_min + (clamp(r, s_min, s_max) − s_min) / (s_max − s_min) · (t_max − t_min)``
    """
    if not source_max > source_min:
        raise ValueError(
            f"reward scaling needs source_max > source_min, got source_min={source_min}, source_max={source_max}; "
            "set them to the reward function's range"
        )
    check_finite_rewards(raw, "scale_rewards")
    span = (target_max - target_min) / (source_max - source_min)
    return [target_min + (min(max(r, source_min), source_max) - source_min) * span for r in raw]


def overlong_penalty(
    length: int, max_response_length: int, overlong_buffer_length: int, overlong_buffer_penalty: float
) -> float:
    """DAPO soft overlong punishment for a response of ``length`` tokens.

    ``clip(−(L − (max − buf)) / buf · penalty, −penalty, 0)``: 0 up to ``max − buf`` tokens, then linear down
    to ``−penalty`` at ``max`` tokens, and capped there (as in the DAPO paper; an uncapped penalty keeps
    falling beyond ``max``).
    """
    if overlong_buffer_length <= 0 or overlong_buffer_length > max_response_length:
        raise ValueError(
            f"overlong_buffer_length must be in 1..max_response_length={max_response_length}, "
            f"got {overlong_buffer_length}"
        )
    if overlong_buffer_penalty < 0:
        raise ValueError(f"overlong_buffer_penalty must be >= 0, got {overlong_buffer_penalty}")
    if length < 0:
        raise ValueError(f"response length must be >= 0, got {length}")
    expected = max_response_length - overlong_buffer_length
    penalty = -(length - expected) / overlong_buffer_length * overlong_buffer_penalty
    return min(max(penalty, -overlong_buffer_penalty), 0.0)


def shape_rewards(
    rewards: Sequence[float],
    lengths: Sequence[int],
    max_response_length: int,
    overlong_buffer_length: int,
    overlong_buffer_penalty: float,
) -> list[float]:
    """``r_i + overlong_penalty(L_i, …)`` for each row (lengths in completion tokens)."""
    if len(rewards) != len(lengths):
        raise ValueError(f"shape_rewards: {len(rewards)} rewards but {len(lengths)} lengths; need one length per row")
    return [
        r + overlong_penalty(n, max_response_length, overlong_buffer_length, overlong_buffer_penalty)
        for r, n in zip(rewards, lengths, strict=True)
    ]
