"""`ControllerSettings`: what the controller needs of a run's config, as one frozen value.

``ControllerSettings.from_config(cfg)`` reads a ``groupwise.config.RunConfig``; tests build settings directly (a
``RolloutFailureSection(...)`` for the failure knobs, a ``GroupFilter(...)`` for the filter).
The sampler is its typed config section (``groupwise.config.async_schema``, where its knobs are declared once;
``sampler_config(name, **knobs)`` builds one from plain values).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from groupwise.algo.filter import GroupFilter
from groupwise.config.algorithm import GrpoSection
from groupwise.config.async_schema import ReadyFirstSamplerConfig, RolloutFailureSection, SamplerConfig

if TYPE_CHECKING:
    from groupwise.config import RunConfig


@dataclass(frozen=True)
class ControllerSettings:
    """P, G, sampler, capacities, failure handling, the filter, advantages, seed and run length.

    The config sections the controller acts on are held as themselves: ``failure`` is the
    ``async.rollout_failure`` section, ``advantages`` the ``grpo`` section (its baseline, normalisation and clip
    give each chunk's advantages), ``dynamic_sampling`` the run's filter (``GrpoSection.group_filter``).
    """

    prompts_per_step: int
    group_size: int
    sampler: SamplerConfig = field(default_factory=ReadyFirstSamplerConfig)
    min_groups_for_streaming_train: int | None = None
    max_inflight_prompts: int = 32
    max_buffered_rollouts: int = 64
    failure: RolloutFailureSection = field(default_factory=RolloutFailureSection)
    dynamic_sampling: GroupFilter = field(default_factory=GroupFilter)
    advantages: GrpoSection = field(default_factory=GrpoSection)
    seed: int = 0
    max_steps: int | None = None
    start_step: int = 0

    def __post_init__(self) -> None:
        P = self.prompts_per_step
        if P < 1:
            raise ValueError(f"prompts_per_step must be >= 1, got {P}")
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")
        if self.dynamic_sampling.enabled and self.group_size < 2:
            raise ValueError(
                f"dynamic sampling needs group_size >= 2 (a group of {self.group_size} has no reward variance); "
                "raise num_generations_per_prompt or turn dynamic sampling off"
            )
        chunk = self.min_groups_for_streaming_train
        if chunk is not None and not 1 <= chunk <= P:
            raise ValueError(
                f"min_groups_for_streaming_train must be between 1 and prompts_per_step {P} (or None = {P}), "
                f"got {chunk}"
            )
        for name, value in (("max_inflight_prompts", self.max_inflight_prompts),
                            ("max_buffered_rollouts", self.max_buffered_rollouts)):  # fmt: skip
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.max_steps is not None and self.max_steps < self.start_step:
            raise ValueError(f"max_steps {self.max_steps} is below the resume step {self.start_step}")
        if self.start_step < 0:
            raise ValueError(f"start_step must be >= 0, got {self.start_step}")

    @property
    def streaming_min_groups(self) -> int:
        """The smallest chunk the train pump takes (P when ``min_groups_for_streaming_train`` is None)."""
        chunk = self.min_groups_for_streaming_train
        return self.prompts_per_step if chunk is None else chunk

    @classmethod
    def from_config(cls, cfg: RunConfig, start_step: int = 0) -> ControllerSettings:
        """Settings of an async run from a ``RunConfig`` (its ``async`` section, ``grpo`` and ``run``)."""
        a = cfg.async_
        return cls(
            prompts_per_step=cfg.grpo.num_prompts_per_step,
            group_size=cfg.grpo.num_generations_per_prompt,
            sampler=a.sampler,
            min_groups_for_streaming_train=a.min_groups_for_streaming_train,
            max_inflight_prompts=a.max_inflight_prompts,
            max_buffered_rollouts=a.max_buffered_rollouts,
            failure=a.rollout_failure,
            dynamic_sampling=cfg.grpo.group_filter(),
            advantages=cfg.grpo,
            seed=cfg.run.seed,
            max_steps=cfg.run.max_steps,
            start_step=start_step,
        )
