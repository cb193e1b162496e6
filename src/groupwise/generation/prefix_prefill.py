"""A prefill's inputs when some sequences start with reused keys/values: only each one's new suffix runs.

A generation stream keeps the keys/values of sequences it computed (:mod:`groupwise.generation.prefix_store`);
a sequence that extends one is prefilled from where that one ends. With ``U`` distinct sequences, sequence ``u``
reusing the keys/values of its first ``P_u`` tokens and running its remaining ``Q_u`` tokens, the cache columns
are laid out as two left-padded blocks, the reused prefixes in ``[0, P)`` (``P = max P_u``) and the suffixes in
``[P, P + Q)`` (``Q = max Q_u``)::

    padding[u, c]    = c ≥ P − P_u               for c < P   (a real reused column)
                     = c − P ≥ Q − Q_u           for c ≥ P   (a real suffix column)
    position[u, q]   = P_u + #(real suffix tokens up to q) − 1, clamped at 0 on padding
    allowed[u, q, c] = padding[u, c]                                for c < P   (every reused column)
                     = prefill_allowed(suffix padding)[u, q, c − P]   for c ≥ P   (causal; a pad sees itself)

Rotary positions are the tokens' own (``P_u`` onwards), so a suffix's keys and queries are what a full prefill of
the sequence computes, and the reused keys were rotated at their own positions when first computed. The padding
has holes (between a short prefix and its suffix); the decode slots take any key mask. With no reuse (every
``P_u = 0``) these are exactly a plain prefill's inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from groupwise.generation.masks import prefill_allowed


@dataclass(frozen=True)
class PrefillInputs:
    """What the model runs on (the suffixes) and the cache it starts from (the reused prefixes)."""

    input_ids: Tensor  # [U, Q]: the suffixes, left-padded
    padding: Tensor  # [U, P + Q] bool: True at real columns (reused or new)
    position_ids: Tensor  # [U, Q]
    allowed: Tensor  # [U, Q, P + Q] bool: query q of sequence u may attend to column c
    prefix: Tensor | None  # [layers, 2, U, KV, P, D]: reused keys/values (None: nothing reused)


def prefill_inputs(sequences: Sequence[tuple[int, ...]], reused: Sequence[Tensor | None]) -> PrefillInputs:
    """Inputs for ``sequences``; ``reused[u]`` is None or the keys/values ``[layers, 2, KV, P_u, D]`` of the first
    ``P_u`` tokens of sequence u (``P_u`` < its length: at least one token runs, for its logits). On the host;
    the caller moves them to the model's device."""
    lengths = [0 if kv is None else kv.shape[-2] for kv in reused]
    if any(length >= len(sequence) for length, sequence in zip(lengths, sequences, strict=True)):
        raise ValueError("a reused prefix must leave at least one token of its sequence to prefill")
    width_p = max(lengths)
    width_q = max(len(sequence) - length for sequence, length in zip(sequences, lengths, strict=True))
    count = len(sequences)
    input_ids = torch.zeros((count, width_q), dtype=torch.long)
    padding = torch.zeros((count, width_p + width_q), dtype=torch.bool)
    for u, (sequence, length) in enumerate(zip(sequences, lengths, strict=True)):
        suffix = sequence[length:]
        input_ids[u, width_q - len(suffix) :] = torch.as_tensor(suffix, dtype=torch.long)
        padding[u, width_p - length : width_p] = True
        padding[u, width_p + width_q - len(suffix) :] = True
    suffix_padding = padding[:, width_p:]
    starts = torch.tensor(lengths, dtype=torch.long)[:, None]
    position_ids = (starts + suffix_padding.long().cumsum(dim=1) - 1).clamp_(min=0)
    allowed = torch.cat([padding[:, None, :width_p].expand(count, width_q, width_p),
                         prefill_allowed(suffix_padding)], dim=-1)  # fmt: skip
    return PrefillInputs(input_ids, padding, position_ids, allowed, _stack_prefixes(reused, width_p))


def _stack_prefixes(reused: Sequence[Tensor | None], width: int) -> Tensor | None:
    """``[layers, 2, U, KV, P, D]``: each sequence's reused keys/values right-aligned in ``P`` columns, zeros before."""
    present = [kv for kv in reused if kv is not None]
    if width == 0 or not present:
        return None
    like = present[0]
    layers, _, kv_heads, _, dim = like.shape
    stacked = like.new_zeros((layers, 2, len(reused), kv_heads, width, dim))
    for u, kv in enumerate(reused):
        if kv is not None and kv.shape[-2]:
            stacked[:, :, u, :, width - kv.shape[-2] :] = kv
    return stacked
