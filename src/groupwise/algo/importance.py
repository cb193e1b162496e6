"""Behaviour importance weights: the correction for the policy that sampled each token (``loss.importance_sampling``,
``loss.is_truncation``).

A token was drawn by the generator's weights, whose logprob ``gen`` was recorded then; the loss is taken under
π_old, whose logprob is ``prev``. They differ by staleness (async windows, carried groups) and by the gap between
the engine's and the learner's numerics. Per valid token the raw weight is ``w = exp(prev − gen)`` (detached; NaN
or inf, e.g. a token the sampler recorded at probability 0, becomes 0), and with ``[lo, hi] = [is_ratio_min,
is_ratio_max]`` the weight applied to the token's loss is:

* ``tis`` (truncated IS): ``min(max(w, lo), hi)``;
* ``icepop``: ``w · 1[lo ≤ w ≤ hi]``, a token whose weight leaves the bounds drops out;
* ``seq_mask_tis``: ``w · 1[lo ≤ g_i ≤ hi]`` with ``g_i = exp((1/n_i) Σ_t (prev_it − gen_it))``, the geometric
  mean of completion i's token weights: a completion whose mean drifts out of the bounds drops out WHOLE, the
  others keep their raw token weights. NeMo-RL's and OpenRLHF's ``seq-mask-tis``. The geometric mean does not
  drift with the length the way the product of the weights (the exact sequence weight, which TRL's sequence-level
  modes bound) does, so one threshold serves short and long completions. A non-finite token log-ratio makes
  ``g_i`` non-finite, and the completion is dropped;
* ``none``: ``w``.

With ``importance_sampling: false`` every weight is 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

ISTruncation = Literal["none", "tis", "icepop", "seq_mask_tis"]


@dataclass(frozen=True, eq=False)
class BehaviourWeights:
    """The weights of one micro-batch, all detached: ``applied`` ``[R, T]`` (what multiplies each token's loss),
    ``raw`` ``[R, T]`` (``exp(prev − gen)`` before any bound), ``out_of_bounds`` ``[R, T]`` (raw weight outside
    ``[lo, hi]``) and, for ``seq_mask_tis`` only, ``masked_rows`` ``[R]`` (the completions dropped)."""

    applied: torch.Tensor
    raw: torch.Tensor
    out_of_bounds: torch.Tensor
    masked_rows: torch.Tensor | None = None


def geometric_mean_weights(prev: torch.Tensor, gen: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``g_i = exp(Σ_t valid·(prev − gen) / n_i)`` per row ``[R]`` (1 for a row with no valid token)."""
    log_ratio = torch.where(valid, prev - gen, torch.zeros_like(prev)).detach()
    lengths = valid.sum(dim=1).clamp(min=1).to(prev.dtype)
    return torch.exp(log_ratio.sum(dim=1) / lengths)


def behaviour_weights(
    prev: torch.Tensor, gen: torch.Tensor, valid: torch.Tensor, *, enabled: bool, truncation: ISTruncation,
    lo: float, hi: float,
) -> BehaviourWeights:  # fmt: skip
    """The weights of the module docstring for ``[R, T]`` logprobs ``prev`` and ``gen`` and the boolean mask
    ``valid``; ``enabled`` False gives weight 1 everywhere (``raw`` and ``out_of_bounds`` are still reported)."""
    raw = torch.exp(prev - gen).detach()
    raw = torch.where(torch.isfinite(raw), raw, torch.zeros_like(raw))
    out_of_bounds = (raw < lo) | (raw > hi)
    masked_rows = None
    if not enabled:
        applied = torch.ones_like(raw)
    elif truncation == "none":
        applied = raw
    elif truncation == "tis":
        applied = raw.clamp(lo, hi)
    elif truncation == "icepop":
        applied = torch.where(out_of_bounds, torch.zeros_like(raw), raw)
    elif truncation == "seq_mask_tis":
        g = geometric_mean_weights(prev, gen, valid)
        masked_rows = ~((g >= lo) & (g <= hi))  # a NaN mean fails both comparisons: dropped
        applied = torch.where(masked_rows[:, None], torch.zeros_like(raw), raw)
    else:
        raise ValueError(f"is_truncation must be 'none', 'tis', 'icepop' or 'seq_mask_tis', got {truncation!r}")
    return BehaviourWeights(applied, raw, out_of_bounds, masked_rows)
