"""The built-in generator: a batched KV-cache sampling loop over a Hugging Face causal LM.

How a call runs:

1. Every request is expanded into ``num_samples`` rows. Rows are sorted by prompt length (less
   padding) and cut into chunks of at most ``max_batch_rows``.
2. Per chunk, each distinct prompt is prefilled once (left-padded, position ids from the mask:
   :mod:`groupwise.generation.model_forward`) and its KV cache rows are repeated for its samples. The cache is
   preallocated (:mod:`groupwise.generation.kv_cache`), so decode steps write in place instead of concatenating.
3. One decode loop for the chunk: draw a token per row (:mod:`groupwise.generation.sampling`),
   record its logprob, retire rows that hit EOS, a stop string or ``max_new_tokens``
   (:mod:`groupwise.generation.chunk`). Retired rows are dropped from the batch and the cache
   once an eighth of the batch has retired, so finished rows stop costing compute without a cache copy
   every step. For sdpa/eager attention the masks are 4D masks we build (once per chunk, sliced per
   step), so transformers' mask construction is skipped.
4. Decode steps of Llama-family models skip transformers' module tree: :mod:`groupwise.generation.llama_decode`
   does the same maths from packed copies of the weights (refreshed whenever the weights change), after a probe
   at the first ``generate`` shows its logits match the model's own forward. Other models, or
   ``fast_decode=False``, call the model's ``forward``; ``engine.decode_path`` says which path is in use and why.
5. On CUDA the fast step runs from static slots (:mod:`groupwise.generation.slots`) as one CUDA graph per row
   bucket (:mod:`groupwise.generation.step_graphs`); rows leave the batch by moving down to a smaller bucket.
   Prefill stays eager. ``cuda_graphs``: ``auto`` (graphs on CUDA), ``on`` (an error where they cannot run),
   ``off``, or ``eager`` (the slot path with every replay a plain call, on any device: the check mode).
   Where no graph runs, ``compile_step`` runs the slot path's steps compiled by torch's compiler instead
   (:mod:`groupwise.generation.compiled_step`).

With ``continuous_batching`` (or for requests that continue earlier rows) a call runs as one
:class:`~groupwise.generation.stream.GenerationStream` on the static slots instead of chunks: rows join the decode
loop as others finish, so a call with more rows than ``max_batch_rows`` never waits for a chunk's slowest row;
:meth:`Engine.open_stream` gives the runtimes a stream that requests join while it runs.

Determinism: a row's draws depend only on (request seed, sample index, position) — see
:mod:`groupwise.generation.sampling` for the counter RNG and its documented limit.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from groupwise.generation.base import StreamSupport
from groupwise.generation.chunk import ChunkRecord, Prefill, RowResult
from groupwise.generation.compacting import decode_compacting
from groupwise.generation.kv_cache import new_kv_cache
from groupwise.generation.llama_decode import LlamaDecoder, fast_decoder_for
from groupwise.generation.model_forward import ModelForward, PromptRow
from groupwise.generation.projections import PROJECTION_KINDS
from groupwise.generation.request_limits import generate_by_limit, has_own_limits
from groupwise.generation.sampling import check_sampling_params
from groupwise.generation.slot_loop import SlotLoop
from groupwise.generation.slots import capacity_for, row_bucket
from groupwise.generation.step_graphs import StepGraphs
from groupwise.generation.stream import GenerationStream
from groupwise.generation.stream_slots import StreamSlots
from groupwise.types import Completion, GenerationRequest, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

CUDA_GRAPH_MODES = ("auto", "on", "off", "eager")


class Engine:
    """The built-in backend: a :class:`~groupwise.generation.base.StreamingGenerator` over an in-process Hugging Face
    causal LM.

    ``eos_token_ids`` end a completion (see :func:`groupwise.model.eos_token_ids`);
    ``max_batch_rows`` bounds how many rows share one decode loop (memory: the KV cache holds
    ``rows × (prompt + max_new_tokens)`` positions per layer). ``cuda_graphs`` is one of
    :data:`CUDA_GRAPH_MODES` (module docstring); with graphs the engine keeps its static slots (KV cache
    included) between calls, so a call of the same shape allocates nothing. ``continuous_batching`` runs every
    call as a stream on the static slots (module docstring), where the fast step can take the model.
    ``compile_step``: where no CUDA graph runs, the fast step runs on the static slots compiled by torch's compiler
    (:mod:`groupwise.generation.compiled_step`; ``generation.compile`` decides it for a run). ``projections``: the
    fast step's projection kind (:func:`~groupwise.generation.projections.projection_kind`; ``"auto"`` chooses).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        eos_token_ids: Sequence[int],
        version: int = 0,
        max_batch_rows: int = 256,
        fast_decode: bool = True,
        cuda_graphs: str = "auto",
        continuous_batching: bool = False,
        compile_step: bool = False,
        projections: str = "auto",
    ) -> None:
        if not eos_token_ids:
            raise ValueError("eos_token_ids is empty; pass groupwise.model.eos_token_ids(tokenizer, model)")
        if max_batch_rows < 1:
            raise ValueError(f"max_batch_rows={max_batch_rows} must be >= 1")
        _check_cuda_graphs(cuda_graphs, fast_decode, next(model.parameters()).device)
        if projections not in PROJECTION_KINDS:
            raise ValueError(f"projections={projections!r} must be one of {', '.join(PROJECTION_KINDS)}")
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(int(token_id) for token_id in eos_token_ids)
        self.max_batch_rows = max_batch_rows
        self.cuda_graphs = cuda_graphs
        self.continuous_batching = continuous_batching
        self.compile_step = compile_step
        self.projections = projections
        self._version = int(version)
        self._model_calls = ModelForward(model)
        # Decided at the first generate (the probe runs the model): the fast step or why not.
        self._decode_path_pending = fast_decode
        self._decoder: LlamaDecoder | None = None
        self._module_reason = "off"  # why the model's forward decodes (when it does)
        self._slot_loop: SlotLoop | None = None  # set when the fast step runs from static slots
        self._no_slots_reason = ""
        self._stream_slots: StreamSlots | None = None  # the slots of this engine's own streamed calls

    @property
    def version(self) -> int:
        return self._version

    @property
    def decode_path(self) -> str:
        """Which decode step runs and why: the fast step (with or without CUDA graphs) or the model's forward."""
        if self._decode_path_pending:
            return "undecided (set at the first generate)"
        if self._decoder is None:
            return f"transformers forward ({self._module_reason})"
        if self._slot_loop is None:
            return f"fast Llama decode step ({self._no_slots_reason})"
        graphs = self._slot_loop.graphs
        buckets = f"row buckets 1..{row_bucket(self.max_batch_rows)}, each captured on first use"
        if graphs.use_graphs:
            return f"fast Llama decode step under cuda graphs ({buckets})"
        if graphs.compile_steps:
            return f"fast Llama decode step in static slots, compiled by torch.compile ({buckets})"
        why = graphs.fallback_reason or "cuda_graphs='eager'"
        return f"fast Llama decode step in static slots, replayed eagerly ({buckets}; {why})"

    @property
    def projection_kind(self) -> str | None:
        """The fast step's projection kind, ``"dense"`` or ``"onednn"``; None before the first generate or when the
        model's forward decodes."""
        return None if self._decoder is None else self._decoder.projection_kind

    @property
    def decode_graphs(self) -> StepGraphs | None:
        """The captured decode steps (keys: row bucket and sampling settings), when the slot path runs."""
        return None if self._slot_loop is None else self._slot_loop.graphs

    def load_weights(self, state: Mapping[str, Tensor], version: int) -> None:
        """Copy a full state dict into the model (no grad, same names and shapes) and set the version.

        The copy is in place, so the fast step refreshes its packed weights in place too and captured CUDA
        graphs stay valid (nothing is captured again).
        """
        if version < self._version:
            raise ValueError(
                f"load_weights(version={version}) would move the engine back from version {self._version}; "
                "weight versions only increase — pass the learner's current version"
            )
        with torch.no_grad():
            try:
                self.model.load_state_dict(dict(state), strict=True)
            except RuntimeError as error:
                raise ValueError(f"load_weights: the state dict does not match the engine's model: {error}") from error
        self._version = int(version)

    def stream_support(self) -> StreamSupport:
        """Whether this engine can decode a stream (continuous batching, continuations): a stream needs the fast
        decode step, which the first call (or this one) probes."""
        with _inference(self.model):
            decoder = self._fast_decoder()
        if decoder is None:
            return StreamSupport(
                False, f"the model decodes with its own forward ({self._module_reason}), not the fast step on slots"
            )
        return StreamSupport(True)

    def open_stream(
        self, sampling: SamplingParams, *, max_rows: int | None = None, partial: str = "off", kv: str = "recompute",
        reuse_prefixes: bool = True, prefix_tokens: int | None = None,
    ) -> GenerationStream:  # fmt: skip
        """A stream with slots of its own, for a runtime to feed while it runs (check :meth:`stream_support`
        first); ``partial``/``kv`` say what a weight load mid-stream does; with ``reuse_prefixes``,
        ``prefix_tokens`` is how many token positions of finished rows' keys/values it keeps for reuse (None:
        twice as many as its slots hold; reuse off keeps none) (:mod:`groupwise.generation.stream`)."""
        if not reuse_prefixes:
            prefix_tokens = 0
        support = self.stream_support()
        if not support.available:
            raise ValueError(f"this engine cannot run a generation stream: {support.reason}")
        return GenerationStream(
            self, self._decoder, sampling, max_rows=max_rows or self.max_batch_rows, partial=partial, kv=kv,
            slots=StreamSlots(self._stream_graphs(), self.compile_step), prefix_tokens=prefix_tokens,
        )  # fmt: skip

    def _stream_graphs(self) -> bool:
        """Whether a stream's steps are CUDA graphs: on a CUDA model unless ``cuda_graphs`` is off or eager."""
        device = next(self.model.parameters()).device
        return device.type == "cuda" and self.cuda_graphs in ("auto", "on")

    @property
    def reuses_prefixes(self) -> bool:
        """Whether :meth:`prefill_rows` can start from reused keys/values: the model's attention takes a 4D mask."""
        return self._model_calls.takes_4d_mask()

    def prefill_rows(
        self, rows: Sequence[tuple[int, int, int, tuple[int, ...]]], reused: Mapping[int, Tensor] | None = None
    ) -> Prefill:
        """Prefill ``(sequence id, sample index, seed, sequence)`` rows, each distinct sequence once, into a cache of
        exactly the sequences' width (a stream copies it into its slots). ``reused`` (by sequence id): the
        keys/values ``[layers, 2, KV, P, D]`` of a sequence's first P tokens, computed earlier under these
        weights; only the rest of that sequence runs (see :attr:`reuses_prefixes`)."""
        specs = [PromptRow(sequence_id, sample, seed, sequence) for sequence_id, sample, seed, sequence in rows]
        device = next(self.model.parameters()).device
        return self._model_calls.prefill(specs, device, 0, reused)

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        """``request.num_samples`` completions per request, in request order (see ``Generator``)."""
        check_sampling_params(sampling)
        if self.continuous_batching or any(request.prefixes for request in requests):
            support = self.stream_support()
            if support.available:
                return self._generate_streamed(requests, sampling)
            if any(request.prefixes for request in requests):
                raise ValueError(f"a request continues earlier rows, which needs a generation stream: {support.reason}")
        if has_own_limits(requests):
            return generate_by_limit(requests, sampling, self._generate_batched)
        return self._generate_batched(requests, sampling)

    def _generate_batched(
        self, requests: Sequence[GenerationRequest], sampling: SamplingParams
    ) -> list[list[Completion]]:
        """Every request's rows in batches of at most ``max_batch_rows``, longest prompts first."""
        rows = _expand_rows(requests)
        results: list[list[Completion | None]] = [[None] * request.num_samples for request in requests]
        rows.sort(key=lambda row: len(row.prompt), reverse=True)
        with _inference(self.model):
            for start in range(0, len(rows), self.max_batch_rows):
                chunk = rows[start : start + self.max_batch_rows]
                for row, completion in zip(chunk, self._completions(chunk, sampling), strict=True):
                    results[row.request_index][row.sample_index] = completion
        return [[completion for completion in per_request if completion is not None] for per_request in results]

    def _generate_streamed(
        self, requests: Sequence[GenerationRequest], sampling: SamplingParams
    ) -> list[list[Completion]]:
        """Every request through one stream on this engine's own slots, in this thread, until all are done."""
        if self._stream_slots is None:
            self._stream_slots = StreamSlots(self._stream_graphs(), self.compile_step)
        stream = GenerationStream(  # one call's stream: nothing outlives it to reuse a prefix
            self, self._decoder, sampling, max_rows=self.max_batch_rows, slots=self._stream_slots, prefix_tokens=0
        )
        results: dict[int, Any] = {}  # completions, or the error raised below
        for index, request in enumerate(requests):
            stream.submit(request, partial(results.__setitem__, index))
        with _inference(self.model):
            stream.run_until_idle()
        for outcome in results.values():
            if isinstance(outcome, BaseException):
                raise outcome
        return [results[index] for index in range(len(requests))]

    def _completions(self, chunk: Sequence[PromptRow], sampling: SamplingParams) -> list[Completion]:
        """Sample a chunk and package it; text drops a final EOS but keeps every other special token."""
        results = self._generate_chunk(chunk, sampling)
        text_ids = [r.token_ids[:-1] if r.ended_on_eos else r.token_ids for r in results]
        texts = self.tokenizer.batch_decode(text_ids, skip_special_tokens=False)
        return [
            Completion(tuple(r.token_ids), tuple(r.logprobs), text, r.finish_reason, self._version)
            for r, text in zip(results, texts, strict=True)
        ]

    def _fast_decoder(self) -> LlamaDecoder | None:
        """The fast decode step for this model, probed once against the module path (see llama_decode)."""
        if self._decode_path_pending:
            calls = self._model_calls
            self._decoder, why = fast_decoder_for(
                self.model, calls.forward, new_kv_cache, calls.as_model_mask, self.projections
            )
            self._decode_path_pending = False
            device = next(self.model.parameters()).device
            if self._decoder is None:
                graphs_wanted = self.cuda_graphs != "off" and device.type == "cuda"
                self._module_reason = why + ("; cuda graphs capture only the fast step" if graphs_wanted else "")
            elif self.cuda_graphs == "off":
                self._no_slots_reason = "cuda graphs off"
            elif self.cuda_graphs == "auto" and device.type != "cuda" and self.compile_step:
                self._slot_loop = SlotLoop(use_graphs=False, compile_steps=True)
            elif self.cuda_graphs == "auto" and device.type != "cuda":
                self._no_slots_reason = f"no cuda graphs: the model is on {device.type}"
            else:
                self._slot_loop = SlotLoop(use_graphs=self.cuda_graphs != "eager")
        if self._decoder is None and self.cuda_graphs == "on":
            raise RuntimeError(
                f"cuda_graphs='on', but the fast decode step cannot take this model ({self._module_reason}); "
                "graphs capture only that step: use cuda_graphs 'auto' to decode with the model's forward"
            )
        return self._decoder

    def _generate_chunk(self, rows: Sequence[PromptRow], sampling: SamplingParams) -> list[RowResult]:
        device = next(self.model.parameters()).device
        max_new = sampling.max_new_tokens
        prompt_width = max(len(row.prompt) for row in rows)
        decoder, slot_loop = self._fast_decoder(), self._slot_loop
        slotted = decoder is not None and slot_loop is not None
        if decoder is not None:
            decoder.prepare(capacity_for(prompt_width + max_new) if slotted else prompt_width + max_new)
        # The slot path copies the prompts' cache into its own buffers; the compacting path decodes in this one.
        prefill = self._model_calls.prefill(rows, device, 0 if slotted else max_new)
        eos = torch.tensor(self.eos_token_ids, dtype=torch.long, device=device)
        record = ChunkRecord(len(rows), max_new, eos, self.tokenizer, sampling.stop, device)
        if decoder is not None and slot_loop is not None:
            slot_loop.decode(decoder, prefill, sampling, record)
        else:
            calls = self._model_calls
            decode_compacting(decoder, prefill, sampling, record, calls.forward, calls.key_mask)
        return record.results()


def _check_cuda_graphs(cuda_graphs: str, fast_decode: bool, device: torch.device) -> None:
    if cuda_graphs not in CUDA_GRAPH_MODES:
        raise ValueError(f"cuda_graphs={cuda_graphs!r} must be one of {', '.join(CUDA_GRAPH_MODES)}")
    if cuda_graphs == "on" and device.type != "cuda":
        raise ValueError(
            f"cuda_graphs='on' needs a model on a CUDA device, not {device}; use 'auto' (graphs when "
            "the model is on CUDA) or 'eager' (the same slot code without graphs)"
        )
    if cuda_graphs in ("on", "eager") and not fast_decode:
        raise ValueError(
            f"cuda_graphs={cuda_graphs!r} runs the fast decode step, which fast_decode=False turns off; "
            "use cuda_graphs 'auto' or 'off' with fast_decode=False"
        )


def _expand_rows(requests: Sequence[GenerationRequest]) -> list[PromptRow]:
    rows: list[PromptRow] = []
    for index, request in enumerate(requests):
        if len(request.prompt_token_ids) == 0:
            raise ValueError(f"request {index} has an empty prompt; encode at least one token (e.g. BOS)")
        if request.num_samples < 0:
            raise ValueError(f"request {index} asks for num_samples={request.num_samples}; it must be >= 0")
        prompt = tuple(int(token_id) for token_id in request.prompt_token_ids)
        rows.extend(PromptRow(index, sample, request.seed, prompt) for sample in range(request.num_samples))
    return rows


@contextmanager
def _inference(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode and no autograd for the duration, restoring the caller's train/eval flag."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)
