"""The bookkeeping of a generation stream: its requests and their rows, host-side, token by token.

A stream (:mod:`groupwise.generation.stream`) decodes rows that joined at different times, so what a row has
generated so far lives here, on the host, rather than in a per-call record: the tokens, the logprob recorded
when each was sampled and the weight version that produced it. The finishing rules are those of every engine
call (EOS, a stop string in the text, ``max_new_tokens``), and a finished request is packaged by
:func:`~groupwise.generation.chunk.completions_of`, the same packaging as a call's. The stream's requests by handle,
and who waits for a cancelled one's cost, are a :class:`RequestTable`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from groupwise.generation.base import StreamDone, StreamDropped
from groupwise.generation.chunk import RowResult, StopWatch, completions_of
from groupwise.generation.request_limits import request_limit
from groupwise.types import Completion, FinishReason, GenerationRequest, RowPrefix, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(eq=False)
class StreamRow:
    """One sample of a request: what it generated so far, and where it decodes (``slot``; None while waiting)."""

    request: StreamRequest
    sample: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    slot: int | None = None
    column: int = 0  # the cache column its next fed token writes (a host mirror, for compaction)
    kv_stamp: Hashable | None = None  # the weights its slot's keys/values were computed under (a prefill's)

    @property
    def sequence(self) -> tuple[int, ...]:
        """What a prefill of this row runs: the prompt and every generated token but the last (which is fed next)."""
        return self.request.prompt + tuple(self.token_ids[:-1])

    def prefix(self) -> RowPrefix | None:
        if not self.token_ids:
            return None
        return RowPrefix(tuple(self.token_ids), tuple(self.logprobs), tuple(self.versions), self.finish)


@dataclass(eq=False)
class StreamRequest:
    """A submitted request: its rows, how many are unfinished, and whom to tell when they are all done."""

    handle: int
    request: GenerationRequest
    on_done: StreamDone
    max_new: int  # its rows' token limit: the stream's, or the request's own lower one
    rows: list[StreamRow] = field(default_factory=list)
    unfinished: int = 0
    seconds: float = 0.0  # the stream's time attributed to its rows (each step's time split among the live rows)

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.request.prompt_token_ids

    @property
    def tokens(self) -> int:
        """Tokens its rows hold (a continued row's prefix included)."""
        return sum(len(row.token_ids) for row in self.rows)

    def progress(self) -> tuple[RowPrefix | None, ...]:
        if not self.rows:  # not yet taken in: any prefixes it came with are all it has
            return tuple(self.request.prefixes) or (None,) * self.request.num_samples
        return tuple(row.prefix() for row in self.rows)


def new_request(handle: int, request: GenerationRequest, on_done: StreamDone, max_new: int) -> StreamRequest:
    """The request with one row per sample, continued rows holding their prefix; raises on a malformed request."""
    if len(request.prompt_token_ids) == 0:
        raise ValueError("a request has an empty prompt; encode at least one token (e.g. BOS)")
    if request.num_samples < 0:
        raise ValueError(f"a request asks for num_samples={request.num_samples}; it must be >= 0")
    prefixes = request.prefixes or (None,) * request.num_samples
    if len(prefixes) != request.num_samples:
        raise ValueError(f"a request has {len(prefixes)} prefixes for {request.num_samples} samples")
    max_new = request_limit(request, max_new)
    entry = StreamRequest(handle, request, on_done, max_new)
    for sample, prefix in enumerate(prefixes):
        row = StreamRow(entry, sample)
        if prefix is not None:
            row.token_ids, row.logprobs, row.versions = (
                list(prefix.token_ids),
                list(prefix.logprobs),
                list(prefix.token_versions),
            )
            row.finish = prefix.finish_reason
            if row.finish is not None and not row.token_ids:
                raise ValueError(f"sample {sample} is marked finished ({row.finish!r}) with no tokens")
            if row.finish is None and len(row.token_ids) >= max_new:
                raise ValueError(
                    f"sample {sample} continues {len(row.token_ids)} unfinished tokens, but max_new_tokens is "
                    f"{max_new}; a continuation must be shorter than the sampling limit it was generated under"
                )
        entry.rows.append(row)
        entry.unfinished += row.finish is None
    return entry


class FinishRules:
    """EOS, stop strings and the token limit, applied on the host to rows that just drew a token."""

    def __init__(
        self, eos_token_ids: Sequence[int], tokenizer: PreTrainedTokenizerBase, sampling: SamplingParams
    ) -> None:
        self.eos = frozenset(eos_token_ids)
        self.tokenizer = tokenizer
        self._stop = StopWatch(tokenizer, sampling.stop, 0) if sampling.stop else None

    def apply(self, rows: Sequence[StreamRow]) -> list[StreamRow]:
        """Mark which of ``rows`` (each with a new last token) finished with it; return those."""
        stopped = [row.token_ids[-1] in self.eos for row in rows]
        if self._stop is not None:
            hits = self._stop.contains_stop([row.token_ids for row in rows])
            stopped = [a or b for a, b in zip(stopped, hits, strict=True)]
        finished = []
        for row, stop in zip(rows, stopped, strict=True):
            if stop or len(row.token_ids) >= row.request.max_new:
                row.finish = "stop" if stop else "length"
                finished.append(row)
        return finished

    def completions(self, request: StreamRequest) -> list[Completion]:
        """The request's finished rows as completions (a row that stopped on EOS: the text drops it)."""
        results = [
            RowResult(row.token_ids, row.logprobs, row.finish or "length",
                      row.finish == "stop" and row.token_ids[-1] in self.eos)
            for row in request.rows
        ]  # fmt: skip
        return completions_of(results, [row.versions for row in request.rows], self.tokenizer)


class RequestTable:
    """A stream's requests by handle: the unfinished ones, the answered ones (kept for progress until forgotten), and
    the cancellers waiting for a running one's cost.

    Not locked itself: the stream calls it under its own lock. Whoever takes a request out of ``running`` takes its
    cancellers (:meth:`take_cancellers`) in the same locked block, so each canceller is called once, never zero
    times (an answer racing a cancel at one token boundary) or twice.
    """

    def __init__(self) -> None:
        self.running: dict[int, StreamRequest] = {}
        self.answered: dict[int, StreamRequest] = {}
        self._cancellers: dict[int, list[StreamDropped]] = {}
        self._next_handle = 0

    def add(self, request: GenerationRequest, on_done: StreamDone, max_new: int) -> StreamRequest:
        """The request under a new handle, running (:func:`new_request`: raises on a malformed request)."""
        handle, self._next_handle = self._next_handle, self._next_handle + 1
        entry = new_request(handle, request, on_done, max_new)
        self.running[handle] = entry
        return entry

    def cost(self, handle: int) -> tuple[int, float]:
        """Tokens a request not yet forgotten holds and the seconds charged to it; nothing for an unknown one."""
        entry = self.running.get(handle) or self.answered.get(handle)
        return (entry.tokens, entry.seconds) if entry is not None else (0, 0.0)

    def wait_for_cost(self, handle: int, on_dropped: StreamDropped | None) -> None:
        """``on_dropped`` is called with the running request's cost once it leaves ``running``."""
        if on_dropped is not None:
            self._cancellers.setdefault(handle, []).append(on_dropped)

    def take_cancellers(self, handles: Iterable[int] | None = None) -> list[tuple[StreamDropped, tuple[int, float]]]:
        """The cancellers waiting on ``handles`` (all: None), taken off, each with its request's cost now."""
        handles = list(self._cancellers) if handles is None else handles
        return [(dropped, self.cost(handle)) for handle in handles for dropped in self._cancellers.pop(handle, [])]

    def progress(self) -> dict[int, tuple[RowPrefix | None, ...]]:
        return {handle: entry.progress() for handle, entry in [*self.running.items(), *self.answered.items()]}


def call_dropped(dropped: list[tuple[StreamDropped, tuple[int, float]]]) -> None:
    """Tell each canceller its request's cost (outside the stream's lock)."""
    for on_dropped, cost in dropped:
        on_dropped(*cost)
