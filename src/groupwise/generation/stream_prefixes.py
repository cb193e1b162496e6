"""How a generation stream reuses keys/values across requests: what it stores, when, and under which weights.

A row that finishes in its slot leaves the keys/values of its sequence (prompt + tokens but the last) in a
:class:`~groupwise.generation.prefix_store.PrefixStore`; a later prefill of a sequence that starts the same way
runs only the rest (:mod:`groupwise.generation.prefix_prefill`). A multi-turn episode's next turn is exactly
that: the previous prompt, the sampled tokens and the environment's answer.

Weights: each row records the weights stamp its keys/values were prefilled under (:meth:`StreamPrefixes.mark`);
a row is stored only when the weights are still those (with ``kv="keep"`` a row that lived across a weight load
holds older keys/values and is not stored), and the store empties whenever the stamp changes, so nothing computed
under older weights is reused. Reuse is off (``prefix_tokens=0``, or an attention that takes no 4D mask): every
prefill runs whole, as before.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from groupwise.generation.prefix_store import PrefixStore

if TYPE_CHECKING:
    from groupwise.generation.chunk import Prefill
    from groupwise.generation.engine import Engine
    from groupwise.generation.llama_decode import LlamaDecoder
    from groupwise.generation.stream_rows import StreamRow
    from groupwise.generation.stream_slots import SlotRows


# The default cap, in multiples of the token positions the stream's slots hold (slots × columns). An episode waiting
# between turns needs its whole context kept until its next turn is admitted, and an async run keeps more episodes
# in flight than there are slots: bench/episodes.py (4 episodes per slot) reused 2/3 of every prompt token at 2×
# and thrashed at 1× (the least recently used entry is the next one to be needed), reusing a third, for no speedup.
DEFAULT_CAP_SLOTS = 2


class StreamPrefixes:
    """The reuse of one stream (see the module docstring); ``cap``: token positions kept (None: twice as many as the
    stream's slots hold, :data:`DEFAULT_CAP_SLOTS`; 0: reuse nothing)."""

    def __init__(self, engine: Engine, decoder: LlamaDecoder, slots: SlotRows, cap: int | None) -> None:
        if cap is not None and cap < 0:
            raise ValueError(f"prefix_tokens={cap} must be >= 0 (0: reuse nothing; None: twice the slots' positions)")
        self.engine, self.decoder, self.slots, self.cap = engine, decoder, slots, cap
        self.enabled = engine.reuses_prefixes and cap != 0
        self.store = PrefixStore(cap or 0)
        self.reused_tokens = 0  # sequence tokens whose keys/values came from the store instead of a prefill
        self.prefilled_tokens = 0  # sequence tokens run through a prefill

    def weights_stamp(self) -> Hashable | None:
        """The weights the engine computes under now (None: their changes cannot be seen; nothing is kept)."""
        decoder_stamp = self.decoder.weights_stamp()
        return None if decoder_stamp is None else (self.engine.version, decoder_stamp)

    def reused(self, sequences: Mapping[tuple[int, ...], int]) -> dict[int, Tensor]:
        """For a prefill of ``sequences`` (sequence → its id): the stored keys/values of each one's longest
        stored prefix, by id — all of it but the last token at most (that one's logits are needed)."""
        found: dict[int, Tensor] = {}
        if self.enabled:
            self.store.match_weights(self.weights_stamp())
            for sequence, sequence_id in sequences.items():
                kv = self.store.longest(sequence, len(sequence) - 1)
                if kv is not None:
                    found[sequence_id] = kv
        reused = sum(kv.shape[-2] for kv in found.values())
        self.reused_tokens += reused
        self.prefilled_tokens += sum(len(sequence) for sequence in sequences) - reused
        return found

    def mark(self, rows: list[StreamRow]) -> None:
        """``rows`` were just prefilled into their slots: their keys/values are the current weights'."""
        if self.enabled and rows:
            stamp = self.weights_stamp()
            for row in rows:
                row.kv_stamp = stamp

    def keep(self, finished: Collection[StreamRow]) -> None:
        """Store the keys/values of rows that just finished in their slots (before they leave them), unless some
        were computed under other weights than the current."""
        if not self.enabled or not finished:
            return
        stamp = self.weights_stamp()
        self.store.match_weights(stamp)
        self.store.max_tokens = self._cap()
        for row in finished:
            if stamp is not None and row.kv_stamp == stamp:
                self.store.put(row.sequence, self.slots.sequence_kv(row))

    def keep_prefilled(self, rows: list[StreamRow], prefill: Prefill, at: list[int]) -> None:
        """Store the keys/values of rows that finished with the token their prefill drew (never in a slot):
        rows ``at`` of ``prefill``, whose sequence is their prompt."""
        if not self.enabled or not rows:
            return
        stamp = self.weights_stamp()
        self.store.match_weights(stamp)
        self.store.max_tokens = self._cap()
        if stamp is not None:
            for row, index in zip(rows, at, strict=True):
                self.store.put(row.sequence, _prefilled_kv(prefill, index))

    def _cap(self) -> int:
        return self.cap if self.cap is not None else DEFAULT_CAP_SLOTS * self.slots.positions()

    def clear(self) -> None:
        """Forget every stored prefix (new weights were loaded, or the stream closed)."""
        self.store.clear()


def _prefilled_kv(prefill: Prefill, row: int) -> Tensor:
    """The keys/values ``[layers, 2, KV, L, D]`` of row ``row``'s sequence in a prefill's cache (padding left out)."""
    sequence = int(prefill.row_to_prompt[row])
    attended = prefill.padding[sequence].nonzero().squeeze(1)
    return torch.stack([
        torch.stack([layer.keys[sequence].index_select(1, attended), layer.values[sequence].index_select(1, attended)])
        for layer in prefill.cache.layers
    ])  # fmt: skip
