"""The engine's decode loop without static slots: finished rows leave the batch, and the cache, an eighth at a time.

Each step draws one token per row (:mod:`groupwise.generation.sampling`), records it
(:class:`~groupwise.generation.chunk.ChunkRecord`) and feeds the live rows to the fast step or the model's forward.
Retired rows stay in the batch until an eighth of it has retired: each compaction copies the KV cache, each
lingering row costs one row of compute per step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from transformers.cache_utils import Cache

from groupwise.generation.chunk import ChunkRecord, Prefill
from groupwise.generation.kv_cache import select_cache_rows
from groupwise.generation.sampling import keyed_uniforms, sample_with_logprobs
from groupwise.types import SamplingParams

if TYPE_CHECKING:
    from groupwise.generation.llama_decode import LlamaDecoder

# Compact the batch once this fraction of its rows has finished (see _Batch).
_COMPACT_FRACTION = 0.125

# (input_ids [B, 1], key mask, position_ids [B, 1], cache) -> logits [B, V]: the model's own forward.
Forward = Callable[[Tensor, Tensor, Tensor, Cache], Tensor]


def decode_compacting(
    decoder: LlamaDecoder | None, prefill: Prefill, sampling: SamplingParams, record: ChunkRecord, forward: Forward,
    key_mask_for: Callable[[Tensor], Tensor],
) -> None:  # fmt: skip
    """Decode a prefilled chunk to the end; ``decoder`` is the fast step (None: ``forward``), ``key_mask_for`` turns
    a ``[B, K]`` boolean key mask into what the model's attention takes."""
    max_new, num_rows = sampling.max_new_tokens, prefill.row_to_prompt.numel()
    cache, width = prefill.cache, prefill.width
    if prefill.padding.shape[0] != num_rows:
        select_cache_rows(cache, prefill.row_to_prompt)
    # Key mask for every position the loop can reach, built once; each step takes a prefix view.
    padding = prefill.padding[prefill.row_to_prompt]
    key_mask = key_mask_for(torch.cat([padding, padding.new_ones((num_rows, max_new))], dim=1))
    batch = _Batch(
        rows=torch.arange(num_rows, device=key_mask.device),
        live=torch.ones(num_rows, dtype=torch.bool, device=key_mask.device),
        keys=prefill.rng_keys,
        positions=prefill.positions.clone(),
        key_mask=key_mask,
    )
    logits = prefill.logits
    for step in range(max_new):
        uniforms = keyed_uniforms(batch.keys, step)
        tokens, logprobs = sample_with_logprobs(logits, uniforms, sampling.temperature, sampling.top_k, sampling.top_p)
        batch.live &= ~record.add(step, batch.rows, batch.live, tokens, logprobs)
        num_live = int(batch.live.sum())  # the one host sync per step
        if num_live == 0 or step == max_new - 1:
            break
        num_batch = batch.rows.numel()
        if num_batch - num_live >= max(1, int(num_batch * _COMPACT_FRACTION)):
            keep = batch.live.nonzero().squeeze(1)
            batch, tokens = batch.select(keep), tokens[keep]
            select_cache_rows(cache, keep)
        step_mask = batch.key_mask[..., : width + step + 1]
        if decoder is not None:
            logits = decoder.step(tokens, batch.positions, step_mask, cache)
        else:
            logits = forward(tokens.unsqueeze(1), step_mask, batch.positions.unsqueeze(1), cache)
        batch.positions += 1


@dataclass
class _Batch:
    """Decode state of the rows in the batch, one entry per batch row (finished ones linger until compacted)."""

    rows: Tensor  # index of the row in the chunk
    live: Tensor  # still generating
    keys: Tensor  # int64 counter-RNG key per row, from (request seed, sample index)
    positions: Tensor  # position id of the next token fed
    key_mask: Tensor  # [B, K] 0/1, or [B, 1, 1, K] additive

    def select(self, keep: Tensor) -> _Batch:
        return _Batch(*(getattr(self, f.name)[keep] for f in fields(self)))
