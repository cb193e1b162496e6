"""The PPO-clip family: ``dapo`` (the default), ``grpo`` and ``dr_grpo`` (:func:`~groupwise.algo.loss.policy_loss`).

Per valid token, with ratio ``r = exp(logprob − prev)`` and the completion's advantage ``A``, the clipped term is
``ℓ = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))`` (optional dual clip, importance weight ``w``, KL and entropy
terms as in :mod:`groupwise.algo.loss`). The three differ in the clip and in how ``ℓ`` is averaged over a step of
``N`` completions of ``n_i`` valid tokens each:

* ``dapo``: ``Σ_i Σ_t ℓ_it / Σ_i n_i``, a token-level mean; clip-higher (``ε_high`` may exceed ``ε_low``).
  Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv:2503.14476.
  ``loss.normalization: sequence_level`` averages per completion instead (as ``grpo``, keeping clip-higher).
* ``grpo``: ``(1/N) Σ_i (1/n_i) Σ_t ℓ_it``, a per-completion mean; a symmetric clip ``[1 − ε_low, 1 + ε_low]``.
  Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300.
* ``dr_grpo``: ``Σ_i Σ_t ℓ_it / (N · L)`` with ``L = generation.max_new_tokens``, a constant: no length bias
  from ``1/n_i``. Its advantages are not divided by the group's std (``grpo.normalize_advantages: false``, a
  config rule). Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective", arXiv:2503.20783.
"""

from __future__ import annotations

from groupwise.algo.loss import policy_loss
from groupwise.algo.loss_menu import Normalization
from groupwise.algo.loss_seam import LossInputs, LossResult


def _clipped(inputs: LossInputs, normalization: Normalization, epsilon_high: float, denominator: float) -> LossResult:
    """:func:`policy_loss` on the inputs, with the loss section's every other setting."""
    s = inputs.settings
    loss, stats = policy_loss(
        inputs.logprobs,
        inputs.prev_logprobs,
        inputs.generation_logprobs,
        inputs.advantages,
        inputs.mask,
        epsilon_low=s.epsilon_low,
        epsilon_high=epsilon_high,
        dual_clip_c=s.dual_clip_c,
        normalization=normalization,
        denominator=denominator,
        kl_coef=s.kl_coef,
        ref_logprobs=inputs.ref_logprobs,
        kl_input_clamp=s.kl_input_clamp,
        kl_output_clamp=s.kl_output_clamp,
        importance_sampling=s.importance_sampling,
        is_truncation=s.is_truncation,
        is_ratio_min=s.is_ratio_min,
        is_ratio_max=s.is_ratio_max,
        entropy=inputs.entropy,
        entropy_coef=s.entropy_coef,
    )
    return LossResult(loss, stats)


def dapo(inputs: LossInputs) -> LossResult:
    """Token-level mean, clip-higher (module docstring); ``loss.normalization`` may make it per completion."""
    s = inputs.settings
    return _clipped(inputs, s.normalization, s.epsilon_high, inputs.normaliser)


def grpo(inputs: LossInputs) -> LossResult:
    """Per-completion mean, symmetric clip at ``1 ± ε_low`` (module docstring)."""
    s = inputs.settings
    return _clipped(inputs, "sequence_level", s.epsilon_low, inputs.normaliser)


def dr_grpo(inputs: LossInputs) -> LossResult:
    """Token sum over the constant ``N · L`` (module docstring): this returns ``Σ ℓ / (L · normaliser)`` and the
    learner divides by ``N``, the step's completions."""
    if inputs.max_completion_tokens is None or inputs.max_completion_tokens < 1:
        raise ValueError("dr_grpo needs max_completion_tokens (generation.max_new_tokens) in its inputs")
    s = inputs.settings
    return _clipped(inputs, "token_level", s.epsilon_high, inputs.normaliser * inputs.max_completion_tokens)
