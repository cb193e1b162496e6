"""The PPO-clip family: ``dapo`` (the default), ``grpo`` and ``dr_grpo``, each a short function on :class:`LossInputs`.

Per valid token, with ratio ``r = exp(logprob − prev)`` and the completion's advantage ``A``, the clipped term is
``ℓ = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))`` (optional dual clip ``c``: :mod:`groupwise.algo.loss`), weighted
by the behaviour weight ``w`` (:mod:`groupwise.algo.importance`), plus ``kl_coef·k3 − entropy_coef·H`` per token.
The three differ in the clip and in how ``ℓ`` is averaged over a step of ``N`` completions of ``n_i`` valid tokens:

* ``dapo``: ``Σ_i Σ_t ℓ_it / Σ_i n_i``, a token-level mean; clip-higher (``ε_high`` may exceed ``ε_low``).
  Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv:2503.14476.
  ``loss.normalization: sequence_level`` averages per completion instead (as ``grpo``, keeping clip-higher).
* ``grpo``: ``(1/N) Σ_i (1/n_i) Σ_t ℓ_it``, a per-completion mean; a symmetric clip ``[1 − ε_low, 1 + ε_low]``.
  Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300.
* ``dr_grpo``: ``Σ_i Σ_t ℓ_it / (N · L)`` with ``L = generation.max_new_tokens``, a constant: no length bias
  from ``1/n_i``. Its advantages are not divided by the group's std (``grpo.normalize_advantages: false``, a
  config rule). Its upper clip is ``loss.epsilon_high``, whose default 0.28 is DAPO's clip-higher, not the
  paper's symmetric PPO clip: set ``loss.epsilon_high: 0.2`` (= ``epsilon_low``) for that (it acts only with several
  updates per step). Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective",
  arXiv:2503.20783.
"""

from __future__ import annotations

import torch

from groupwise.algo.loss import clipped_objective, reduce_loss
from groupwise.algo.loss_menu import Normalization
from groupwise.algo.loss_seam import LossInputs, LossResult
from groupwise.algo.loss_stats import chunk_stats
from groupwise.algo.loss_terms import add_penalties, cleaned, weights


def _clipped(inputs: LossInputs, normalization: Normalization, epsilon_high: float, denominator: float) -> LossResult:
    """``Σ (w·ℓ + penalties)`` reduced as ``normalization`` says over ``denominator``, with the upper clip at
    ``1 + epsilon_high`` and every other setting from the ``loss`` section."""
    s = inputs.settings
    c = cleaned(inputs)
    ratio = torch.exp(c.cur - c.prev)
    objective, flags = clipped_objective(ratio, inputs.advantages.detach()[:, None], s.epsilon_low, epsilon_high,
                                         s.dual_clip_c)  # fmt: skip
    w = weights(inputs, c.prev, c.gen, c.valid)
    per_token = w.applied * objective
    total, kl = add_penalties(per_token, inputs, c)
    loss = reduce_loss(total, c.mask, normalization, denominator)
    return LossResult(loss, chunk_stats(c.valid, per_token, ratio, flags, w, kl, inputs.entropy))


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
