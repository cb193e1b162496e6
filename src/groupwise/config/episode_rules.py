"""Cross-field rules of the ``episode`` section (docs/environments.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from groupwise.config.base import changed_fields
from groupwise.config.checks import no_effect, rule
from groupwise.config.issues import ConfigIssue

if TYPE_CHECKING:
    from groupwise.config.schema import RunConfig


HARNESS_KEYS = ("harness", "harness_command", "harness_timeout_s", "tool_format", "endpoint")


@rule("episode")
def episode_keys_need_an_environment(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """The episode limits act only with episode.environment or a harness set."""
    if not cfg.episode.enabled:
        yield from no_effect(
            cfg.episode,
            "episode",
            "without episode.environment or episode.harness (single-turn completions)",
            "remove it, or set episode.environment",
            keep=("environment",),
        )


@rule("episode")
def one_driver(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """At most one of episode.environment, episode.harness and episode.harness_command; the keys of the one not
    chosen have no effect (an environment's ``kwargs`` and ``step_timeout_s``; a harness's own keys)."""
    ep = cfg.episode
    drivers = {"environment": ep.environment, "harness": ep.harness, "harness_command": ep.harness_command}
    chosen = [key for key, value in drivers.items() if value is not None]
    if len(chosen) > 1:
        yield ConfigIssue(
            f"episode.{chosen[1]}",
            drivers[chosen[1]],
            f"episode.{chosen[0]} and episode.{chosen[1]} are both set; a run's episodes are driven by one of them",
            f"keep one of {', '.join('episode.' + c for c in chosen)}",
        )
        return
    if ep.environment is not None:
        for key in HARNESS_KEYS[2:]:
            yield from _unused(cfg, key, "with episode.environment (no harness runs)")
    elif ep.harnessed:
        for key in ("kwargs", "step_timeout_s"):
            yield from _unused(cfg, key, "with a harness (there is no environment to pass it to)")


def _unused(cfg: RunConfig, key: str, why: str) -> Iterator[ConfigIssue]:
    """An issue for each key under ``episode.<key>`` set away from its default."""
    for path, value in changed_fields(cfg.episode, "episode"):
        if path == f"episode.{key}" or path.startswith(f"episode.{key}."):
            yield ConfigIssue(
                path, value, f"{path} has no effect {why} (a key with no effect is an error)", f"remove {path}"
            )


@rule("episode", "reward")
def environment_gives_the_reward(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """With episode.environment, the environment's step rewards are the reward: reward.function, reward.kwargs
    and reward.timeout_s have no effect. (A harness's reward is its own, or ``reward.function``'s on its last
    reply when it returns None.)"""
    if cfg.episode.environment is not None:
        yield from no_effect(
            cfg.reward,
            "reward",
            "with episode.environment (the environment scores each episode)",
            "remove it; pass the environment's options in episode.kwargs",
        )


@rule("episode")
def observation_fits_the_budget(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """episode.max_observation_tokens < episode.max_tokens: one answer must leave room for a model turn."""
    ep = cfg.episode
    if ep.enabled and ep.max_tokens is not None and ep.max_observation_tokens >= ep.max_tokens:
        yield ConfigIssue(
            "episode.max_observation_tokens",
            ep.max_observation_tokens,
            f"one observation may take {ep.max_observation_tokens} tokens, but the whole episode has "
            f"episode.max_tokens={ep.max_tokens}",
            "make max_observation_tokens smaller than max_tokens",
        )


@rule("episode", "mode", "async_", "generation", "runtime")
def episodes_without_partial_rollouts(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """``async.partial_rollouts: continue`` with episodes needs each turn on the generation stream (a weight load
    inside a turn, an episode resumed at its turn): the built-in engine on the embedded runtime; elsewhere an
    episode's turns go in rounds, which cannot be continued mid-turn."""
    ep, gen = cfg.episode, cfg.generation
    if not (ep.environment is not None and cfg.mode == "async" and cfg.async_.partial_rollouts != "off"):
        return
    if gen.backend != "builtin" or cfg.runtime.backend != "embedded":
        yield ConfigIssue(
            "async.partial_rollouts",
            cfg.async_.partial_rollouts,
            f"multi-turn episodes continue mid-turn only on the built-in engine's generation stream on the embedded "
            f"runtime, not with generation.backend: {gen.backend} and runtime.backend: {cfg.runtime.backend}",
            "set async.partial_rollouts: off, or use generation.backend: builtin with runtime.backend: embedded",
        )
