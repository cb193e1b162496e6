"""The algorithm sections: GRPO (groups, advantages, reward shaping, dynamic sampling), the loss, the optimizer.

Only single-field ranges live here; rules that relate two fields are in :mod:`groupwise.config.rules`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from groupwise.algo.filter import GroupFilter
from groupwise.algo.loss_menu import BUILTIN_LOSSES, DEFAULT_LOSS
from groupwise.config.base import Section, invalid
from groupwise.plugins import is_plugin_target

AdamBeta = Annotated[float, Field(ge=0, lt=1)]

#: Bounds that keep every value finite in float32 training arithmetic (at most 3.4e38): a coefficient, clip or
#: penalty beyond these makes a loss term, a clamp or a reward overflow to inf or NaN, or fail a float32 conversion
#: ("value cannot be converted to type float without overflow") far from the key that caused it.
MAX_COEF = 1e6
MAX_REWARD_VALUE = 1e30  # as groupwise.data.scoring.MAX_ABS_REWARD: the largest reward magnitude accepted
MAX_LR = 1.0
MIN_ADAM_EPS = 1e-30
MAX_KL_INPUT_CLAMP = 80.0  # exp(88.7) is float32's largest value: the k3 estimator exponentiates the log-ratio


class RewardScalingSection(Section):
    """Linear map of raw rewards from ``[source_min, source_max]`` to ``[target_min, target_max]`` (clamped)
    before advantages. The zero-variance filter always sees the raw reward."""

    enabled: bool = False
    """Apply the map. When off, the other keys must keep their defaults."""
    source_min: float = Field(0.0, ge=-MAX_REWARD_VALUE, le=MAX_REWARD_VALUE)
    """Raw reward mapped to ``target_min`` (< ``source_max``; within ±1e30, the reward bound)."""
    source_max: float = Field(1.0, ge=-MAX_REWARD_VALUE, le=MAX_REWARD_VALUE)
    """Raw reward mapped to ``target_max`` (> ``source_min``; within ±1e30)."""
    target_min: float = Field(0.0, ge=-MAX_REWARD_VALUE, le=MAX_REWARD_VALUE)
    """Lowest scaled reward (< ``target_max``; within ±1e30)."""
    target_max: float = Field(1.0, ge=-MAX_REWARD_VALUE, le=MAX_REWARD_VALUE)
    """Highest scaled reward (> ``target_min``; within ±1e30). The slope (target range ÷ source range) must be at
    most 1e30, so every scaled reward is finite."""


class OverlongSection(Section):
    """DAPO overlong shaping: a completion of L tokens, longer than ``expected = max_response_length −
    overlong_buffer_length``, gets ``overlong_buffer_penalty × (L − expected) / overlong_buffer_length``
    subtracted from its reward (the full penalty at ``max_response_length``)."""

    enabled: bool = False
    """Apply the length penalty. When on, the three settings below are required."""
    max_response_length: int | None = Field(None, ge=1)
    """Length in tokens at which the full penalty applies (≥ 1)."""
    overlong_buffer_length: int | None = Field(None, ge=1)
    """Tokens before ``max_response_length`` where the penalty ramps up (≥ 1, < ``max_response_length``)."""
    overlong_buffer_penalty: float | None = Field(None, ge=0, le=MAX_REWARD_VALUE)
    """Largest penalty, in reward units (0 ≤ penalty ≤ 1e30, the reward bound)."""


class DynamicSamplingSection(Section):
    """DAPO dynamic sampling: drop prompt groups whose G raw rewards are all equal (no learning signal) and
    generate more until the step has P groups."""

    enabled: bool = True
    """Filter zero-variance groups. Needs ``grpo.num_generations_per_prompt ≥ 2``."""
    batch_multiplier: float = Field(1.0, ge=1)
    """Sync: prompts per generation round = ``ceil(P × batch_multiplier)`` (≥ 1; exactly 1 when DS is off)."""
    max_gen_rounds: int = Field(4, ge=1)
    """Sync: generation rounds per step at most (≥ 1); then ``on_exhausted`` applies."""
    on_exhausted: Literal["raise", "train_short"] = "train_short"
    """Sync: when ``max_gen_rounds`` rounds kept fewer than P groups, ``raise`` stops the run with the zero-variance
    rate seen; ``train_short`` trains on the groups kept (at least ``min_step_batch_fraction`` of P)."""
    min_step_batch_fraction: float = Field(0.25, gt=0, le=1)
    """Sync, ``train_short``: a short step needs at least ``ceil(P × fraction)`` groups, else the run stops
    (0 < f ≤ 1)."""
    stop_when_exhausted: bool = False
    """Sync: a step that ``on_exhausted`` cannot train (``raise``, or ``train_short`` under its floor) ends the run
    as finished instead of failing it — for a policy that has outgrown its data, answering every prompt the same
    way G times. The last trained step's policy is evaluated and saved (a checkpoint, ``final/``), the step's new
    groups keep their fates (filtered, or pending with the reason), groups carried into it stay carried (a resume
    trains them), and the command exits 0."""
    surplus: Literal["discard", "carry"] = "discard"
    """Sync: kept groups beyond P in the last round are ``discard``-ed (counted) or ``carry``-ed into the next step
    (one version off-policy, corrected by importance sampling)."""
    zero_variance_tol: float = Field(0.0, ge=0)
    """A group is zero-variance when ``max − min`` of its raw rewards is ≤ this (≥ 0; 0 = exactly equal). With
    dynamic sampling it must stay below the reward's range (< 1 for the built-in rewards, which score in [0, 1]):
    at or above it every group is filtered. For a ``module:function`` reward the range is yours to respect."""


class GrpoSection(Section):
    """Group sampling and advantages."""

    num_prompts_per_step: int = Field(16, ge=1)
    """P: prompt groups per optimizer step (≥ 1)."""
    num_generations_per_prompt: int = Field(8, ge=1)
    """G: completions per prompt (≥ 2; 1 only with dynamic sampling off and an entropy or KL term, which is then
    all that trains: a group of one is its own baseline, so every advantage is 0)."""
    baseline: Literal["mean", "leave_one_out"] = "mean"
    """Per-group baseline: the group ``mean``, or the mean of the other G − 1 rewards (``leave_one_out``)."""
    normalize_advantages: bool = True
    """Divide advantages by a reward standard deviation (``advantage_std`` says which); ``false`` = ``r − baseline``
    undivided (Dr. GRPO)."""
    advantage_std: Literal["group", "batch"] = "group"
    """The std advantages are divided by: each ``group``'s own, or the ``batch``'s (every reward of the step, one
    scale for all groups; sync mode only). Needs ``normalize_advantages: true``."""
    advantage_clip_low: float | None = None
    """Clamp advantages below at this value; ``null`` = no lower clamp (< ``advantage_clip_high``)."""
    advantage_clip_high: float | None = None
    """Clamp advantages above at this value; ``null`` = no upper clamp (> ``advantage_clip_low``)."""
    reward_scaling: RewardScalingSection = Field(default_factory=RewardScalingSection)
    """Linear reward scaling before advantages."""
    overlong_shaping: OverlongSection = Field(default_factory=OverlongSection)
    """DAPO overlong length penalty."""
    dynamic_sampling: DynamicSamplingSection = Field(default_factory=DynamicSamplingSection)
    """DAPO dynamic sampling (zero-variance group filter)."""

    def group_filter(self) -> GroupFilter:
        """The run's zero-variance filter, for both loops: on or off, its tolerance, and the raw reward range
        (``reward_scaling.source_min`` .. ``source_max``, the declared range of the verifier's rewards) that tells
        all-correct from all-wrong groups in the ``ds/zero_variance_{max,min}_fraction`` metrics."""
        ds, scaling = self.dynamic_sampling, self.reward_scaling
        return GroupFilter(ds.enabled, ds.zero_variance_tol, scaling.source_min, scaling.source_max)


class LossSection(Section):
    """The policy-gradient loss: which one (``type``) and its settings."""

    type: str = DEFAULT_LOSS
    """The loss, by name: ``dapo`` (token-level mean, clip-higher), ``grpo`` (per-completion mean, symmetric clip at
    ``epsilon_low``), ``dr_grpo`` (token sum over a constant, needs ``grpo.normalize_advantages: false``),
    ``gspo`` / ``gspo_token`` (sequence-level ratio, clipped per completion), ``cispo`` (clipped weight as a
    detached coefficient); or ``package.module:name``, a plug-in loss (checked when the config loads). The
    formulas and papers are in docs/learner.md; a clip or normaliser key a loss does not read is an error."""

    epsilon_low: float = Field(0.2, ge=0, lt=1)
    """Lower clip: the ratio is clipped at ``1 − epsilon_low`` (0 ≤ ε < 1: a ratio is positive). The ratio
    moves away from 1 only with several optimizer updates per RL step (``optimizer.mini_batches_per_step ×
    epochs_per_step > 1``); with one update it is exactly 1 and a non-default value is an error (no effect)."""
    epsilon_high: float = Field(0.28, ge=0, le=MAX_COEF)
    """Upper clip ("clip-higher"): the ratio is clipped at ``1 + epsilon_high`` (0 ≤ ε ≤ 1e6). Acts only with several
    optimizer updates per RL step, like ``epsilon_low``."""
    dual_clip_c: float | None = Field(None, gt=1, le=MAX_COEF)
    """Dual-clip bound for negative advantages (1 < c ≤ 1e6); ``null`` = off. Acts only with several optimizer updates
    per RL step, like ``epsilon_low``."""
    normalization: Literal["token_level", "sequence_level"] = "token_level"
    """``dapo`` only (every other loss fixes its own): ``token_level`` = mean over every completion token of the
    step; ``sequence_level`` = mean per completion, then over completions."""
    kl_coef: float = Field(0.0, ge=0, le=MAX_COEF)
    """Weight of the k3 KL penalty to the reference policy (0 ≤ β ≤ 1e6; > 0 needs ``model.reference: initial``)."""
    kl_input_clamp: float = Field(20.0, gt=0, le=MAX_KL_INPUT_CLAMP)
    """Clamp on the log-ratio fed to the KL estimator (0 < c ≤ 80: the estimator exponentiates it, and float32
    overflows past exp(88))."""
    kl_output_clamp: float = Field(10.0, gt=0, le=MAX_COEF)
    """Clamp on each token's KL value (0 < c ≤ 1e6)."""
    importance_sampling: bool = True
    """Correct for the gap between the sampling-time and the training-time policy with per-token importance
    weights (required by any off-policy data: async windows, ``surplus: carry``)."""
    is_truncation: Literal["none", "tis", "icepop", "seq_mask_tis"] = "tis"
    """How importance weights are bounded: ``tis`` clamps them to ``[is_ratio_min, is_ratio_max]``; ``icepop``
    zeroes tokens outside that range; ``seq_mask_tis`` zeroes whole completions whose geometric-mean weight
    ``exp(mean_t(prev − gen))`` is outside it and keeps the others' raw token weights (NeMo-RL's and OpenRLHF's
    ``seq-mask-tis``); ``none`` leaves them (needs ``importance_sampling`` unless ``none``). Left unset, it follows
    ``importance_sampling``: ``tis`` when on, ``none`` when off."""
    is_ratio_min: float = Field(0.0, ge=0)
    """Lower importance-weight bound (≥ 0, ≤ ``is_ratio_max``)."""
    is_ratio_max: float = Field(2.0, gt=0, le=MAX_COEF)
    """Upper importance-weight bound (0 < max ≤ 1e6, ≥ ``is_ratio_min``; no bound at all is
    ``is_truncation: none``)."""
    entropy_coef: float = Field(0.0, ge=0, le=MAX_COEF)
    """Weight of the entropy bonus (0 ≤ c ≤ 1e6; a small value such as 0.01 delays entropy collapse). A plug-in
    ``loss.type`` must declare that it takes the entropy (``needs_entropy``) for a value > 0."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """A plug-in loss's own settings (``loss.type: package.module:name`` only), handed to it as ``inputs.kwargs``;
    a plug-in that declares the keys it reads refuses any other. Built-in losses take none."""

    @field_validator("type")
    @classmethod
    def _known_loss(cls, loss_type: str) -> str:
        if loss_type in BUILTIN_LOSSES or is_plugin_target(loss_type):
            return loss_type
        raise invalid(
            f"loss.type must be a built-in loss ({', '.join(BUILTIN_LOSSES)}) or a plug-in 'package.module:name'",
            "pick a built-in loss, or name your loss function as package.module:name",
        )

    @model_validator(mode="before")
    @classmethod
    def _truncation_follows_importance_sampling(cls, data: Any) -> Any:  # Any: pydantic's raw input
        """``importance_sampling: false`` alone turns truncation off too: there are no weights to bound."""
        if isinstance(data, dict) and data.get("importance_sampling") is False and "is_truncation" not in data:
            return {**data, "is_truncation": "none"}
        return data


class OptimizerSection(Section):
    """AdamW and the learning-rate schedule."""

    lr: float = Field(1e-4, gt=0, le=MAX_LR)
    """Peak learning rate (0 < lr ≤ 1: an AdamW update moves each weight by up to about lr, so beyond 1 the
    first update destroys the model, and far beyond it the update overflows float32)."""
    betas: tuple[AdamBeta, AdamBeta] = Field((0.9, 0.999), strict=False)
    """AdamW (beta1, beta2), each in [0, 1)."""
    weight_decay: float = Field(0.0, ge=0)
    """Decoupled weight decay (≥ 0, with ``lr × weight_decay < 1``: each update multiplies every weight by
    ``1 − lr × weight_decay``)."""
    eps: float = Field(1e-8, ge=MIN_ADAM_EPS)
    """AdamW epsilon (≥ 1e-30: a smaller one is 0 in float32, and a weight whose gradient is 0 gets 0 ÷ 0)."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up from 0 to ``lr`` over this many RL steps (≥ 0). One longer than ``run.max_steps`` is clamped
    to it, with a warning (a shortened run such as ``run.max_steps=1`` still trains at the peak rate by its last
    step). The schedule counts RL steps, not optimizer updates: the updates of one step share its learning rate."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning rate after warm-up: ``constant``, or ``linear``/``cosine`` decay to ``lr × min_lr_ratio`` at
    ``run.max_steps``."""
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """Final learning rate as a fraction of ``lr`` for decaying schedules (0 ≤ r ≤ 1)."""
    max_grad_norm: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm to this (> 0); ``null`` = no clipping."""
    micro_batch_rows: int = Field(64, ge=1)
    """Rows (completions) per forward/backward micro-batch at most (≥ 1); gradients accumulate into one update.
    Without ``micro_batch_tokens``: consecutive runs of this many rows; with it, the cap on each packed
    micro-batch."""
    micro_batch_tokens: int | None = Field(None, ge=1)
    """Token budget of a micro-batch (≥ 1); ``null`` = cut by rows only. Rows are sorted longest first and packed
    whole while rows × the longest row (prompt + completion) stays within the budget; a longer row gets a
    micro-batch of its own. With ``share_prompts`` each prompt's rows are packed together and the cost is the
    positions the passes feed (docs/learner.md). The result does not depend on the split (the normaliser covers
    the update)."""
    logprob_chunk_tokens: int | None = Field(512, ge=1)
    """Positions projected through the LM head at once when scoring completions (≥ 1): peak memory is
    O(chunk × vocabulary) instead of O(rows × length × vocabulary), and padding never reaches the head.
    ``null`` = the model's own forward with full logits. Models whose logits are not ``lm_head(hidden)`` (logit
    soft-capping or scaling) always use the full-logits path; the run's events.log says which path scores."""
    share_prompts: bool = True
    """Score the completions of one prompt against one pass over it (its keys and values reused by every row that
    shares it) instead of running the prompt once per row: the same logprobs and gradients within float
    rounding, and with G completions per prompt far fewer positions through the model. Used on the chunked path
    (``logprob_chunk_tokens`` set) when it feeds fewer positions than one pass; models with sliding-window or
    non-attention layers, and gradient checkpointing, run every row's own prompt. events.log says which."""
    mini_batches_per_step: int = Field(1, ge=1)
    """K: optimizer updates per RL step per epoch, each on a mini-batch of whole groups (≥ 1, ≤
    ``grpo.num_prompts_per_step``). The old-policy logprobs are computed once before the first update, so from
    the second update on the ratio moves and the clip acts (verl ``ppo_mini_batch_size``, TRL
    ``steps_per_generation``)."""
    epochs_per_step: int = Field(1, ge=1)
    """E: passes over the step's mini-batches (≥ 1); the step takes K × E optimizer updates (verl
    ``ppo_epochs``, TRL ``num_iterations``). Weight versions still count RL steps."""
