"""``RunConfig``: the whole run in one typed object. Constructing one (from YAML, a dict, or Python) runs every
cross-field rule and raises a single :class:`ConfigError` listing all violations."""

from __future__ import annotations

from typing import Literal

import yaml
from pydantic import ConfigDict, Field, model_validator

# Importing the rule modules registers their rules (they are used only through the registry).
import groupwise.config.async_rules
import groupwise.config.backend_rules
import groupwise.config.engine_rules
import groupwise.config.episode_rules
import groupwise.config.hazards
import groupwise.config.loss_rules
import groupwise.config.rules
import groupwise.config.skip_rules  # noqa: F401
from groupwise.algo.step_size import round_size
from groupwise.config.algorithm import GrpoSection, LossSection, OptimizerSection
from groupwise.config.async_schema import AsyncSection
from groupwise.config.base import Section
from groupwise.config.checks import run_hazards, run_rules
from groupwise.config.episode_schema import EpisodeSection
from groupwise.config.generation_schema import GenerationSection
from groupwise.config.issues import ConfigError, ConfigIssue
from groupwise.config.learner_schema import LearnerSection
from groupwise.config.model_schema import ModelSection
from groupwise.config.runtime_schema import RuntimeSection, SimSection
from groupwise.config.sections import (
    CheckpointSection,
    DataSection,
    EvalSection,
    LoggingSection,
    RewardSection,
    RunSection,
    SftSection,
)


class RunConfig(Section):
    """Everything a run needs. Defaults are a DAPO recipe: clip-higher (0.2/0.28), token-level loss,
    dynamic sampling on, no KL."""

    model_config = ConfigDict(populate_by_name=True)

    mode: Literal["sync", "async"] = "sync"
    """``sync`` = generate, filter, train, repeat; ``async`` = the single controller (see the ``async`` section)."""
    run: RunSection = Field(default_factory=RunSection)
    """Run directory, seed and length."""
    model: ModelSection = Field(default_factory=ModelSection)
    """The policy."""
    data: DataSection = Field(default_factory=DataSection)
    """The prompts."""
    reward: RewardSection = Field(default_factory=RewardSection)
    """The reward function."""
    episode: EpisodeSection = Field(default_factory=EpisodeSection)
    """Multi-turn episodes with an environment (off by default: single-turn completions)."""
    generation: GenerationSection = Field(default_factory=GenerationSection)
    """Sampling of training completions."""
    grpo: GrpoSection = Field(default_factory=GrpoSection)
    """Groups, advantages, reward shaping, dynamic sampling."""
    loss: LossSection = Field(default_factory=LossSection)
    """The policy-gradient loss: which one (``loss.type``) and its settings."""
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection)
    """AdamW and the learning-rate schedule."""
    learner: LearnerSection = Field(default_factory=LearnerSection)
    """How many processes train the policy (data-parallel ranks)."""
    eval: EvalSection = Field(default_factory=EvalSection)
    """Held-out evaluation."""
    logging: LoggingSection = Field(default_factory=LoggingSection)
    """Optional outputs."""
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    """Checkpoints."""
    async_: AsyncSection = Field(default_factory=AsyncSection, alias="async")
    """The async single controller (``mode: async`` only); YAML key ``async``."""
    runtime: RuntimeSection = Field(default_factory=RuntimeSection)
    """Process layout (embedded or Ray)."""
    sim: SimSection = Field(default_factory=SimSection)
    """The throughput simulator's model (``groupwise simulate`` only)."""
    sft: SftSection = Field(default_factory=SftSection)
    """Supervised fine-tuning (``groupwise sft`` only)."""

    @model_validator(mode="after")
    def _cross_field_rules(self) -> RunConfig:
        self._backend_defaults()
        issues = run_rules(self)
        if issues:
            raise ConfigError(issues)
        return self

    def _backend_defaults(self) -> None:
        """Defaults that follow ``generation.backend``, set where the config leaves them out:
        ``async.partial_rollout_kv`` is ``keep`` for partial rollouts under vllm, the one value vLLM can do (it
        pauses running requests with their KV cache and cannot rebuild it under new weights)."""
        section = self.async_
        if (self.generation.backend == "vllm" and section.partial_rollouts == "continue"
                and "partial_rollout_kv" not in section.model_fields_set):  # fmt: skip
            section.partial_rollout_kv = "keep"

    def warnings(self) -> list[ConfigIssue]:
        """Hazards of this valid config (:mod:`groupwise.config.hazards`): print them, they do not stop a run."""
        return run_hazards(self)

    def to_yaml(self) -> str:
        """The resolved config (every key, defaults included) as YAML that loads back to an equal config."""
        return yaml.safe_dump(self.model_dump(mode="json", by_alias=True), sort_keys=False, allow_unicode=True)

    @property
    def streaming_min_groups(self) -> int:
        """Smallest chunk the async trainer takes: ``async.min_groups_for_streaming_train``, or P when null."""
        chunk = self.async_.min_groups_for_streaming_train
        return self.grpo.num_prompts_per_step if chunk is None else chunk

    @property
    def prompts_per_generation_round(self) -> int:
        """Sync: prompts generated per dynamic-sampling round, ``ceil(P × batch_multiplier)`` (P with DS off)."""
        ds = self.grpo.dynamic_sampling
        return round_size(self.grpo.num_prompts_per_step, ds.batch_multiplier, ds.enabled)
