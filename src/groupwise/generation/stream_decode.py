"""The device side of a generation stream's token boundary: rows admitted into slots, one step of every live row.

:class:`RowDecoding` is what :class:`~groupwise.generation.stream.GenerationStream` runs once its mail is read:

* **Admission.** Rows taken in wait in arrival order and enter free slots whole requests at a time. Their prefill
  is one forward per distinct sequence (a fresh request's samples share their prompt's), each from the longest
  prefix whose keys/values the stream kept (:mod:`groupwise.generation.stream_prefixes`); a fresh row draws its
  token 0 from the prefill logits with the sampling functions of every step.
* **Decoding.** One step of every live row (:class:`~groupwise.generation.stream_slots.SlotRows`); rows that finish
  leave their slots and their keys/values to the prefix store.
* **After a weight load** the live rows' KV is rebuilt under the new weights (``kv="recompute"``: a prefill of
  prompt + tokens but the last), or kept as it was computed (``kv="keep"``); the prefix store empties either way.

Every drawn token is appended with its sampling-time logprob and the version that drew it under the stream's lock,
so a progress reader sees each row at a token boundary; the seconds of each prefill, step and rebuild are split
evenly among the rows it ran and charged to their requests.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING

import torch

from groupwise.generation.sampling import keyed_uniforms, sample_with_logprobs
from groupwise.generation.stream_prefixes import StreamPrefixes
from groupwise.generation.stream_rows import FinishRules, StreamRequest, StreamRow
from groupwise.generation.stream_slots import SlotRows, StreamSlots
from groupwise.types import SamplingParams

if TYPE_CHECKING:
    from groupwise.generation.chunk import Prefill
    from groupwise.generation.engine import Engine
    from groupwise.generation.llama_decode import LlamaDecoder


class RowDecoding:
    """The rows of one stream, waiting or in slots, and the work of a token boundary on them (module docstring).

    Used from the serving thread only; ``lock`` is the stream's, held while rows gain tokens or seconds."""

    def __init__(
        self, engine: Engine, decoder: LlamaDecoder, sampling: SamplingParams, slots: StreamSlots, *, max_rows: int,
        prefix_tokens: int | None, lock: threading.Condition,
    ) -> None:  # fmt: skip
        self.engine, self.sampling, self.max_rows = engine, sampling, max_rows
        self.slots = SlotRows(slots, decoder, sampling)
        self.prefixes = StreamPrefixes(engine, decoder, self.slots, prefix_tokens)
        self.rules = FinishRules(engine.eos_token_ids, engine.tokenizer, sampling)
        self.waiting: deque[StreamRow] = deque()  # rows taken in, waiting for a slot
        self._lock = lock
        self.steps = 0  # decode steps run: progress for a stall watchdog
        self.joins = 0  # requests taken in while other rows were decoding
        self.generated_tokens = 0

    def busy(self) -> bool:
        """Rows decoding or waiting for a slot."""
        return bool(self.slots.live or self.waiting)

    def take_in(self, entry: StreamRequest) -> None:
        """Queue the request's unfinished rows for slots."""
        self.waiting.extend(row for row in entry.rows if row.finish is None)

    def drop(self, entry: StreamRequest) -> None:
        """The request's rows leave the queue and their slots."""
        self.waiting = deque(row for row in self.waiting if row.request is not entry)
        for row in entry.rows:
            if row.slot is not None:
                self.slots.free(row)

    def clear(self) -> None:
        """Forget every row (after a failure)."""
        self.waiting.clear()
        self.slots.clear()

    def weights_loaded(self, recompute: bool) -> None:
        """The engine's weights just changed: the prefix store empties; the live rows get room for their next
        token, and with ``recompute`` their KV rebuilt under the new weights."""
        self.prefixes.clear()  # computed under the old weights: never reused under the new
        if self.slots.live:
            with torch.inference_mode():  # the packed copies are inference tensors: refreshed in there
                self.slots.ensure_room(self.slots.live, 1)
                if recompute:
                    self._recompute_live()

    def _recompute_live(self) -> None:
        """Rebuild the live rows' KV under the weights just loaded: prefill prompt + tokens but the last."""
        start = time.perf_counter()
        rows = self.slots.live_rows()
        prefill = self._prefill(rows)
        self.slots.ensure_room(self.slots.live, prefill.width + self.sampling.max_new_tokens)
        self.slots.load(rows, prefill, list(range(len(rows))), into_own=True)
        self.prefixes.mark(rows)
        self._charge(rows, time.perf_counter() - start)

    def _charge(self, rows: list[StreamRow], seconds: float) -> None:
        """Attribute ``seconds`` of work on ``rows`` to their requests, evenly per row."""
        with self._lock:
            for row in rows:
                row.request.seconds += seconds / len(rows)

    def admit(self) -> set[StreamRow]:
        """Take waiting rows into free slots, whole requests at a time in arrival order; returns the rows that
        finished with their first token (they take no slot)."""
        room = self.max_rows - self.slots.live
        batch: list[StreamRow] = []
        while self.waiting and room > len(batch):
            head = self.waiting[0].request
            pending = [row for row in self.waiting if row.request is head]
            if len(pending) > room - len(batch) and (batch or self.slots.live):
                break  # wait for its slots to free up rather than prefill its prompt twice
            for row in pending[: room - len(batch)]:
                self.waiting.remove(row)
                batch.append(row)
        if not batch:
            return set()
        if self.slots.live:
            self.joins += len({row.request.handle for row in batch})
        start = time.perf_counter()
        prefill = self._prefill(batch)
        self.slots.ensure_room(self.slots.live + len(batch), prefill.width + self.sampling.max_new_tokens)
        fresh = [i for i, row in enumerate(batch) if not row.token_ids]
        finished = set(self._draw_first(batch, fresh, prefill)) if fresh else set()
        ended = [i for i, row in enumerate(batch) if row in finished]
        self.prefixes.keep_prefilled([batch[i] for i in ended], prefill, ended)
        loaded = [i for i, row in enumerate(batch) if row not in finished]
        self.slots.load([batch[i] for i in loaded], prefill, loaded)
        self.prefixes.mark([batch[i] for i in loaded])
        self._charge(batch, time.perf_counter() - start)
        return finished

    def _prefill(self, rows: list[StreamRow]) -> Prefill:
        """One forward per distinct sequence, each from the longest prefix of it whose keys/values were kept."""
        index: dict[tuple[int, ...], int] = {}
        specs = []
        for row in rows:
            sequence = row.sequence
            specs.append((index.setdefault(sequence, len(index)), row.sample, row.request.request.seed, sequence))
        return self.engine.prefill_rows(specs, self.prefixes.reused(index))

    def _draw_first(self, batch: list[StreamRow], fresh: list[int], prefill: Prefill) -> list[StreamRow]:
        """Token 0 of fresh rows, from their prefill logits (the same sampling functions as every step); returns
        the rows that finished with it."""
        at = torch.tensor(fresh, dtype=torch.long, device=prefill.positions.device)
        logits, keys = prefill.logits[at], prefill.rng_keys[at]
        s = self.sampling
        first, logprobs = sample_with_logprobs(logits, keyed_uniforms(keys, 0), s.temperature, s.top_k, s.top_p)
        version = self.engine.version
        with self._lock:
            for i, token, logprob in zip(fresh, first.tolist(), logprobs.tolist(), strict=True):
                batch[i].token_ids.append(token)
                batch[i].logprobs.append(logprob)
                batch[i].versions.append(version)
            finished = self.rules.apply([batch[i] for i in fresh])
        self.generated_tokens += len(fresh)
        return finished

    def step(self) -> list[StreamRow]:
        """One decode step of every live row; returns the rows that finished (out of their slots already)."""
        start = time.perf_counter()
        rows, tokens, logprobs = self.slots.step()
        version = self.engine.version
        seconds = (time.perf_counter() - start) / max(1, len(rows))
        with self._lock:  # progress readers see every row at a token boundary
            for row, token, logprob in zip(rows, tokens, logprobs, strict=True):
                row.token_ids.append(token)
                row.logprobs.append(logprob)
                row.versions.append(version)
                row.request.seconds += seconds
            finished = self.rules.apply(rows)
        self.steps += 1
        self.generated_tokens += len(rows)
        self.prefixes.keep(finished)
        for row in finished:
            self.slots.free(row)
        return finished
