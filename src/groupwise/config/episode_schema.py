"""``episode``: multi-turn episodes, where the model acts and an environment answers (docs/environments.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from groupwise.config.base import Section, invalid

#: The environments shipped with groupwise (``groupwise.environments``): the names ``episode.environment`` takes,
#: and the factory each stands for.
BUILTIN_ENVIRONMENTS = {
    "calculator": "groupwise.environments.calculator:CalculatorEnvironment",
    "guess_number": "groupwise.environments.guess_number:GuessNumberEnvironment",
    "number_walk": "groupwise.environments.number_walk:NumberWalkEnvironment",
    "python_sandbox": "groupwise.environments.python_sandbox:PythonSandboxEnvironment",
}


class EndpointSection(Section):
    """The OpenAI-compatible endpoint a harness calls (docs/harnesses.md)."""

    host: str = "127.0.0.1"
    """The address it listens on: the loopback address unless you bind elsewhere on purpose (every request still
    needs its session's key)."""
    port: int = Field(0, ge=0, le=65_535)
    """The port (0 = a free one, chosen when the run starts; the harness gets the URL in its session)."""
    max_body_bytes: int = Field(1_000_000, ge=1_024, le=1_000_000_000)
    """The largest request body accepted (larger: HTTP 413)."""
    batch_window_s: float = Field(0.05, ge=0.0, le=10.0)
    """Without a generation stream (the sync loop, evaluation, vLLM, Ray): the longest the first queued request
    waits for the other sessions' requests before its batch is sampled."""
    model_name: str = "policy"
    """The model name ``/v1/models`` lists and responses carry (any name is accepted in requests)."""


class EpisodeSection(Section):
    """Multi-turn episodes: each of a group's G completions is an episode of model turns and environment answers,
    scored by the environment; only the model's tokens train."""

    environment: str | None = None
    """``null`` = single-turn (a completion scored by ``reward``); a built-in environment (``calculator``,
    ``guess_number``, ``number_walk``, ``python_sandbox``) or ``module:Class`` (any callable making one environment
    per episode, called with ``episode.kwargs``)."""
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
    """Seconds one environment call (its constructor, ``reset`` or ``step``) may take (0 < t ≤ 86,400); past it the
    episode's group fails like a reward failure (async: retried, then skipped; sync: the run stops naming the
    environment)."""
    harness: str | None = None
    """Your own agent as ``package.module:function``, called once per sample with a ``HarnessSession``
    (``base_url``, ``api_key``, the prompt row) and returning its reward, or ``None`` to let ``reward.function``
    score its last reply: every request it makes to the endpoint is recorded, and its sessions train
    (docs/harnesses.md). Instead of ``environment``."""
    harness_command: list[str] | None = None
    """Your own agent as a program (an argv list, no shell), run once per sample with ``OPENAI_BASE_URL``,
    ``OPENAI_API_KEY`` and ``OPENAI_MODEL`` set and the session as JSON on its standard input; its reward is its
    last line of output or what it writes to ``$GROUPWISE_REWARD_FILE`` (docs/harnesses.md)."""
    harness_timeout_s: float = Field(300.0, gt=0, le=86_400)
    """Seconds one session's harness may run; past it the harness is stopped (a command with its process group)
    and its group fails with a fate naming it, never a reward of 0."""
    retry_failed_episodes: int = Field(0, ge=0, le=100)
    """Times a failed episode starts over from its opening with a fresh environment (a failed harness session with a
    fresh session) before its group fails (0 ≤ N ≤ 100; 0 = the group fails at once). A failure is the
    environment's (it raised, ran past ``step_timeout_s``, answered something that is not a ``StepResult``; a tool
    that raised ``ToolInfrastructureError``) or the harness's (docs/harnesses.md), never a tool call the model got
    wrong, which stays an answer the model reads. Same seeds: on unchanged weights a retry samples what the failed
    attempt sampled (``episode/retries``, ``episode/retried_tokens``)."""
    max_consecutive_failures: int = Field(100, ge=0)
    """Failed episodes in a row (retried ones included, none finishing between them) after which the run stops,
    naming the environment or harness and the last errors (≥ 0; 0 = never stop for this): an environment, sandbox
    or harness that is down must not fail prompt after prompt. Async stops at once, whatever
    ``async.rollout_failure``; the checkpoint and ``fates.jsonl`` keep what was done."""
    tool_format: Literal["auto", "hermes", "llama3_json", "mistral"] = "auto"
    """How the model writes tool calls, which the endpoint returns as OpenAI ``tool_calls``: ``auto`` = the family
    whose markers the chat template renders (``hermes``'s ``<tool_call>`` when none)."""
    endpoint: EndpointSection = Field(default_factory=EndpointSection)
    """Where the harness endpoint listens and what it accepts."""

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

    @field_validator("harness")
    @classmethod
    def _importable(cls, value: str | None) -> str | None:
        module, sep, attr = (value or "").partition(":")
        if value is None or (sep and module.strip() and attr.strip() and ":" not in attr):
            return value
        raise invalid("episode.harness must be 'package.module:function'",
                      "name the function that runs your agent for one sample, e.g. my_agent:run")  # fmt: skip

    @field_validator("harness_command")
    @classmethod
    def _argv(cls, value: list[str] | None) -> list[str] | None:
        if value is None or (value and value[0].strip()):
            return value
        raise invalid("episode.harness_command must be a non-empty argv list whose first item is the program",
                      "e.g. [python, my_agent.py]: no shell, each argument its own item")  # fmt: skip

    @property
    def enabled(self) -> bool:
        """Multi-turn: an environment answers the model, or a harness drives it."""
        return self.environment is not None or self.harnessed

    @property
    def harnessed(self) -> bool:
        """The model is driven by the user's own agent through the endpoint."""
        return self.harness is not None or self.harness_command is not None

    def token_budget(self, max_new_tokens: int) -> int:
        """``max_tokens``, or its default from the turn and observation caps."""
        if self.max_tokens is not None:
            return self.max_tokens
        return self.max_turns * max_new_tokens + (self.max_turns - 1) * self.max_observation_tokens
