"""The ``episode`` section checked against the machine before any model loads: the environment factory imports,
makes an environment, and that environment has ``reset`` and ``step`` (and its tools have schemas)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from groupwise.config import ConfigError, ConfigIssue
from groupwise.environments import ENVIRONMENTS
from groupwise.episodes.deadline import StepTimeout, call_with_deadline
from groupwise.episodes.environment import (
    Environment,
    EnvironmentFactory,
    EnvironmentSpecError,
    OffersTools,
    environment_factory,
)
from groupwise.episodes.episode import EpisodeLimits
from groupwise.episodes.failure_streak import FailureStreak
from groupwise.episodes.group import EpisodeSettings
from groupwise.episodes.template import PLAIN_CHAT_TEMPLATE, ChatRenderer, append_only_problem
from groupwise.episodes.tool_env import ToolEnvironment
from groupwise.episodes.tools import tool_problem, tool_schema
from groupwise.model.encode import has_chat_template

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from transformers import PreTrainedTokenizerBase

    from groupwise.config import RunConfig


@dataclass(frozen=True)
class EnvironmentSpec:
    """A checked ``episode.environment``: its factory and the tools its environments offer."""

    name: str
    factory: EnvironmentFactory
    tools: Sequence[Callable[..., Any]] = ()


def episode_environment(cfg: RunConfig) -> tuple[EnvironmentSpec | None, list[ConfigIssue]]:
    """``(the environment spec, [])``, ``(None, [])`` for single-turn runs, or ``(None, [the issue])``."""
    name = cfg.episode.environment
    if name is None:
        return None, []
    key, fix = "episode.environment", "give an importable factory as 'package.module:ClassName' taking episode.kwargs"
    timeout_s = cfg.episode.step_timeout_s
    try:
        factory = environment_factory(name, cfg.episode.kwargs, ENVIRONMENTS)
        probe = call_with_deadline(factory, timeout_s, "groupwise-env-probe")
    except EnvironmentSpecError as exc:
        return None, [ConfigIssue(key, name, str(exc), fix)]
    except StepTimeout:
        return None, [ConfigIssue(key, name, f"making one environment took longer than episode.step_timeout_s="
                                  f"{timeout_s:g} s (every episode makes one, under that deadline)",
                                  "make the constructor faster (load shared data once, at import), or raise "
                                  "episode.step_timeout_s")]  # fmt: skip
    except Exception as exc:  # the user's constructor raised on episode.kwargs
        return None, [ConfigIssue("episode.kwargs", cfg.episode.kwargs,
                                  f"making an environment with these kwargs failed: {type(exc).__name__}: {exc}",
                                  f"pass the keyword arguments {name} takes")]  # fmt: skip
    if not isinstance(probe, Environment):
        return None, [ConfigIssue(key, name, f"it made a {type(probe).__name__}, which has no reset(prompt, "
                                  "sample_index) and step(assistant_message)", fix)]  # fmt: skip
    if isinstance(probe, ToolEnvironment) and probe.tool_timeout_s >= cfg.episode.step_timeout_s:
        return None, [ConfigIssue("episode.step_timeout_s", cfg.episode.step_timeout_s,
                                  f"{name}'s tools may each run {probe.tool_timeout_s:g} s (tool_timeout_s), so a "
                                  "turn of hanging tool calls would fail its group instead of answering the model",
                                  f"set episode.step_timeout_s above {probe.tool_timeout_s:g}, or lower the "
                                  "environment's tool_timeout_s")]  # fmt: skip
    tools = tuple(probe.tools) if isinstance(probe, OffersTools) else ()
    for tool in tools:
        problem = tool_problem(tool)
        if problem is not None:
            return None, [ConfigIssue(key, name, f"one of its tools cannot be offered to a model: {problem}",
                                      "give each tool typed parameters and a docstring with a description and an "
                                      "Args: entry per parameter")]  # fmt: skip
    return EnvironmentSpec(name, factory, tools), []


def episode_settings(
    cfg: RunConfig, spec: EnvironmentSpec, tokenizer: PreTrainedTokenizerBase, positions: int | None
) -> EpisodeSettings:
    """The ``episode`` section resolved against the loaded tokenizer: :class:`ConfigError` when its chat template
    is missing or not append-only (probed on a conversation of ``episode.max_turns`` assistant turns, at least
    four)."""
    section, key = cfg.episode, "episode.chat_template"
    template = PLAIN_CHAT_TEMPLATE if section.chat_template == "plain" else section.chat_template
    if template is None and not has_chat_template(tokenizer):
        raise ConfigError([ConfigIssue(key, None, "the tokenizer has no chat template to render an episode's turns",
                                       "set episode.chat_template: plain, or give a Jinja chat template")])
    try:
        renderer = ChatRenderer(tokenizer, [tool_schema(t) for t in spec.tools], template)
    except Exception as exc:  # no EOS token to end a turn with; a tool transformers cannot describe
        raise ConfigError([ConfigIssue("episode.environment", spec.name, f"its episodes cannot be rendered: "
                                       f"{type(exc).__name__}: {exc}", "see docs/environments.md, Tools")]) from exc
    problem = append_only_problem(renderer, section.max_turns)
    if problem is not None:
        raise ConfigError([ConfigIssue(
            key, section.chat_template, f"episodes cannot use this chat template: {problem}",
            "use a template that renders earlier turns unchanged and ends an assistant turn with the EOS token "
            "(episode.chat_template: plain always does)",
        )])  # fmt: skip
    max_new = cfg.generation.max_new_tokens
    limits = EpisodeLimits(section.max_turns, section.token_budget(max_new), section.max_observation_tokens, max_new,
                           positions)  # fmt: skip
    streak = FailureStreak(section.max_consecutive_failures, f"environment {spec.name!r}")
    return EpisodeSettings(spec.name, spec.factory, renderer, limits, section.step_timeout_s,
                           retries=section.retry_failed_episodes, streak=streak)  # fmt: skip
