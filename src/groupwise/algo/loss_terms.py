"""Pieces every built-in loss shares: the cleaned inputs, the behaviour weights and the penalty terms.

Padded positions (``mask == 0``) may hold any value, even inf: :func:`cleaned` replaces them with 0 before any
arithmetic, so they reach neither value nor gradient. The penalties are ``kl_coef · k3(ref, cur) − entropy_coef · H``
per token (:mod:`groupwise.algo.loss`); the behaviour weights are :mod:`groupwise.algo.importance`'s, bounded as the
``loss`` section says.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from groupwise.algo.importance import BehaviourWeights, behaviour_weights
from groupwise.algo.loss import check_loss_inputs, k3_kl
from groupwise.algo.loss_seam import LossInputs


@dataclass(frozen=True, eq=False)
class Cleaned:
    """The inputs with padding zeroed: ``cur`` carries the gradient, ``prev`` and ``gen`` are detached;
    ``valid`` the boolean mask, ``mask`` it as floats, ``lengths`` each row's valid tokens (at least 1)."""

    cur: torch.Tensor
    prev: torch.Tensor
    gen: torch.Tensor
    valid: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor

    def zeroed(self, t: torch.Tensor) -> torch.Tensor:
        return torch.where(self.valid, t, torch.zeros_like(t))

    def row_mean(self, t: torch.Tensor) -> torch.Tensor:
        """``Σ_t mask·t / n_i`` per row ``[R]`` (0 for a row with no valid token)."""
        return (self.zeroed(t) * self.mask).sum(dim=1) / self.lengths


def cleaned(inputs: LossInputs) -> Cleaned:
    """Check the shapes (ValueError naming the tensor) and zero the padding."""
    check_loss_inputs(inputs.logprobs, inputs.advantages, inputs.mask, {
        "prev_logprobs": inputs.prev_logprobs, "generation_logprobs": inputs.generation_logprobs,
        "ref_logprobs": inputs.ref_logprobs, "entropy": inputs.entropy})  # fmt: skip
    if not inputs.normaliser > 0:
        raise ValueError(f"normaliser must be > 0, got {inputs.normaliser}")
    valid = inputs.mask > 0
    mask = valid.to(inputs.logprobs.dtype)

    def zero(t: torch.Tensor) -> torch.Tensor:
        return torch.where(valid, t, torch.zeros_like(t))

    return Cleaned(zero(inputs.logprobs), zero(inputs.prev_logprobs).detach(),
                   zero(inputs.generation_logprobs).detach(), valid, mask, mask.sum(dim=1).clamp(min=1.0))  # fmt: skip


def weights(inputs: LossInputs, prev: torch.Tensor, gen: torch.Tensor, valid: torch.Tensor) -> BehaviourWeights:
    """The behaviour weights of ``prev`` against ``gen`` as ``loss.importance_sampling`` and its bounds say."""
    s = inputs.settings
    return behaviour_weights(prev, gen, valid, enabled=s.importance_sampling, truncation=s.is_truncation,
                             lo=s.is_ratio_min, hi=s.is_ratio_max)  # fmt: skip


def add_penalties(total: torch.Tensor, inputs: LossInputs, c: Cleaned) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(``total + kl_coef · kl − entropy_coef · H`` per token, the k3 KL per token or None without reference
    logprobs). Raises ValueError when a coefficient is on but its tensor was not given."""
    s = inputs.settings
    if s.kl_coef != 0.0 and inputs.ref_logprobs is None:
        raise ValueError(f"kl_coef={s.kl_coef} needs ref_logprobs (reference-policy logprobs); pass them or set 0")
    if s.entropy_coef != 0.0 and inputs.entropy is None:
        raise ValueError(f"entropy_coef={s.entropy_coef} needs the per-token entropy tensor; pass it or set 0")
    kl = None
    if inputs.ref_logprobs is not None:
        kl = k3_kl(c.zeroed(inputs.ref_logprobs).detach(), c.cur, s.kl_input_clamp, s.kl_output_clamp)
        if s.kl_coef != 0.0:
            total = total + s.kl_coef * kl
    if inputs.entropy is not None and s.entropy_coef != 0.0:
        total = total - s.entropy_coef * c.zeroed(inputs.entropy)
    return total, kl
