"""``episode``: multi-turn episodes, where the model acts and an environment answers (docs/environments.md)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from groupwise.config.base import Section, invalid

#: The environments shipped with groupwise (``groupwise.environments``): the names ``episode.environment`` takes,
#: and the factory each stands for.
BUILTIN_ENVIRONMENTS = {
    "calculator": "groupwise.environments.calculator:CalculatorEnvironment",
    "guess_number": "groupwise.environments.guess_number:GuessNumberEnvironment",
    "number_walk": "groupwise.environments.number_walk:NumberWalkEnvironment",
}


class EpisodeSection(Section):
    """Multi-turn episodes: each of a group's G completions is an episode of model turns and environment answers,
    scored by the environment; only the model's tokens train."""

    environment: str | None = None
    """``null`` = single-turn (a completion scored by ``reward``); a built-in environment (``calculator``,
    ``guess_number``, ``number_walk``) or ``module:Class`` (any callable making one environment per episode, called with
    ``episode.kwargs``)."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments passed to the environment factory."""
    chat_template: str | None = None
    """How conversations become tokens: ``null`` = the tokenizer's own chat template; ``plain`` = groupwise's
    ``role: content`` lines (for a model without one, e.g. a base or tiny model); or a Jinja chat template. It must
    be append-only (a longer conversation renders as the shorter one plus new text): checked before training."""
    max_turns: int = Field(4, ge=1)
    """Model turns per episode at most (≥ 1); an episode that reaches it ends (``max_turns``, counted)."""
    max_tokens: int | None = Field(None, ge=1)
    """Tokens after the opening prompt per episode, the model's and the environment's together (≥ 1); a turn may
    sample only what is left, and an observation that does not fit ends the episode (``token_budget``, counted);
    ``null`` = ``max_turns × generation.max_new_tokens + (max_turns − 1) × max_observation_tokens``. Prompt plus
    budget must fit the model's positions."""
    max_observation_tokens: int = Field(256, ge=1)
    """Tokens one environment answer may take (≥ 1), chat-template framing included; a longer answer's text is cut
    to fit and marked ``…[truncated]`` (``episode/truncated_observations``)."""
    step_timeout_s: float = Field(30.0, gt=0, le=86_400)
    """Seconds one environment call (``reset`` or ``step``) may take (0 < t ≤ 86,400); past it the episode's group
    fails like a reward failure (async: retried, then skipped; sync: the run stops naming the environment)."""

    @field_validator("environment")
    @classmethod
    def _builtin_or_importable(cls, value: str | None) -> str | None:
        if value is None or value in BUILTIN_ENVIRONMENTS:
            return value
        module, sep, attr = value.partition(":")
        if sep and module.strip() and attr.strip() and ":" not in attr:
            return value
        raise invalid(
            f"episode.environment must be one of {', '.join(BUILTIN_ENVIRONMENTS)} or 'module:Class'",
            "pick a built-in environment, or give an importable factory as 'package.module:ClassName'",
        )

    @field_validator("chat_template")
    @classmethod
    def _plain_or_jinja(cls, value: str | None) -> str | None:
        if value is None or value == "plain" or "{{" in value or "{%" in value:
            return value
        raise invalid(
            "episode.chat_template must be null (the tokenizer's own), 'plain', or a Jinja chat template",
            "use plain for a model without a chat template, or paste the template text",
        )

    @property
    def enabled(self) -> bool:
        return self.environment is not None

    def token_budget(self, max_new_tokens: int) -> int:
        """``max_tokens``, or its default from the turn and observation caps."""
        if self.max_tokens is not None:
            return self.max_tokens
        return self.max_turns * max_new_tokens + (self.max_turns - 1) * self.max_observation_tokens
