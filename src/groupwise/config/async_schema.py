"""The ``async`` section: which staleness sampler the single controller uses, buffer capacity, rollout failure
handling. Valid only with ``mode: async`` (in sync mode every key must keep its default).

The sampler is a union discriminated on ``name``; each sampler accepts only its own knobs, so a knob of
another sampler (``max_lookahead_versions`` under ``ready_first``) is an error naming the owner. These classes are
the one declaration of the samplers' knobs (type, bound, default, meaning): the controller builds each sampler
from its config object (``groupwise.controller.samplers.build_sampler``).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, TypeAdapter, field_validator

from groupwise.algo.step_size import gated_buffer_capacity
from groupwise.config.base import Section, invalid


class InOrderSamplerConfig(Section):
    """Trains step s only on groups dispatched for step s (stamped); admits at most ``max_lookahead_versions``
    steps ahead of the trainer. With lookahead 0 it is on-policy; with full batches, dynamic sampling off and
    ``on_dropped_prompt: shrink`` it trains the sync loop's prompts in order (``replace`` diverts loader batches
    to the spare pool; see docs/samplers.md)."""

    name: Literal["in_order"] = "in_order"
    """Sampler name."""
    max_lookahead_versions: int = Field(1, ge=0)
    """Dispatch batches admitted beyond the trainer's current step (≥ 0; 0 = on-policy)."""

    gated: ClassVar[bool] = True

    @property
    def window(self) -> int | None:
        """Versions a trained group may lag its step (the lookahead)."""
        return self.max_lookahead_versions


class ReadyFirstSamplerConfig(Section):
    """Trains on whichever groups finished first, in dispatch order, mixing versions; admission is gated to
    ``max_staleness_versions`` versions ahead, selection is not (slow stragglers can be older)."""

    name: Literal["ready_first"] = "ready_first"
    """Sampler name."""
    max_staleness_versions: int = Field(1, ge=0)
    """Admission window in weight versions (≥ 0)."""

    gated: ClassVar[bool] = True

    @property
    def window(self) -> int | None:
        """Versions a trained group may lag the trainer (the staleness knob)."""
        return self.max_staleness_versions


class WindowedSamplerConfig(Section):
    """Ungated dispatch; trains only groups whose start version is within ``max_staleness_versions`` of the
    trainer, evicts older ready groups and aborts older in-flight ones."""

    name: Literal["windowed"] = "windowed"
    """Sampler name."""
    max_staleness_versions: int = Field(1, ge=0)
    """Selection window in weight versions (≥ 0)."""
    sample_freshest_first: bool = False
    """Select the freshest eligible groups first instead of dispatch order."""

    gated: ClassVar[bool] = False  # dispatch is bounded only by max_buffered_rollouts

    @property
    def window(self) -> int | None:
        """Versions a trained group may lag the trainer (the staleness knob)."""
        return self.max_staleness_versions


class WeightFifoSamplerConfig(Section):
    """Builds each step from groups of a single start version, oldest version first. Cannot be combined with
    dynamic sampling: a filtered group's replacement is generated under a newer version, so the old version's
    step never fills and training would hang."""

    name: Literal["weight_fifo"] = "weight_fifo"
    """Sampler name."""
    max_staleness_versions: int = Field(1, ge=0)
    """Admission and selection window in weight versions (≥ 0)."""

    gated: ClassVar[bool] = True

    @property
    def window(self) -> int | None:
        """Versions a trained group may lag the trainer (the staleness knob)."""
        return self.max_staleness_versions


class CustomSamplerConfig(Section):
    """A user sampler class, constructed as ``Class(buffer, **kwargs)``; its capacity need is checked at
    runtime."""

    name: Literal["custom"] = "custom"
    """Sampler name."""
    target: str
    """Importable class as ``package.module:ClassName`` (required)."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments passed to the class after the buffer."""

    gated: ClassVar[bool] = False  # unknown until the class is built; checked at runtime

    @property
    def window(self) -> int | None:
        """Unknown until the class is built."""
        return None

    @field_validator("target")
    @classmethod
    def _target_is_module_colon_class(cls, target: str) -> str:
        module, sep, attr = target.partition(":")
        if not (sep and module.strip() and attr.strip() and ":" not in attr):
            raise invalid(
                "async.sampler.target must be 'module:ClassName'",
                "give an importable class, e.g. 'my_project.samplers:MySampler'",
            )
        return target


SamplerConfig = Annotated[
    InOrderSamplerConfig
    | ReadyFirstSamplerConfig
    | WindowedSamplerConfig
    | WeightFifoSamplerConfig
    | CustomSamplerConfig,
    Field(discriminator="name"),
]
SAMPLER_CONFIGS: dict[str, type[Section]] = {
    "in_order": InOrderSamplerConfig,
    "ready_first": ReadyFirstSamplerConfig,
    "windowed": WindowedSamplerConfig,
    "weight_fifo": WeightFifoSamplerConfig,
    "custom": CustomSamplerConfig,
}
DEFAULT_SAMPLER = "ready_first"
_SAMPLER_ADAPTER: TypeAdapter[SamplerConfig] = TypeAdapter(SamplerConfig)


def sampler_config(name: str, **knobs: Any) -> SamplerConfig:  # Any: the sampler's own fields, passed through
    """The validated config of sampler ``name`` with ``knobs`` (the others keep their defaults), as
    ``async.sampler`` would load it; an unknown name or another sampler's knob raises pydantic's ValidationError."""
    return _SAMPLER_ADAPTER.validate_python({"name": name, **knobs})


def sampler_knob_owners(knob: str) -> list[str]:
    """The sampler names that accept ``knob`` (used to explain a knob given to the wrong sampler)."""
    return [name for name, cls in SAMPLER_CONFIGS.items() if knob in cls.model_fields and knob != "name"]


def required_buffer_capacity(sampler: SamplerConfig, prompts_per_step: int) -> int | None:
    """Least ``max_buffered_rollouts`` that cannot deadlock: ``P × (window + 1)`` for a gated sampler
    (the live step plus ``window`` admitted ahead); ``None`` when ungated (windowed) or unknown (custom)."""
    if not sampler.gated or sampler.window is None:
        return None
    return gated_buffer_capacity(prompts_per_step, sampler.window)


class RolloutFailureSection(Section):
    """What happens when a prompt's rollout fails or (with dynamic sampling) is filtered."""

    on_dropped_prompt: Literal["replace", "shrink"] = "replace"
    """``replace`` = substitute a spare prompt for a lost one; ``shrink`` = the step trains on fewer groups."""
    max_replacement_attempts: int = Field(16, ge=1)
    """Spare prompts tried per dispatch slot (≥ 1)."""
    replacement_reserve_prompts: int = Field(16, ge=1)
    """Spare-pool low-water mark in prompts (≥ 1); a whole loader batch is diverted when below it."""
    min_step_batch_fraction: float = Field(0.5, gt=0, le=1)
    """A step needs at least ``ceil(P × fraction)`` groups after losses, else the run stops (0 < f ≤ 1)."""
    max_infra_attempts_per_prompt: int = Field(5, ge=1)
    """Attempts per prompt against infrastructure failures (timeouts, lost workers) (≥ 1)."""
    max_data_attempts_per_prompt: int = Field(2, ge=1)
    """Attempts per prompt against data failures (any other exception) (≥ 1)."""
    backoff_base_s: float = Field(1.0, ge=0)
    """First retry delay in seconds (≥ 0); doubles per attempt."""
    max_backoff_s: float = Field(30.0, ge=0)
    """Longest retry delay in seconds (≥ ``backoff_base_s``)."""
    max_skipped_prompts: int = Field(0, ge=0)
    """Prompts that may exhaust their data attempts over the whole run (≥ 0; 0 = the first one stops the run)."""
    max_consecutive_dropped_prompts: int = Field(0, ge=0)
    """Consecutive prompts that may exhaust their infra attempts (≥ 0; 0 = the first one stops the run)."""


class AsyncSection(Section):
    """The async single controller (``mode: async`` only)."""

    sampler: SamplerConfig = Field(default_factory=ReadyFirstSamplerConfig)
    """Staleness sampler, chosen by ``name``: ``in_order``, ``ready_first`` (default when ``name`` is omitted),
    ``windowed``, ``weight_fifo``, ``custom``."""
    min_groups_for_streaming_train: int | None = None
    """Smallest chunk of groups the trainer takes at once (1 ≤ x ≤ P); ``null`` = P (full batches)."""
    max_inflight_prompts: int = Field(32, ge=1)
    """Prompts being generated at once (≥ 1)."""
    max_buffered_rollouts: int = Field(64, ge=1)
    """Groups in flight or buffered but not yet trained (≥ 1; ≥ P × (window + 1) for gated samplers)."""
    rollout_failure: RolloutFailureSection = Field(default_factory=RolloutFailureSection)
    """Failure budgets, retries and replacement."""
    partial_rollouts: Literal["off", "continue"] = "off"
    """What a weight sync does to the generations in flight (docs/samplers.md, "Partial rollouts"): ``off``
    (default) = each runs to its end under the version it started with (with continuous batching the sync waits for
    the rows still generating: every completion has one weight version); ``continue`` = the new weights are loaded
    at the next token boundary and the rows go on under them, so one completion's tokens can come from several
    versions (``Completion.token_versions``; each token keeps its sampling-time logprob). A group's staleness is
    still measured from its oldest token (``start_version``). Training with ``continue`` needs
    ``generation.continuous_batching: true``; ``groupwise simulate`` models it without. YAML reads a bare ``off``
    as false, which means ``off`` here."""
    partial_rollout_kv: Literal["recompute", "keep"] = "recompute"
    """With ``partial_rollouts: continue``, the KV cache of rows that go on under new weights: ``recompute`` =
    rebuilt under the new weights (one prefill of prompt + tokens so far per row), so every later token is
    sampled from the new policy exactly; ``keep`` = left as computed under the older versions (no recompute), so a
    later token's distribution, and its recorded logprob, conditions on stale keys and values: the behaviour
    policy is a mix of versions (still the one that sampled it, so importance weights stay exact). The default
    follows the backend: ``recompute`` for the built-in engine, ``keep`` under ``generation.backend: vllm`` (the one
    value vLLM can do). ``groupwise simulate`` and ``plan`` with ``sim.job`` charge ``recompute`` at each weight sync
    as a prefill of every running row's whole context on its replica, ``(2·A·Σc + 2·ℓ·h·Σc²) / (TP·F·μ)`` seconds
    (``docs/simulator.md``), and ``keep`` nothing; the toy simulator (no ``sim.job``) charges neither and refuses
    ``keep``."""

    @field_validator("partial_rollouts", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:  # Any: pydantic's raw input, before validation
        return "off" if value is False else value

    @field_validator("sampler", mode="before")
    @classmethod
    def _default_sampler_name(cls, sampler: Any) -> Any:  # Any: pydantic's raw input, before validation
        """Omitting ``name`` means the default sampler, so its own knobs can be set without naming it."""
        if sampler is None:
            return {"name": DEFAULT_SAMPLER}
        if isinstance(sampler, dict) and "name" not in sampler:
            return {"name": DEFAULT_SAMPLER, **sampler}
        return sampler
