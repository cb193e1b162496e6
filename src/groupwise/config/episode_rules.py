"""Cross-field rules of the ``episode`` section (docs/environments.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from groupwise.config.checks import no_effect, rule
from groupwise.config.issues import ConfigIssue

if TYPE_CHECKING:
    from groupwise.config.schema import RunConfig


@rule("episode")
def episode_keys_need_an_environment(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """The episode limits act only with episode.environment set."""
    if not cfg.episode.enabled:
        yield from no_effect(cfg.episode, "episode", "without episode.environment (single-turn completions)",
                             "remove it, or set episode.environment", keep=("environment",))


@rule("episode", "reward")
def environment_gives_the_reward(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """With episode.environment, the environment's step rewards are the reward: reward.function, reward.kwargs
    and reward.timeout_s have no effect."""
    if cfg.episode.enabled:
        yield from no_effect(cfg.reward, "reward", "with episode.environment (the environment scores each episode)",
                             "remove it; pass the environment's options in episode.kwargs")


@rule("episode")
def observation_fits_the_budget(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """episode.max_observation_tokens < episode.max_tokens: one answer must leave room for a model turn."""
    ep = cfg.episode
    if ep.enabled and ep.max_tokens is not None and ep.max_observation_tokens >= ep.max_tokens:
        yield ConfigIssue(
            "episode.max_observation_tokens", ep.max_observation_tokens,
            f"one observation may take {ep.max_observation_tokens} tokens, but the whole episode has "
            f"episode.max_tokens={ep.max_tokens}", "make max_observation_tokens smaller than max_tokens",
        )  # fmt: skip


@rule("episode", "mode", "async_")
def episodes_without_partial_rollouts(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """Episodes generate turn by turn between environment steps; async.partial_rollouts: continue (weights swapped
    inside a running decode loop, resumed mid-row) does not apply to them yet."""
    if cfg.episode.enabled and cfg.mode == "async" and cfg.async_.partial_rollouts != "off":
        yield ConfigIssue(
            "async.partial_rollouts", cfg.async_.partial_rollouts,
            "multi-turn episodes (episode.environment) run turn by turn and cannot be continued mid-row yet",
            "set async.partial_rollouts: off",
        )  # fmt: skip
