"""Where a generation stream's rows decode: the static slots, which row each slot holds, one step for all of them.

:class:`SlotRows` owns the host map slot → row of a stream (:mod:`groupwise.generation.stream`) over
:class:`~groupwise.generation.slots.DecodeSlots`. Rows are loaded into free slots wherever they are (the lowest
first, so the step's row bucket stays small); a step runs the bucket that holds the highest occupied slot, after
moving the live rows to the front slots whenever they fit a smaller bucket. Slots grow — every live row's state and
cache copied — when more rows or columns are needed; growing or a rebinding of the decoder's weights drops the
captured steps (:class:`~groupwise.generation.step_graphs.StepGraphs`), in-place weight changes keep them.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import torch

from groupwise.generation.slots import DecodeSlots, capacity_for, row_bucket
from groupwise.generation.step_graphs import StepGraphs
from groupwise.generation.stream_rows import StreamRow
from groupwise.types import SamplingParams

if TYPE_CHECKING:
    from torch import Tensor

    from groupwise.generation.chunk import Prefill
    from groupwise.generation.llama_decode import LlamaDecoder


def _slot_of(row: StreamRow) -> int:
    if row.slot is None:
        raise RuntimeError("a row without a slot was treated as decoding")
    return row.slot


def _occupant(row: StreamRow | None) -> StreamRow:
    if row is None:
        raise RuntimeError("an occupied slot lost its row")
    return row


class StreamSlots:
    """The slots a stream decodes in and their captured steps; an engine keeps one for its own calls."""

    def __init__(self, use_graphs: bool, compile_steps: bool = False) -> None:
        self.graphs = StepGraphs(use_graphs, compile_steps)
        self.slots: DecodeSlots | None = None
        self.generation = -1  # the decoder weights' generation the captured steps read


class SlotRows:
    """The rows of one stream in its slots (see the module docstring)."""

    def __init__(self, held: StreamSlots, decoder: LlamaDecoder, sampling: SamplingParams) -> None:
        self.held, self.decoder, self.sampling = held, decoder, sampling
        self._rows: list[StreamRow | None] = []
        self.live = 0

    def _decode_slots(self) -> DecodeSlots:
        if self.held.slots is None:
            raise RuntimeError("the stream's slots were used before ensure_room made them")
        return self.held.slots

    def live_rows(self) -> list[StreamRow]:
        return [row for row in self._rows if row is not None]

    def ensure_room(self, rows: int, columns: int) -> None:
        """Slots for ``rows`` live rows with ``columns`` cache columns; grown (state kept) when smaller. Also
        refreshes the decoder's packed weights and rotary table (cheap when nothing changed)."""
        held, like = self.held, self.decoder.weights.embed
        needed_slots, capacity = row_bucket(max(1, rows)), capacity_for(columns)
        slots = held.slots
        if slots is not None and (slots.dtype, slots.device) != (like.dtype, like.device):
            if self.live:
                raise RuntimeError("the model moved to another device or dtype while rows were decoding")
            slots = held.slots = None
        if slots is None or slots.num_slots < needed_slots or slots.capacity < capacity:
            held.graphs.reset()
            if slots is None:
                slots = DecodeSlots(
                    len(self.decoder.weights.layers), needed_slots, capacity, self.decoder.num_kv_heads,
                    self.decoder.head_dim, like.dtype, like.device,
                )  # fmt: skip
            else:
                slots = slots.grown(needed_slots, capacity)
            held.slots = slots
        if len(self._rows) < slots.num_slots:
            self._rows += [None] * (slots.num_slots - len(self._rows))
        self.decoder.prepare(slots.capacity)  # the rotary table covers every column

    def load(self, rows: list[StreamRow], prefill: Prefill, prefill_rows: list[int], into_own: bool = False) -> None:
        """Put ``rows`` (rows ``prefill_rows`` of ``prefill``) into free slots, or back into their own slots
        (``into_own``: their KV rebuilt); each feeds its last token next and samples token ``len(tokens)``."""
        if not rows:
            return
        device = prefill.positions.device
        if into_own:
            slots = [_slot_of(row) for row in rows]
        else:
            slots = [i for i, row in enumerate(self._rows) if row is None][: len(rows)]
            self.live += len(rows)
        slot_index = torch.tensor(slots, dtype=torch.long, device=device)
        feed = torch.tensor([row.token_ids[-1] for row in rows], dtype=torch.long, device=device)
        sample_index = torch.tensor([len(row.token_ids) for row in rows], dtype=torch.long, device=device)
        at = torch.tensor(prefill_rows, dtype=torch.long, device=device)
        self._decode_slots().load_rows(slot_index, prefill, at, feed, sample_index)
        for row, slot in zip(rows, slots, strict=True):
            row.slot, row.column = slot, prefill.width
            self._rows[slot] = row

    def sequence_kv(self, row: StreamRow) -> Tensor:
        """The keys/values of ``row``'s sequence (prompt + tokens but the last) as its slot holds them, ``[layers,
        2, KV, len(sequence), D]``; read before the row leaves its slot."""
        kv = self._decode_slots().row_kv(_slot_of(row), row.column)
        if kv.shape[-2] != len(row.sequence):
            raise RuntimeError(f"a slot attends to {kv.shape[-2]} columns for a {len(row.sequence)}-token sequence")
        return kv

    def positions(self) -> int:
        """Token positions the slots' KV cache holds (slots × columns): what a full cache costs."""
        slots = self.held.slots
        return 0 if slots is None else slots.num_slots * slots.capacity

    def free(self, row: StreamRow) -> None:
        self._rows[_slot_of(row)] = None
        row.slot = None
        self.live -= 1

    def clear(self) -> None:
        """Forget every row (after a failure); captured steps are dropped too (one may be half-captured)."""
        for row in self.live_rows():
            row.slot = None
        self._rows = [None] * len(self._rows)
        self.live = 0
        self.held.graphs.reset()

    def step(self) -> tuple[list[StreamRow], list[int], list[float]]:
        """One decode step of every live row: ``(rows, tokens drawn, their logprobs)``, in slot order."""
        held = self.held
        if self.decoder.generation != held.generation:  # the weights' storage moved: captured steps read the old
            held.graphs.reset()
            held.generation = self.decoder.generation
        occupied = [i for i, row in enumerate(self._rows) if row is not None]
        bucket = row_bucket(occupied[-1] + 1)
        if row_bucket(len(occupied)) < bucket:  # the live rows fit a smaller bucket: move them to the front
            self._compact(occupied)
            occupied, bucket = list(range(len(occupied))), row_bucket(len(occupied))
        s, slots = self.sampling, self._decode_slots()
        held.graphs.run((bucket, s.temperature, s.top_k, s.top_p),
                        partial(slots.step_for, self.decoder, self.decoder.weights, bucket, s))  # fmt: skip
        tokens = slots.next_tokens[:bucket].tolist()  # the one host sync per step
        logprobs = slots.next_logprobs[:bucket].tolist()
        slots.advance(bucket)
        # A free slot inside the bucket keeps stepping on stale values; its rotary position must stay in the table.
        slots.counters[0, :bucket].clamp_(max=slots.capacity - 1)
        rows = [_occupant(self._rows[i]) for i in occupied]
        for row in rows:
            row.column += 1
        return rows, [tokens[i] for i in occupied], [logprobs[i] for i in occupied]

    def _compact(self, occupied: list[int]) -> None:
        keep = [_occupant(self._rows[i]) for i in occupied]
        filled = max(row.column for row in keep)
        slots = self._decode_slots()
        slots.compact(torch.tensor(occupied, device=slots.device), filled)
        self._rows = [*keep, *([None] * (len(self._rows) - len(keep)))]
        for slot, row in enumerate(keep):
            row.slot = slot

