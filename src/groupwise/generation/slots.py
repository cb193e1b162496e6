"""Static decode slots: the state of up to S rows in buffers allocated once, so a decode step can be a CUDA graph.

A *slot* holds one row being decoded. Per slot: the token to feed next, its rotary position, the KV-cache
column it writes, its counter-RNG key and the index of the token it samples; per layer a KV cache
``[S, KV, C, D]``; a key mask ``[S, 1, 1, C]`` (True where the row may attend); and the step's outputs (the
token drawn and its logprob). Every one of these is written in place, never reallocated, so a graph captured
from :meth:`DecodeSlots.step_for` stays valid for as long as the slots live.

Buckets: a step runs on slots ``[0, B)`` for a bucket size B (:func:`row_bucket`), one captured graph per
bucket. When rows finish and the live ones fit a smaller bucket, :meth:`DecodeSlots.compact` moves them to
the front slots (their cache prefix, mask and counters) and the loop switches to that bucket's graph — rows
leave the batch by bucketing down. Slots ``[live, B)`` are idle: they compute on finite stale values and
their outputs are never read.

Attention reads all C columns under the mask (a graph's shapes are fixed), C being prompt width + new tokens
rounded up to :data:`CAPACITY_ROUND`. Every slot has its own positions, cache column and RNG counter, so the
same buffers can later hold rows that joined at different times (continuous batching): admitting a row is
prefilling it and loading it into a free slot.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from groupwise.generation.chunk import Prefill
from groupwise.generation.compiled_step import slot_cache_write
from groupwise.generation.sampling import keyed_uniforms, sample_with_logprobs
from groupwise.types import SamplingParams

if TYPE_CHECKING:
    from groupwise.generation.llama_decode import DecoderWeights, LlamaDecoder

# Cache capacity is rounded up to a multiple of this, so nearby prompt widths reuse the same buffers and graphs.
CAPACITY_ROUND = 64
# On CUDA the step's attention (one query per row against C masked columns) runs on the memory-efficient kernel,
# which takes any mask; math is the fallback. Pinned rather than left to the dispatcher, so what a graph bakes
# in is known (elsewhere the dispatcher chooses as always).
_CUDA_STEP_ATTENTION = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def row_bucket(rows: int) -> int:
    """The smallest bucket that holds ``rows`` rows: 1, 2, 4, 8, then powers of two and 1.5× powers of two
    (12, 16, 24, 32, 48, 64, …), so a bucket wastes at most a third of its rows."""
    if rows < 1:
        raise ValueError(f"rows={rows} must be >= 1")
    power = 1 << (rows - 1).bit_length()
    return power * 3 // 4 if power >= 16 and rows <= power * 3 // 4 else power


def capacity_for(positions: int) -> int:
    """Cache columns for ``positions`` (prompt width + new tokens), rounded up to :data:`CAPACITY_ROUND`."""
    return -(-positions // CAPACITY_ROUND) * CAPACITY_ROUND


class _SlotLayer:
    """One layer's cache as the decode step sees it: write the new K/V at each slot's column, attend to all."""

    def __init__(self, keys: Tensor, values: Tensor, column_index: Tensor) -> None:
        self.keys, self.values, self.column_index = keys, values, column_index

    def update(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        if torch.compiler.is_compiling():  # in place inside a compiled step (groupwise.generation.compiled_step)
            slot_cache_write(self.keys, self.values, self.column_index, key, value)
            return self.keys, self.values
        self.keys.scatter_(2, self.column_index, key)
        self.values.scatter_(2, self.column_index, value)
        return self.keys, self.values


@dataclass
class _SlotCache:
    layers: list[_SlotLayer]


class DecodeSlots:
    """``num_slots`` decode slots with a ``capacity``-column KV cache per layer (see the module docstring)."""

    def __init__(
        self, num_layers: int, num_slots: int, capacity: int, kv_heads: int, head_dim: int,
        dtype: torch.dtype, device: torch.device,
    ) -> None:  # fmt: skip
        self.num_slots, self.capacity, self.dtype, self.device = num_slots, capacity, dtype, device
        shape = (num_slots, kv_heads, capacity, head_dim)
        # Zeros, not empty: idle slots attend to columns nothing wrote, which must hold finite numbers.
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.key_mask = torch.zeros((num_slots, 1, 1, capacity), dtype=torch.bool, device=device)
        self.tokens = torch.zeros(num_slots, dtype=torch.long, device=device)
        # Rows: rotary position of the fed token, cache column it writes, index of the token it samples.
        self.counters = torch.zeros((3, num_slots), dtype=torch.long, device=device)
        self.rng_keys = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.next_tokens = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.next_logprobs = torch.zeros(num_slots, dtype=torch.float32, device=device)

    def fits(self, num_slots: int, capacity: int, dtype: torch.dtype, device: torch.device) -> bool:
        same_kind = (self.dtype, self.device) == (dtype, device)
        return same_kind and num_slots <= self.num_slots and capacity <= self.capacity

    def load(self, bucket: int, prefill: Prefill, first_tokens: Tensor) -> None:
        """Fill slots ``[0, R)`` with the chunk's rows — each its prompt's cache columns ``[0, W)``, padding mask,
        position and RNG key, and its first token (sampled from the prefill logits) to feed; idle slots up to
        ``bucket`` get neutral values."""
        count, width, to_prompt = prefill.row_to_prompt.numel(), prefill.width, prefill.row_to_prompt
        for keys, values, layer in zip(self.keys, self.values, prefill.cache.layers, strict=True):
            keys[:count, :, :width] = layer.keys[to_prompt]
            values[:count, :, :width] = layer.values[to_prompt]
        self.key_mask[:bucket] = False
        self.key_mask[:count, 0, 0, :width] = prefill.padding[to_prompt]
        self.key_mask[count:bucket, 0, 0, 0] = True  # idle slots attend to one column (never to none: NaN)
        self.tokens[:bucket] = 0
        self.tokens[:count] = first_tokens
        self.rng_keys[:bucket] = 0
        self.rng_keys[:count] = prefill.rng_keys
        positions, columns, sample_index = self.counters[:, :bucket]
        positions.zero_()
        positions[:count] = prefill.positions
        columns.fill_(width)  # the first decode step writes the column after the prompts
        sample_index.fill_(1)  # token 0 was sampled from the prefill logits

    def load_rows(
        self, slot_index: Tensor, prefill: Prefill, rows: Tensor, feed: Tensor, sample_index: Tensor
    ) -> None:
        """Load rows ``rows`` of ``prefill`` into the (free) slots ``slot_index``, wherever they are: each gets its
        sequence's cache columns ``[0, W)`` and padding mask (later columns masked, whatever they hold), its RNG key,
        the token to feed next (``feed``, at rotary position ``prefill.positions``, written at column W) and the
        index of the token it samples next (``sample_index``). The slots of other rows are left untouched, so rows
        that joined at different times share the step (continuous batching)."""
        width, to_prompt = prefill.width, prefill.row_to_prompt[rows]
        for keys, values, layer in zip(self.keys, self.values, prefill.cache.layers, strict=True):
            keys[slot_index, :, :width] = layer.keys[to_prompt]
            values[slot_index, :, :width] = layer.values[to_prompt]
        mask = torch.zeros((slot_index.numel(), 1, 1, self.capacity), dtype=torch.bool, device=self.device)
        mask[:, 0, 0, :width] = prefill.padding[to_prompt]
        self.key_mask[slot_index] = mask
        self.tokens[slot_index] = feed
        self.rng_keys[slot_index] = prefill.rng_keys[rows]
        self.counters[0, slot_index] = prefill.positions[rows]
        self.counters[1, slot_index] = width
        self.counters[2, slot_index] = sample_index

    def row_kv(self, slot: int, columns: int) -> Tensor:
        """The keys/values ``[layers, 2, KV, L, D]`` of the columns slot ``slot`` attends to among its first
        ``columns`` (its sequence, in order: padding and holes left out), copied out of the slots."""
        attended = self.key_mask[slot, 0, 0, :columns].nonzero().squeeze(1)
        return torch.stack([
            torch.stack([keys[slot].index_select(1, attended), values[slot].index_select(1, attended)])
            for keys, values in zip(self.keys, self.values, strict=True)
        ])  # fmt: skip

    def grown(self, num_slots: int, capacity: int) -> DecodeSlots:
        """New slots with at least this many slots and columns, holding every slot's state and cache."""
        num_slots, capacity = max(num_slots, self.num_slots), max(capacity, self.capacity)
        kv_heads, head_dim = self.keys[0].shape[1], self.keys[0].shape[3]
        bigger = DecodeSlots(len(self.keys), num_slots, capacity, kv_heads, head_dim, self.dtype, self.device)
        slots, columns = self.num_slots, self.capacity
        for new, old in zip((*bigger.keys, *bigger.values), (*self.keys, *self.values), strict=True):
            new[:slots, :, :columns] = old
        bigger.key_mask[:slots, ..., :columns] = self.key_mask
        for name in ("tokens", "rng_keys", "next_tokens", "next_logprobs"):
            getattr(bigger, name)[:slots] = getattr(self, name)
        bigger.counters[:, :slots] = self.counters
        return bigger

    def compact(self, keep: Tensor, filled: int) -> None:
        """Move slots ``keep`` (ascending) to ``[0, len(keep))``: state, mask and the first ``filled`` cache columns."""
        count = keep.numel()
        for buffer in (*self.keys, *self.values):
            buffer[:count, :, :filled] = buffer[keep, :, :filled]
        self.key_mask[:count] = self.key_mask[keep]
        self.tokens[:count] = self.tokens[keep]
        self.rng_keys[:count] = self.rng_keys[keep]
        self.counters[:, :count] = self.counters[:, keep]

    def advance(self, bucket: int) -> None:
        """After a step: feed the drawn tokens next, one position, column and token index further."""
        self.tokens[:bucket] = self.next_tokens[:bucket]
        self.counters[:, :bucket] += 1

    def step_for(
        self, decoder: LlamaDecoder, weights: DecoderWeights, bucket: int, sampling: SamplingParams
    ) -> Callable[[], None]:
        """The decode step of slots ``[0, bucket)`` as a closure over views of the buffers and ``weights``.

        It feeds each slot's token, writes its K/V at its column (marking the column in the mask), draws the
        next token from the slot's counter RNG and stores it with its logprob in ``next_tokens``/``next_logprobs``.
        It advances nothing, so running it twice in a row writes the same values (a graph warm-up needs that).
        """
        tokens, rng_keys, mask = self.tokens[:bucket], self.rng_keys[:bucket], self.key_mask[:bucket]
        positions, columns, sample_index = self.counters[:, :bucket]
        next_tokens, next_logprobs = self.next_tokens[:bucket], self.next_logprobs[:bucket]
        layers = [(keys[:bucket], values[:bucket]) for keys, values in zip(self.keys, self.values, strict=True)]
        kv_heads, head_dim = self.keys[0].shape[1], self.keys[0].shape[3]
        temperature, top_k, top_p = sampling.temperature, sampling.top_k, sampling.top_p
        last_column = self.capacity - 1
        cuda = self.device.type == "cuda"

        def step() -> None:
            column = columns.clamp(max=last_column).view(bucket, 1, 1, 1)  # never out of bounds, even when idle
            mask.scatter_(-1, column, True)
            column_index = column.expand(bucket, kv_heads, 1, head_dim)
            cache = _SlotCache([_SlotLayer(keys, values, column_index) for keys, values in layers])
            with sdpa_kernel(_CUDA_STEP_ATTENTION) if cuda else contextlib.nullcontext():
                logits = decoder.step(tokens, positions, mask, cache, weights)
            drawn, logprobs = sample_with_logprobs(
                logits, keyed_uniforms(rng_keys, sample_index), temperature, top_k, top_p
            )
            next_logprobs.copy_(logprobs)
            next_tokens.copy_(drawn)

        return step
