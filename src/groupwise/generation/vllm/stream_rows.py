"""The bookkeeping of the vLLM stream, host-side: its requests, what each row generated so far, and its cost.

The stream (:mod:`groupwise.generation.vllm.stream`) appends every token vLLM hands back to its row here, with the
logprob it was sampled with and the weight version stamped at arrival; when the row finishes, vLLM's own
per-token version spans replace the stamps (:func:`~groupwise.generation.vllm.rows.versions_from_spans`). Time is
charged as the built-in stream charges it: the engine's busy time between two events split evenly among the rows
live in between (:class:`BusyClock`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from groupwise.generation.base import StreamDone, StreamDropped
from groupwise.generation.vllm.rows import RowOutput, VllmRow, finish_reason_of
from groupwise.types import FinishReason, GenerationRequest, RowPrefix, SamplingParams

if TYPE_CHECKING:
    import asyncio


@dataclass(eq=False)
class RowState:
    """One sample being generated: its row, what vLLM sent so far, and how it ended (vLLM's finish reason)."""

    row: VllmRow
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    def output(self) -> RowOutput:
        return RowOutput(self.token_ids, self.logprobs, self.versions, self.finish_reason or "abort")

    def progress(self) -> RowPrefix | None:
        """Prefix and new tokens so far as a continuation (None: nothing yet); finished rows carry their reason."""
        prefix = self.row.prefix
        tokens = (*(prefix.token_ids if prefix else ()), *self.token_ids)
        if not tokens:
            return None
        finish: FinishReason | None = None
        if self.finish_reason in ("stop", "length"):
            finish = finish_reason_of(self.finish_reason)
        return RowPrefix(
            tokens, (*(prefix.logprobs if prefix else ()), *self.logprobs),
            (*(prefix.token_versions if prefix else ()), *self.versions), finish,
        )  # fmt: skip


@dataclass(eq=False)
class StreamEntry:
    """A submitted request: its rows (finished prefixes apart), whom to tell, and its cost so far."""

    handle: int
    request: GenerationRequest
    sampling: SamplingParams
    on_done: StreamDone
    rows: list[RowState]
    finished: list[VllmRow]  # samples whose prefix had already finished: nothing is generated for them
    seconds: float = 0.0
    cancelled: bool = False
    on_dropped: StreamDropped | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)  # the rows' asyncio tasks

    @property
    def tokens(self) -> int:
        """Tokens its rows hold, prefixes included."""
        return sum(len(row.prefix.token_ids) for row in self.finished if row.prefix) + sum(
            len(state.row.prefix.token_ids if state.row.prefix else ()) + len(state.token_ids) for state in self.rows
        )

    def progress(self) -> tuple[RowPrefix | None, ...]:
        by_sample: dict[int, RowPrefix | None] = {row.sample: row.prefix for row in self.finished}
        by_sample.update({state.row.sample: state.progress() for state in self.rows})
        return tuple(by_sample.get(sample) for sample in range(self.request.num_samples))


class BusyClock:
    """The engine's busy seconds (some row live, generation not paused), charged evenly to the live rows' requests.

    Call :meth:`tick` at every event (a row starts, sends tokens or ends; a pause starts or ends) before the set of
    live rows or the paused flag changes.
    """

    def __init__(self) -> None:
        self.busy_seconds = 0.0
        self.live: dict[RowState, StreamEntry] = {}
        self.paused = False
        self._last = time.perf_counter()

    def tick(self) -> None:
        now = time.perf_counter()
        elapsed, self._last = now - self._last, now
        if self.paused or not self.live:
            return
        self.busy_seconds += elapsed
        share = elapsed / len(self.live)
        for entry in self.live.values():
            entry.seconds += share
