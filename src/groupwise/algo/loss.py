"""The clipped policy-gradient loss (GRPO/DAPO) on padded per-token tensors ``[R, T]``.

Per valid token (``mask == 1``), with ratio ``r = exp(logprobs − prev_logprobs)``:

* clipped objective ``ℓ = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))`` (clip-higher when ε_high > ε_low);
* dual clip (optional, ``c > 1``), where ``A < 0``: ``ℓ = min(ℓ, −A·c)``;
* importance weight ``w = exp(prev − gen)`` (detached, NaN/inf → 0) corrects for the policy that sampled
  the token (stale weights, inference/training numeric mismatch); ``tis`` clamps w to [min, max],
  ``icepop`` zeroes tokens with w outside [min, max];
* KL k3 to a reference: ``x = clamp(ref − cur, ±in)``, ``kl = clamp(exp(x) − 1 − x, ±out)``, times kl_coef;
* entropy bonus ``− entropy_coef · H``.

The per-token total ``w·ℓ + kl_coef·kl − entropy_coef·H`` is reduced with a caller-given denominator that
covers the WHOLE step (invariant 6 in docs/design.md), so summing this loss over chunks of a step equals the one-shot
loss, in value and gradient: ``token_level`` ``Σ mask·total / N_tokens(step)``; ``sequence_level``
``Σ_i (Σ_t mask·total / n_i) / N_sequences(step)``. Use :func:`global_denominator` for the denominator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Literal

import torch

from groupwise.algo.loss_menu import Normalization

ISTruncation = Literal["none", "tis", "icepop"]


@dataclass
class LossStats:
    """Sums over valid tokens of one chunk; ``merge`` adds chunks, ``as_metrics`` gives step means."""

    num_tokens: float = 0.0
    num_sequences: float = 0.0
    policy_sum: float = 0.0
    clip_count: float = 0.0
    clip_low_count: float = 0.0
    clip_high_count: float = 0.0
    dual_clip_count: float = 0.0
    kl_sum: float = 0.0
    kl_tokens: float = 0.0
    entropy_sum: float = 0.0
    entropy_tokens: float = 0.0
    is_weight_sum: float = 0.0
    is_weight_max: float = 0.0
    is_oob_count: float = 0.0
    ratio_sum: float = 0.0
    mismatch_abs_sum: float = 0.0  # rollout–trainer mismatch on on-policy tokens (groupwise.algo.mismatch)
    mismatch_k3_sum: float = 0.0
    mismatch_tokens: float = 0.0

    def merge(self, other: LossStats) -> LossStats:
        """Add ``other``'s sums into these stats (``is_weight_max`` takes the max); returns ``self``."""
        for f in fields(self):
            if f.name != "is_weight_max":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        self.is_weight_max = max(self.is_weight_max, other.is_weight_max)
        return self

    def as_metrics(self, total_loss: float | None = None) -> dict[str, float]:
        """Means over the valid tokens of every merged chunk, plus ``loss/total`` when the loss is passed in.

        ``loss/policy`` is the token mean of ``w·ℓ``; ``loss/clip_*_fraction`` count tokens where the clip
        bound the objective (low: r < 1 − ε_low with A < 0; high: r > 1 + ε_high with A > 0);
        ``loss/is_weight_*`` describe the raw weight ``exp(prev − gen)`` before truncation, and
        ``loss/is_oob_fraction`` the tokens whose raw weight lay outside [min, max]. ``loss/kl`` (k3 before
        kl_coef) and ``loss/entropy`` appear only when reference logprobs / entropies were given.
        ``mismatch/*`` (:mod:`groupwise.algo.mismatch`): the on-policy share of the tokens, and, when there were
        any, their mean absolute logprob gap and k3 KL.
        """

        def per_token(total: float) -> float:
            return total / self.num_tokens if self.num_tokens else math.nan

        metrics = {
            "loss/policy": per_token(self.policy_sum),
            "loss/clip_fraction": per_token(self.clip_count),
            "loss/clip_low_fraction": per_token(self.clip_low_count),
            "loss/clip_high_fraction": per_token(self.clip_high_count),
            "loss/dual_clip_fraction": per_token(self.dual_clip_count),
            "loss/is_weight_mean": per_token(self.is_weight_sum),
            "loss/is_weight_max": self.is_weight_max,
            "loss/is_oob_fraction": per_token(self.is_oob_count),
            "loss/ratio_mean": per_token(self.ratio_sum),
        }
        if total_loss is not None:
            metrics["loss/total"] = float(total_loss)
        if self.kl_tokens:
            metrics["loss/kl"] = self.kl_sum / self.kl_tokens
        if self.entropy_tokens:
            metrics["loss/entropy"] = self.entropy_sum / self.entropy_tokens
        if self.num_tokens:
            metrics["mismatch/on_policy_fraction"] = self.mismatch_tokens / self.num_tokens
        if self.mismatch_tokens:
            metrics["mismatch/logprob_abs_diff"] = self.mismatch_abs_sum / self.mismatch_tokens
            metrics["mismatch/kl_k3"] = self.mismatch_k3_sum / self.mismatch_tokens
        return metrics


def valid_count(masks: Sequence[torch.Tensor], normalization: Normalization) -> float:
    """What the normaliser counts over the ``[R, T]`` masks given (0 for none): ``token_level`` ``Σ mask``
    (valid tokens); ``sequence_level`` rows with at least one valid token (a fully masked row is not counted).
    A data-parallel learner sums this over its ranks."""
    if normalization == "token_level":
        return sum(float(m.sum()) for m in masks)
    if normalization == "sequence_level":
        return sum(float((m.sum(dim=1) > 0).sum()) for m in masks)
    raise ValueError(f"normalization must be 'token_level' or 'sequence_level', got {normalization!r}")


def global_denominator(masks: Sequence[torch.Tensor], normalization: Normalization) -> float:
    """The step-wide normaliser over every chunk's ``[R, T]`` mask (:func:`valid_count`); > 0 or ValueError."""
    total = valid_count(masks, normalization)
    if total <= 0:
        raise ValueError(f"global_denominator: the step has no valid tokens ({len(masks)} mask chunk(s), all zero)")
    return total


def check_loss_inputs(
    logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, named: dict[str, torch.Tensor | None]
) -> None:
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [R, T], got shape {tuple(logprobs.shape)}")
    for name, tensor in {"mask": mask, **named}.items():
        if tensor is not None and tensor.shape != logprobs.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)} but logprobs is {tuple(logprobs.shape)}")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be [R] = [{logprobs.shape[0]}], got shape {tuple(advantages.shape)}")


def _check_options(
    normalization: str,
    denominator: float,
    epsilon_low: float,
    epsilon_high: float,
    dual_clip_c: float | None,
    is_ratio_min: float,
    is_ratio_max: float,
) -> None:
    """Raise ValueError naming the option, its value and the accepted range."""
    if normalization not in ("token_level", "sequence_level"):
        raise ValueError(f"normalization must be 'token_level' or 'sequence_level', got {normalization!r}")
    if not denominator > 0:
        raise ValueError(f"denominator must be > 0 (the step's valid tokens or sequences), got {denominator}")
    if not (0.0 <= epsilon_low < 1.0 and epsilon_high >= 0.0):
        raise ValueError(f"need 0 <= epsilon_low < 1 and epsilon_high >= 0, got {epsilon_low}, {epsilon_high}")
    if dual_clip_c is not None and not dual_clip_c > 1.0:
        raise ValueError(f"dual_clip_c must be > 1 (or None to disable), got {dual_clip_c}")
    if not 0.0 <= is_ratio_min <= is_ratio_max:
        raise ValueError(f"need 0 <= is_ratio_min <= is_ratio_max, got {is_ratio_min}, {is_ratio_max}")


def importance_weights(
    prev: torch.Tensor, gen: torch.Tensor, enabled: bool, truncation: ISTruncation, lo: float, hi: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(applied weight, raw weight, out-of-bounds flag) per token; all detached."""
    raw = torch.exp(prev - gen).detach()
    raw = torch.where(torch.isfinite(raw), raw, torch.zeros_like(raw))
    oob = (raw < lo) | (raw > hi)
    if not enabled or truncation == "none":
        applied = raw if enabled else torch.ones_like(raw)
    elif truncation == "tis":
        applied = raw.clamp(lo, hi)
    elif truncation == "icepop":
        applied = torch.where(oob, torch.zeros_like(raw), raw)
    else:
        raise ValueError(f"is_truncation must be 'none', 'tis' or 'icepop', got {truncation!r}")
    return applied, raw, oob


def clipped_objective(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float, dual_clip_c: float | None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token ``ℓ`` and boolean masks of where each clip bound the objective."""
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    objective = torch.maximum(unclipped, clipped)
    bound = clipped > unclipped
    flags = {"clip": bound, "clip_low": bound & (ratio < 1.0 - eps_low), "clip_high": bound & (ratio > 1.0 + eps_high)}
    if dual_clip_c is not None:
        cap = -adv * dual_clip_c
        dual = (adv < 0) & (cap < objective)
        objective = torch.where(dual, cap, objective)
        flags["dual_clip"] = dual
    return objective, flags


def k3_kl(ref: torch.Tensor, cur: torch.Tensor, input_clamp: float, output_clamp: float) -> torch.Tensor:
    """``clamp(exp(x) − 1 − x, ±out)`` with ``x = clamp(ref − cur, ±in)``: a non-negative KL estimate."""
    x = (ref - cur).clamp(-input_clamp, input_clamp)
    return (torch.exp(x) - 1.0 - x).clamp(-output_clamp, output_clamp)


def reduce_loss(
    total: torch.Tensor, mask: torch.Tensor, normalization: Normalization, denominator: float
) -> torch.Tensor:
    """One chunk's share of the step's loss: ``token_level`` ``Σ mask·total / D``; ``sequence_level``
    ``Σ_i (Σ_t mask·total / max(n_i, 1)) / D``, with ``n_i`` row i's valid tokens and ``D`` the step's
    :func:`global_denominator` (so the chunks' shares sum to the one-shot loss)."""
    if normalization == "token_level":
        return (total * mask).sum() / denominator
    per_sequence = (total * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
    return per_sequence.sum() / denominator


def _check_optional_terms(
    kl_coef: float, ref_logprobs: torch.Tensor | None, entropy_coef: float, entropy: torch.Tensor | None
) -> None:
    """A non-zero KL or entropy coefficient needs the tensor its term is computed from."""
    if kl_coef != 0.0 and ref_logprobs is None:
        raise ValueError(f"kl_coef={kl_coef} needs ref_logprobs (reference-policy logprobs); pass them or set 0")
    if entropy_coef != 0.0 and entropy is None:
        raise ValueError(f"entropy_coef={entropy_coef} needs the per-token entropy tensor; pass it or set 0")


def policy_loss(
    logprobs: torch.Tensor,
    prev_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    dual_clip_c: float | None = None,
    normalization: Normalization,
    denominator: float,
    kl_coef: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    kl_input_clamp: float = 20.0,
    kl_output_clamp: float = 10.0,
    importance_sampling: bool = True,
    is_truncation: ISTruncation = "tis",
    is_ratio_min: float = 0.0,
    is_ratio_max: float = 2.0,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
) -> tuple[torch.Tensor, LossStats]:
    """The loss of one chunk and its stats (formulas in the module docstring).

    ``logprobs`` carries the gradient; ``prev_logprobs``/``generation_logprobs``/``ref_logprobs`` are
    treated as data (detached). ``entropy`` may carry a gradient. Padded positions (``mask == 0``) may hold
    any value, even inf: they are replaced before any arithmetic, so they reach neither value nor gradient.
    With ``importance_sampling=False`` the weight is 1 and ``is_truncation`` does not apply.
    """
    check_loss_inputs(logprobs, advantages, mask, {"prev_logprobs": prev_logprobs,
                  "generation_logprobs": generation_logprobs, "ref_logprobs": ref_logprobs, "entropy": entropy})
    _check_options(normalization, denominator, epsilon_low, epsilon_high, dual_clip_c, is_ratio_min, is_ratio_max)
    _check_optional_terms(kl_coef, ref_logprobs, entropy_coef, entropy)

    valid = mask > 0
    mask_f = valid.to(logprobs.dtype)

    def clean(t: torch.Tensor) -> torch.Tensor:
        return torch.where(valid, t, torch.zeros_like(t))

    cur, prev, gen = clean(logprobs), clean(prev_logprobs).detach(), clean(generation_logprobs).detach()
    ratio = torch.exp(cur - prev)
    objective, flags = clipped_objective(ratio, advantages.detach()[:, None], epsilon_low, epsilon_high, dual_clip_c)
    weight, raw_weight, oob = importance_weights(prev, gen, importance_sampling, is_truncation, is_ratio_min,
                                                  is_ratio_max)
    per_token = weight * objective
    kl = None
    if ref_logprobs is not None:
        kl = k3_kl(clean(ref_logprobs).detach(), cur, kl_input_clamp, kl_output_clamp)
    total = per_token
    if kl is not None and kl_coef != 0.0:
        total = total + kl_coef * kl
    if entropy is not None and entropy_coef != 0.0:
        total = total - entropy_coef * clean(entropy)
    loss = reduce_loss(total, mask_f, normalization, denominator)
    stats = chunk_stats(valid, per_token, ratio, flags, raw_weight, oob, kl, entropy)
    return loss, stats


def chunk_stats(
    valid: torch.Tensor,
    per_token: torch.Tensor,
    ratio: torch.Tensor,
    flags: dict[str, torch.Tensor],
    raw_weight: torch.Tensor,
    oob: torch.Tensor,
    kl: torch.Tensor | None,
    entropy: torch.Tensor | None,
) -> LossStats:
    """Sums over the valid tokens of one chunk (no gradient)."""
    with torch.no_grad():

        def total(t: torch.Tensor) -> float:
            return float(torch.where(valid, t.to(per_token.dtype), torch.zeros_like(per_token)).sum())

        num_tokens = float(valid.sum())
        return LossStats(
            num_tokens=num_tokens,
            num_sequences=float(valid.any(dim=1).sum()),
            policy_sum=total(per_token),
            clip_count=total(flags["clip"]),
            clip_low_count=total(flags["clip_low"]),
            clip_high_count=total(flags["clip_high"]),
            dual_clip_count=total(flags["dual_clip"]) if "dual_clip" in flags else 0.0,
            kl_sum=total(kl) if kl is not None else 0.0,
            kl_tokens=num_tokens if kl is not None else 0.0,
            entropy_sum=total(entropy) if entropy is not None else 0.0,
            entropy_tokens=num_tokens if entropy is not None else 0.0,
            is_weight_sum=total(raw_weight),
            is_weight_max=float(raw_weight[valid].max()) if num_tokens else 0.0,
            is_oob_count=total(oob),
            ratio_sum=total(ratio),
        )
