"""Cross-field rules of ``data.skip_no_signal`` (selective rollout; docs/datasets.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from groupwise.config.checks import no_effect, rule
from groupwise.config.issues import ConfigIssue

if TYPE_CHECKING:
    from groupwise.config.schema import RunConfig


@rule("data")
def skip_keys_need_skipping(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """data.skip_no_signal keys keep their defaults unless data.skip_no_signal.enabled is true."""
    skip = cfg.data.skip_no_signal
    if not skip.enabled:
        yield from no_effect(skip, "data.skip_no_signal", "with data.skip_no_signal.enabled false",
                             "remove it, or set data.skip_no_signal.enabled: true", keep=("enabled",))


@rule("data", "grpo")
def skipping_needs_groups(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """data.skip_no_signal needs G ≥ 2: a group of one always has zero variance, so every prompt would be skipped."""
    g = cfg.grpo.num_generations_per_prompt
    if cfg.data.skip_no_signal.enabled and g < 2:
        yield ConfigIssue(
            "data.skip_no_signal.enabled", True,
            "skipping prompts with no signal needs at least 2 generations per prompt (a group of 1 always has zero "
            "variance, so every prompt would be predicted to carry none)",
            "set grpo.num_generations_per_prompt ≥ 2, or data.skip_no_signal.enabled: false",
        )
