"""The engine's decode loop on static slots: one captured step per row bucket, rows leaving by bucketing down.

Token 0 of every row is drawn eagerly from the prefill logits (the same sampling functions the step uses);
then each step replays the bucket's captured step (:mod:`groupwise.generation.step_graphs`) on the slots
(:mod:`groupwise.generation.slots`), records the drawn tokens (:class:`~groupwise.generation.chunk.ChunkRecord`)
and advances the slots. One host sync per step reads how many rows are still live; when they fit a smaller
bucket, the live rows move to the front slots and that bucket's step runs from then on.

What makes captured steps stale, and is checked before every chunk: the slots reallocated (a chunk with more
rows or columns than they hold) or the decoder's weights rebound (``LlamaDecoder.generation``). Either drops
every captured step; in-place weight changes (optimizer steps, ``load_weights``) keep them.
"""

from __future__ import annotations

from functools import partial

import torch

from groupwise.generation.chunk import ChunkRecord, Prefill
from groupwise.generation.llama_decode import LlamaDecoder
from groupwise.generation.sampling import keyed_uniforms, sample_with_logprobs
from groupwise.generation.slots import DecodeSlots, capacity_for, row_bucket
from groupwise.generation.step_graphs import StepGraphs
from groupwise.types import SamplingParams


class SlotLoop:
    """Owns the slots (kept between calls, so a call of the same shape allocates nothing) and the captured steps."""

    def __init__(self, use_graphs: bool, compile_steps: bool = False) -> None:
        self.graphs = StepGraphs(use_graphs, compile_steps)
        self._slots: DecodeSlots | None = None
        self._generation = -1  # the decoder weights' generation the captured steps read

    def decode(self, decoder: LlamaDecoder, prefill: Prefill, sampling: SamplingParams, record: ChunkRecord) -> None:
        num_rows, width = prefill.row_to_prompt.numel(), prefill.width
        bucket = row_bucket(num_rows)
        slots = self._slots_for(decoder, bucket, capacity_for(width + sampling.max_new_tokens))
        temperature, top_k, top_p = sampling.temperature, sampling.top_k, sampling.top_p
        first, logprobs = sample_with_logprobs(
            prefill.logits, keyed_uniforms(prefill.rng_keys, 0), temperature, top_k, top_p
        )
        slot_rows = torch.arange(num_rows, device=first.device)  # the chunk row each slot holds
        live = torch.ones(num_rows, dtype=torch.bool, device=first.device)
        live &= ~record.add(0, slot_rows, live, first, logprobs)
        slots.load(bucket, prefill, first)
        for step in range(1, sampling.max_new_tokens):
            num_live = int(live.sum())  # the one host sync per step
            if num_live == 0:
                break
            if row_bucket(num_live) < bucket:
                keep = live.nonzero().squeeze(1)
                slots.compact(keep, filled=width + step - 1)
                slot_rows, live, bucket = slot_rows[keep], live[keep], row_bucket(num_live)
            key = (bucket, temperature, top_k, top_p)
            self.graphs.run(key, partial(slots.step_for, decoder, decoder.weights, bucket, sampling))
            count = slot_rows.numel()
            live &= ~record.add(step, slot_rows, live, slots.next_tokens[:count], slots.next_logprobs[:count])
            slots.advance(bucket)

    def _slots_for(self, decoder: LlamaDecoder, bucket: int, capacity: int) -> DecodeSlots:
        """The slots, reallocated (and every captured step dropped) when too small; steps dropped when stale."""
        like = decoder.weights.embed
        if decoder.generation != self._generation:  # the weights' storage moved: captured steps read the old one
            self.graphs.reset()
            self._generation = decoder.generation
        if self._slots is None or not self._slots.fits(bucket, capacity, like.dtype, like.device):
            self.graphs.reset()
            previous, self._slots = self._slots, None
            if previous is not None and (previous.dtype, previous.device) == (like.dtype, like.device):
                bucket, capacity = max(bucket, previous.num_slots), max(capacity, previous.capacity)
            del previous  # free the old buffers before allocating the new ones
            self._slots = DecodeSlots(
                len(decoder.weights.layers), bucket, capacity, decoder.num_kv_heads, decoder.head_dim,
                like.dtype, like.device,
            )  # fmt: skip
        return self._slots
