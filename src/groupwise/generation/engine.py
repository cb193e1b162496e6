"""The built-in generator: a batched KV-cache sampling loop over a Hugging Face causal LM.

How a call runs:

1. Every request is expanded into ``num_samples`` rows. Rows are sorted by prompt length (less
   padding) and cut into chunks of at most ``max_batch_rows``.
2. Per chunk, each distinct prompt is prefilled once (left-padded, position ids from the mask) and
   its KV cache rows are repeated for its samples.
3. One decode loop for the chunk: draw a token per row (:mod:`groupwise.generation.sampling`),
   record its logprob, retire rows that hit EOS, a stop string or ``max_new_tokens``, and drop the
   retired rows from the cache (``DynamicCache.batch_select_indices``, present in transformers 4.56
   through 5.x) so finished rows cost nothing.

Determinism: a row's draws depend only on (request seed, sample index, position) — see
:mod:`groupwise.generation.sampling` for the counter RNG and its documented limit.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache

from groupwise.generation.sampling import (
    check_sampling_params,
    counter_uniforms,
    sample_tokens,
    seed_to_int64,
    tempered_logprobs_of,
)
from groupwise.types import Completion, FinishReason, GenerationRequest, SamplingParams

# Attention implementations that take a prepared 4D additive mask as is (flash-attention wants 2D).
_4D_MASK_ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True)
class _Row:
    """One completion to sample: which request and sample it is, and its prompt."""

    request_index: int
    sample_index: int
    seed: int
    prompt: tuple[int, ...]


@dataclass
class _RowResult:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    ended_on_eos: bool


class Engine:
    """A :class:`~groupwise.generation.base.Generator` over an in-process Hugging Face causal LM.

    ``eos_token_ids`` end a completion (see :func:`groupwise.model.eos_token_ids`);
    ``max_batch_rows`` bounds how many rows share one decode loop (memory: the KV cache holds
    ``rows × (prompt + max_new_tokens)`` positions per layer).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        eos_token_ids: Sequence[int],
        version: int = 0,
        max_batch_rows: int = 256,
    ) -> None:
        if not eos_token_ids:
            raise ValueError("eos_token_ids is empty; pass groupwise.model.eos_token_ids(tokenizer, model)")
        if max_batch_rows < 1:
            raise ValueError(f"max_batch_rows={max_batch_rows} must be >= 1")
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(int(token_id) for token_id in eos_token_ids)
        self.max_batch_rows = max_batch_rows
        self._version = int(version)
        # transformers 5.24 renamed the cache kwarg to `cache` (old name deprecated); 5.17 knows only
        # `past_key_values`. We own the cache object and never read it back from the output.
        forward_parameters = inspect.signature(type(model).forward).parameters
        self._cache_kwarg = "cache" if "cache" in forward_parameters else "past_key_values"

    @property
    def version(self) -> int:
        return self._version

    def load_weights(self, state: Mapping[str, Tensor], version: int) -> None:
        """Copy a full state dict into the model (no grad, same names and shapes) and set the version."""
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

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        """``request.num_samples`` completions per request, in request order (see ``Generator``)."""
        check_sampling_params(sampling)
        rows = _expand_rows(requests)
        results: list[list[Completion | None]] = [[None] * request.num_samples for request in requests]
        rows.sort(key=lambda row: len(row.prompt), reverse=True)
        with _inference(self.model):
            for start in range(0, len(rows), self.max_batch_rows):
                chunk = rows[start : start + self.max_batch_rows]
                for row, result in zip(chunk, self._generate_chunk(chunk, sampling), strict=True):
                    results[row.request_index][row.sample_index] = self._completion(result)
        return [[completion for completion in per_request if completion is not None] for per_request in results]

    def _completion(self, result: _RowResult) -> Completion:
        text_ids = result.token_ids[:-1] if result.ended_on_eos else result.token_ids
        return Completion(
            token_ids=tuple(result.token_ids),
            logprobs=tuple(result.logprobs),
            text=self.tokenizer.decode(text_ids, skip_special_tokens=False),
            finish_reason=result.finish_reason,
            weight_version=self._version,
        )

    def _forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, cache: DynamicCache) -> Tensor:
        """Last-position logits ``[B, V]``; the cache is updated in place."""
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kwarg: cache},
        )
        return outputs.logits[:, -1, :]

    def _generate_chunk(self, rows: Sequence[_Row], sampling: SamplingParams) -> list[_RowResult]:
        device = next(self.model.parameters()).device
        max_new = sampling.max_new_tokens
        cache = DynamicCache()
        logits, key_padding, prompt_lengths = self._prefill(rows, cache, device)
        num_rows, prompt_width = key_padding.shape
        use_4d = getattr(self.model.config, "_attn_implementation", "sdpa") in _4D_MASK_ATTENTION
        # Key mask for every position the loop can reach, built once; each step takes a prefix view.
        key_mask = torch.cat([key_padding, key_padding.new_ones((num_rows, max_new))], dim=1)
        if use_4d:
            key_mask = _additive_mask(key_mask, self.model.dtype)
        seeds = torch.tensor([seed_to_int64(row.seed) for row in rows], dtype=torch.long, device=device)
        sample_indices = torch.tensor([row.sample_index for row in rows], dtype=torch.long, device=device)
        positions = prompt_lengths.clone()
        alive = torch.arange(num_rows, device=device)
        eos = torch.tensor(self.eos_token_ids, dtype=torch.long, device=device)
        tokens_out = torch.zeros((num_rows, max_new), dtype=torch.long, device=device)
        logprobs_out = torch.zeros((num_rows, max_new), dtype=torch.float32, device=device)
        lengths = torch.full((num_rows,), max_new, dtype=torch.long, device=device)
        stopped = torch.zeros(num_rows, dtype=torch.bool, device=device)
        stop_watch = _StopWatch(self.tokenizer, sampling.stop, num_rows) if sampling.stop else None
        for step in range(max_new):
            uniforms = counter_uniforms(seeds, sample_indices, step)
            tokens = sample_tokens(logits, uniforms, sampling.temperature, sampling.top_k, sampling.top_p)
            tokens_out[alive, step] = tokens
            logprobs_out[alive, step] = tempered_logprobs_of(logits, tokens, sampling.temperature)
            finished = torch.isin(tokens, eos)
            if stop_watch is not None:
                finished |= stop_watch.update(alive, tokens, device)
            any_finished = bool(finished.any())  # the one host sync per step
            if any_finished:
                done = alive[finished]
                lengths[done] = step + 1
                stopped[done] = True
            if step == max_new - 1:
                break
            if any_finished:
                keep = (~finished).nonzero().squeeze(1)
                if keep.numel() == 0:
                    break
                alive, seeds, sample_indices = alive[keep], seeds[keep], sample_indices[keep]
                positions, key_mask, tokens = positions[keep], key_mask[keep], tokens[keep]
                _select_cache_rows(cache, keep)
            kv_length = prompt_width + step + 1
            step_mask = key_mask[..., :kv_length]
            logits = self._forward(tokens.unsqueeze(1), step_mask, positions.unsqueeze(1), cache)
            positions += 1
        last_is_eos = torch.isin(tokens_out.gather(1, (lengths - 1).unsqueeze(1)).squeeze(1), eos)
        return _collect(tokens_out, logprobs_out, lengths, stopped & last_is_eos, stopped)

    def _prefill(
        self, rows: Sequence[_Row], cache: DynamicCache, device: torch.device
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Run each distinct prompt once; return per-row logits ``[B, V]``, key padding mask ``[B, P]``, prompt lengths.

        The cache ends up with one row per *row* (prompt rows repeated for their samples).
        """
        unique_index: dict[int, int] = {}
        prompts: list[tuple[int, ...]] = []
        for row in rows:
            if row.request_index not in unique_index:
                unique_index[row.request_index] = len(prompts)
                prompts.append(row.prompt)
        width = max(len(prompt) for prompt in prompts)
        input_ids = torch.zeros((len(prompts), width), dtype=torch.long)
        padding = torch.zeros((len(prompts), width), dtype=torch.bool)
        for index, prompt in enumerate(prompts):
            input_ids[index, width - len(prompt) :] = torch.as_tensor(prompt, dtype=torch.long)
            padding[index, width - len(prompt) :] = True
        input_ids, padding = input_ids.to(device), padding.to(device)
        position_ids = (padding.long().cumsum(dim=1) - 1).clamp_(min=0)
        logits = self._forward(input_ids, padding.long(), position_ids, cache)
        row_to_prompt = torch.tensor([unique_index[row.request_index] for row in rows], dtype=torch.long, device=device)
        if len(prompts) != len(rows):
            _select_cache_rows(cache, row_to_prompt)
        prompt_lengths = torch.tensor([len(row.prompt) for row in rows], dtype=torch.long, device=device)
        return logits[row_to_prompt], padding[row_to_prompt], prompt_lengths


class _StopWatch:
    """Host-side text check for stop strings; only built when stop strings are configured.

    Each step appends the new token of every live row and decodes that row's generated tokens
    (special tokens kept, as in ``Completion.text``). The first step whose text contains a stop
    string ends the row, so tokens and text include the stop string (and whatever else the last
    token spells after it: text always equals the decode of the kept tokens).
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str], num_rows: int) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.generated: list[list[int]] = [[] for _ in range(num_rows)]

    def update(self, alive: Tensor, tokens: Tensor, device: torch.device) -> Tensor:
        rows = alive.tolist()
        for row, token in zip(rows, tokens.tolist(), strict=True):
            self.generated[row].append(token)
        texts = self.tokenizer.batch_decode([self.generated[row] for row in rows], skip_special_tokens=False)
        hits = [any(stop in text for stop in self.stop) for text in texts]
        return torch.tensor(hits, dtype=torch.bool, device=device)


def _expand_rows(requests: Sequence[GenerationRequest]) -> list[_Row]:
    rows = []
    for index, request in enumerate(requests):
        if len(request.prompt_token_ids) == 0:
            raise ValueError(f"request {index} has an empty prompt; encode at least one token (e.g. BOS)")
        if request.num_samples < 0:
            raise ValueError(f"request {index} asks for num_samples={request.num_samples}; it must be >= 0")
        prompt = tuple(int(token_id) for token_id in request.prompt_token_ids)
        rows.extend(_Row(index, sample, request.seed, prompt) for sample in range(request.num_samples))
    return rows


def _additive_mask(key_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A ``[B, 1, 1, K]`` additive mask: 0 where a key may be attended, the dtype's minimum where not."""
    additive = torch.zeros(key_mask.shape, dtype=dtype, device=key_mask.device)
    additive.masked_fill_(~key_mask, torch.finfo(dtype).min)
    return additive[:, None, None, :]


def _select_cache_rows(cache: DynamicCache, indices: Tensor) -> None:
    """Keep (or repeat) cache rows ``indices`` in every layer."""
    if hasattr(cache, "batch_select_indices"):
        cache.batch_select_indices(indices)
        return
    for layer in cache.layers:  # pragma: no cover - older layouts without the helper
        layer.keys, layer.values = layer.keys[indices], layer.values[indices]


def _collect(
    tokens: Tensor, logprobs: Tensor, lengths: Tensor, ended_on_eos: Tensor, stopped: Tensor
) -> list[_RowResult]:
    """Per-row results: tokens/logprobs through the finishing step and the finish reason."""
    columns = (tokens, logprobs, lengths, ended_on_eos, stopped)
    rows = zip(*(column.tolist() for column in columns), strict=True)
    return [
        _RowResult(row_tokens[:length], row_logprobs[:length], "stop" if row_stopped else "length", row_eos)
        for row_tokens, row_logprobs, length, row_eos, row_stopped in rows
    ]


@contextmanager
def _inference(model: torch.nn.Module):
    """Eval mode and no autograd for the duration, restoring the caller's train/eval flag."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)
