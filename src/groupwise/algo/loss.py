"""The pieces every built-in policy-gradient loss is made of, on padded per-token tensors ``[R, T]``.

Per valid token (``mask == 1``), with ratio ``r = exp(logprobs − prev_logprobs)`` and the completion's advantage
``A``:

* the clipped objective ``ℓ = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))`` (clip-higher when ε_high > ε_low),
  and the dual clip (optional, ``c > 1``), where ``A < 0``: ``ℓ = min(ℓ, −A·c)`` (:func:`clipped_objective`);
* the KL k3 to a reference: ``x = clamp(ref − cur, ±in)``, ``kl = clamp(exp(x) − 1 − x, ±out)`` (:func:`k3_kl`);
* the reduction of a per-token total with a caller-given denominator that covers the WHOLE step (invariant 6 in
  docs/design.md), so summing a loss over chunks of a step equals the one-shot loss, in value and gradient:
  ``token_level`` ``Σ mask·total / N_tokens(step)``; ``sequence_level`` ``Σ_i (Σ_t mask·total / n_i) /
  N_sequences(step)`` (:func:`reduce_loss`, with :func:`global_denominator` for the denominator).

The behaviour importance weights are :mod:`groupwise.algo.importance`; the statistics :mod:`groupwise.algo.loss_stats`;
the losses themselves :mod:`groupwise.algo.clip_losses`, :mod:`groupwise.algo.gspo` and :mod:`groupwise.algo.cispo`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from groupwise.algo.loss_menu import Normalization


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
    """Raise ValueError naming the tensor whose shape does not fit ``logprobs`` ``[R, T]`` (``advantages``: ``[R]``)."""
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [R, T], got shape {tuple(logprobs.shape)}")
    for name, tensor in {"mask": mask, **named}.items():
        if tensor is not None and tensor.shape != logprobs.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)} but logprobs is {tuple(logprobs.shape)}")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be [R] = [{logprobs.shape[0]}], got shape {tuple(advantages.shape)}")


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
