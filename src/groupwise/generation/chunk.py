"""One chunk of rows in the engine: what prefill hands a decode loop, and what the loop records per row.

Both decode loops of the engine (the compacting one and the static-slot one) start from a :class:`Prefill`
and feed every step through :meth:`ChunkRecord.add`, so the finishing rules — EOS, a stop string,
``max_new_tokens`` — live in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from groupwise.types import Completion, FinishReason

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Prefill:
    """A chunk after prefill: per-row last logits, the distinct prompts' cache and how rows map to them."""

    logits: Tensor  # [R, V]
    cache: Any  # Any: a transformers Cache (new_kv_cache), whose layers it types as a union without keys/values;
    # one row per distinct prompt, prompt columns filled
    row_to_prompt: Tensor  # [R]
    padding: Tensor  # [U, W] bool: True at real (not left-pad) prompt tokens
    positions: Tensor  # [R] position id of the first generated token
    rng_keys: Tensor  # [R] counter-RNG key per row

    @property
    def width(self) -> int:
        return self.padding.shape[1]


@dataclass
class RowResult:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    ended_on_eos: bool


class ChunkRecord:
    """Per-row outputs of one chunk ``[rows, max_new]``, indexed by the row's place in the chunk.

    Rows that finished may still be fed to the model (until the batch drops them); their later draws are
    written past their length and never read.
    """

    def __init__(
        self, num_rows: int, max_new: int, eos: Tensor, tokenizer: PreTrainedTokenizerBase, stop: Sequence[str],
        device: torch.device,
    ) -> None:
        self.eos = eos
        self.tokens = torch.zeros((num_rows, max_new), dtype=torch.long, device=device)
        self.logprobs = torch.zeros((num_rows, max_new), dtype=torch.float32, device=device)
        self.lengths = torch.full((num_rows,), max_new, dtype=torch.long, device=device)
        self.stopped = torch.zeros(num_rows, dtype=torch.bool, device=device)
        self._stop_watch = StopWatch(tokenizer, stop, num_rows) if stop else None

    def add(self, step: int, rows: Tensor, live: Tensor, tokens: Tensor, logprobs: Tensor) -> Tensor:
        """Record token ``step`` of chunk rows ``rows``; return which of them (live ones only) finished with it."""
        self.tokens[rows, step] = tokens
        self.logprobs[rows, step] = logprobs
        finished = live & torch.isin(tokens, self.eos)
        if self._stop_watch is not None:
            finished |= self._stop_watch.update(rows, live, tokens)
        self.lengths[rows] = torch.where(finished, step + 1, self.lengths[rows])
        self.stopped[rows] = self.stopped[rows] | finished
        return finished

    def results(self) -> list[RowResult]:
        """Per-row tokens/logprobs through the finishing step and the finish reason."""
        last = self.tokens.gather(1, (self.lengths - 1).unsqueeze(1)).squeeze(1)
        ended_on_eos = self.stopped & torch.isin(last, self.eos)
        columns = (self.tokens, self.logprobs, self.lengths, ended_on_eos, self.stopped)
        return [
            RowResult(row_tokens[:length], row_logprobs[:length], "stop" if row_stopped else "length", row_eos)
            for row_tokens, row_logprobs, length, row_eos, row_stopped in zip(
                *(column.tolist() for column in columns), strict=True
            )
        ]


class StopWatch:
    """Host-side text check for stop strings; only built when stop strings are configured.

    Each step appends the new token of every live row and decodes that row's generated tokens
    (special tokens kept, as in ``Completion.text``). The first step whose text contains a stop
    string ends the row, so tokens and text include the stop string (and whatever else the last
    token spells after it: text always equals the decode of the kept tokens).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: Sequence[str], num_rows: int) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.generated: list[list[int]] = [[] for _ in range(num_rows)]

    def update(self, rows: Tensor, live: Tensor, tokens: Tensor) -> Tensor:
        """Which of ``rows`` (chunk row indices, live ones only) just completed a stop string."""
        live_index = live.nonzero().squeeze(1)
        live_rows = rows[live_index].tolist()
        for row, token in zip(live_rows, tokens[live_index].tolist(), strict=True):
            self.generated[row].append(token)
        hits = torch.zeros_like(live)
        found = self.contains_stop([self.generated[row] for row in live_rows])
        hits[live_index] = torch.tensor(found, device=hits.device)
        return hits

    def contains_stop(self, generated: Sequence[Sequence[int]]) -> list[bool]:
        """Whether the text of each token list (special tokens kept) contains a stop string."""
        texts = self.tokenizer.batch_decode([list(tokens) for tokens in generated], skip_special_tokens=False)
        return [any(s in text for s in self.stop) for text in texts]


def completions_of(
    results: Sequence[RowResult], versions: Sequence[Sequence[int]], tokenizer: PreTrainedTokenizerBase
) -> list[Completion]:
    """Package finished rows: ``versions[i]`` holds the weight version of each token of ``results[i]``; the text
    drops a final EOS but keeps every other special token, and ``weight_version`` is the last token's version."""
    text_ids = [r.token_ids[:-1] if r.ended_on_eos else r.token_ids for r in results]
    texts = tokenizer.batch_decode(text_ids, skip_special_tokens=False)
    return [
        Completion(tuple(r.token_ids), tuple(r.logprobs), text, r.finish_reason, row_versions[-1], tuple(row_versions))
        for r, text, row_versions in zip(results, texts, versions, strict=True)
    ]
