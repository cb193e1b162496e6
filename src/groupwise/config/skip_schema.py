"""``data.skip_no_signal``: skip prompts predicted to carry no signal, before dispatch (docs/datasets.md)."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field

from groupwise.config.base import Section

ZeroVarianceOutcome = Literal["all_max", "all_min", "uniform"]
ZERO_VARIANCE_OUTCOMES: tuple[ZeroVarianceOutcome, ...] = get_args(ZeroVarianceOutcome)


class SkipNoSignalSection(Section):
    """Selective rollout: a prompt whose last ``history`` groups all had zero reward variance (all correct or all
    wrong, by the dynamic-sampling filter's rule) is skipped before dispatch, with a probability of being tried
    again, ``min(1, base_retry · growth^skips)``, that grows while it is skipped. Off by default."""

    enabled: bool = False
    """Skip prompts predicted to give a zero-variance group. When off, the other keys must keep their defaults."""
    history: int = Field(2, ge=1, le=64)
    """How many of a prompt's most recent groups must all have had zero variance for it to be skipped
    (1 ≤ k ≤ 64)."""
    base_retry: float = Field(0.1, gt=0, le=1)
    """Probability of dispatching such a prompt at its first eligible draw (0 < p ≤ 1; 1 never skips)."""
    growth: float = Field(2.0, gt=1, le=100)
    """Factor the retry probability grows by with each skip in a row (1 < g ≤ 100): after
    ``ceil(log(1/base_retry) / log(growth))`` skips in a row the prompt is dispatched for certain."""
    kinds: list[ZeroVarianceOutcome] = Field(default_factory=lambda: list(ZERO_VARIANCE_OUTCOMES), min_length=1)
    """Which zero-variance outcomes predict no signal (non-empty): ``all_max`` (every reward at the reward range's
    top: all right), ``all_min`` (all at its bottom: all wrong), ``uniform`` (any other common value). Leave out
    ``all_min`` to keep drawing prompts the policy fails, so it can still find their first right answer."""
