"""Pure GRPO/DAPO maths: the zero-variance filter, reward scaling and shaping, baselines and advantages,
the step tally, the sync dynamic-sampling accumulator, and the policy loss. No I/O, no config import."""

from groupwise.algo.accumulator import (
    DynamicSamplingAccumulator,
    DynamicSamplingExhausted,
    StepSelection,
    step_floor,
)
from groupwise.algo.advantages import clip_advantages, flat_group_advantages, group_advantages, group_baselines
from groupwise.algo.filter import is_zero_variance, zero_variance_kind
from groupwise.algo.loss import LossStats, global_denominator, policy_loss
from groupwise.algo.reward_shaping import check_finite_rewards, overlong_penalty, scale_rewards, shape_rewards
from groupwise.algo.tally import StepTally

__all__ = [
    "DynamicSamplingAccumulator",
    "DynamicSamplingExhausted",
    "LossStats",
    "StepSelection",
    "StepTally",
    "check_finite_rewards",
    "clip_advantages",
    "flat_group_advantages",
    "global_denominator",
    "group_advantages",
    "group_baselines",
    "is_zero_variance",
    "overlong_penalty",
    "policy_loss",
    "scale_rewards",
    "shape_rewards",
    "step_floor",
    "zero_variance_kind",
]
