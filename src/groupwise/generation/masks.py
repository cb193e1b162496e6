"""Attention masks the engine hands to a model: built once per chunk from the prompts' padding.

sdpa takes a boolean mask (True = attend, one byte per entry); eager attention adds a float mask to its
scores (0 where allowed, the dtype's minimum where not).
"""

from __future__ import annotations

import torch
from torch import Tensor


def as_mask(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """``allowed`` itself for a boolean mask, else an additive one: 0 where allowed, the dtype's minimum where not."""
    if dtype == torch.bool:
        return allowed
    additive = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return additive.masked_fill_(~allowed, torch.finfo(dtype).min)


def prefill_allowed(padding: Tensor) -> Tensor:
    """``[U, P, P]``: query q sees key k iff k is a real token and k <= q.

    A padded query also sees itself: a fully masked row would give NaN, and NaN values leak into
    real rows through 0 · NaN in the next layer's attention.
    """
    width = padding.shape[1]
    causal = torch.ones((width, width), dtype=torch.bool, device=padding.device).tril()
    diagonal = torch.eye(width, dtype=torch.bool, device=padding.device)
    return (causal & padding[:, None, :]) | diagonal
