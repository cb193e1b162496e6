"""Between groupwise requests and vLLM requests: one vLLM request per sample, and its output back as a completion.

Semantics kept from the built-in engine (``Generator`` in :mod:`groupwise.generation.base`):

* **One vLLM request per sample**, seeded from (request seed, sample index, tokens already generated) with
  :func:`groupwise.seeding.derive_seed`, so sample ``i`` does not depend on how many samples were asked for or on
  the batch. vLLM's draws are its own (a per-request generator), not the built-in engine's counter RNG: the same
  seed gives different tokens on the two backends.
* **Recorded logprobs** are ``log_softmax(logits / T)[token]`` under the full (unfiltered) tempered distribution,
  ``T`` the sampling temperature (1 for greedy): vLLM's ``processed_logprobs`` are exactly that without top-k/top-p
  (:func:`recorded_logprobs`); with a filter vLLM renormalises over the kept tokens, so the engine then returns the
  raw logits of the whole vocabulary (``full_vocab``) and the tempered logprob is computed here.
* **Finishing**: EOS (every id of the engine's ``eos_token_ids``, kept as the last token and dropped from the text),
  a stop string (vLLM checks the generated text with special tokens kept; tokens keep the whole last token, and the
  text is always our tokenizer's decode of the tokens), ``max_new_tokens``. vLLM also ends a row at the model's
  ``max_model_len`` (finish reason ``length``), which the built-in engine does not.
* **Continued rows** (a :class:`~groupwise.types.RowPrefix`): prompt + the prefix's tokens are submitted as the
  prompt, with the token budget that is left; the prefix's tokens, logprobs and versions lead the completion.
  Unlike the built-in engine, the random draws after the prefix differ from those of an uninterrupted row, and a
  stop string spanning the prefix and the new text is not seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from groupwise.generation.chunk import RowResult, completions_of
from groupwise.generation.vllm.setup import LogprobSource
from groupwise.model.logprobs import logprob_temperature
from groupwise.seeding import derive_seed
from groupwise.types import Completion, FinishReason, GenerationRequest, RowPrefix, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class VllmRow:
    """One sample to generate: where its completion goes, what is submitted, what it continues."""

    request_index: int
    sample: int
    prompt: tuple[int, ...]  # the request's prompt, then the prefix's tokens
    prefix: RowPrefix | None
    seed: int
    max_tokens: int


@dataclass
class RowOutput:
    """What vLLM generated for a row (after its prefix): tokens, recorded logprobs, versions, how it ended."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str  # vLLM's: "stop", "length" or "abort"


def expand_rows(requests: Sequence[GenerationRequest], max_new_tokens: int) -> tuple[list[VllmRow], list[VllmRow]]:
    """Every sample of ``requests``: (rows to generate, rows whose prefix already finished). Raises on a malformed
    request, naming it."""
    to_generate: list[VllmRow] = []
    finished: list[VllmRow] = []
    for index, request in enumerate(requests):
        if len(request.prompt_token_ids) == 0:
            raise ValueError(f"request {index} has an empty prompt; encode at least one token (e.g. BOS)")
        if request.num_samples < 0:
            raise ValueError(f"request {index} asks for num_samples={request.num_samples}; it must be >= 0")
        prefixes = request.prefixes or (None,) * request.num_samples
        if len(prefixes) != request.num_samples:
            raise ValueError(f"request {index} has {len(prefixes)} prefixes for {request.num_samples} samples")
        prompt = tuple(int(token) for token in request.prompt_token_ids)
        for sample, prefix in enumerate(prefixes):
            done = 0 if prefix is None else len(prefix.token_ids)
            if prefix is not None and prefix.finish_reason is not None and done == 0:
                raise ValueError(f"request {index} sample {sample} is marked finished with no tokens")
            if prefix is not None and prefix.finish_reason is None and done >= max_new_tokens:
                raise ValueError(
                    f"request {index} sample {sample} continues {done} unfinished tokens, but max_new_tokens is "
                    f"{max_new_tokens}; a continuation must be shorter than the sampling limit it was generated under"
                )
            row = VllmRow(
                index, sample, prompt + (prefix.token_ids if prefix is not None else ()), prefix,
                derive_seed("vllm-sample", request.seed, sample, done), max_new_tokens - done,
            )  # fmt: skip
            (finished if prefix is not None and prefix.finish_reason is not None else to_generate).append(row)
    return to_generate, finished


# Any: the vllm module, its RequestOutputKind and the vllm.SamplingParams made (vllm is optional, imported lazily).
def sampling_params_for(
    vllm: Any, row: VllmRow, sampling: SamplingParams, eos_token_ids: Sequence[int], source: LogprobSource,
    output_kind: Any = None,
) -> Any:  # fmt: skip
    """The ``vllm.SamplingParams`` of one row (``output_kind``: vLLM's ``RequestOutputKind``, None for final only)."""
    kwargs: dict[str, Any] = {}
    if output_kind is not None:
        kwargs["output_kind"] = output_kind
    return vllm.SamplingParams(
        n=1,
        max_tokens=row.max_tokens,
        temperature=sampling.temperature,
        top_k=sampling.top_k if sampling.top_k > 0 else 0,
        top_p=sampling.top_p,
        seed=row.seed,
        logprobs=0 if source == "processed" else -1,
        stop=list(sampling.stop) or None,
        stop_token_ids=list(eos_token_ids),
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        detokenize=bool(sampling.stop),  # our tokenizer writes the text; vLLM's only checks stop strings
        **kwargs,
    )


def check_source(source: LogprobSource, sampling: SamplingParams) -> None:
    """Refuse filtered sampling on an engine whose logprobs are vLLM's processed (renormalised) ones."""
    if source == "processed" and sampling.temperature > 0 and (sampling.top_k > 0 or sampling.top_p < 1.0):
        raise ValueError(
            f"top_k={sampling.top_k}, top_p={sampling.top_p}: vLLM's processed logprobs are renormalised over the "
            "tokens top-k/top-p keep, not the unfiltered tempered logprobs groupwise records; build the vLLM engine "
            "with logprobs='full_vocab' (VllmSettings) for filtered sampling"
        )


def recorded_logprobs(
    token_ids: Sequence[int], steps: Sequence[Any] | None, source: LogprobSource, temperature: float
) -> list[float]:  # Any: vLLM's per-step logprob dicts
    """The recorded logprob of each sampled token from vLLM's per-step logprob dicts (token id -> ``Logprob``).

    ``processed``: vLLM's value, already ``log_softmax(logits / T)[token]`` (greedy: T = 1). ``full_vocab``: each
    dict holds the raw logit of every token; ``scaled = logits / T``, ``scaled[token] - logsumexp(scaled)`` in float32
    as the built-in engine computes it (:func:`groupwise.generation.sampling.tempered_logprobs_of`).
    """
    if steps is None or len(steps) != len(token_ids):
        raise RuntimeError(
            f"vLLM returned {0 if steps is None else len(steps)} logprob entries for {len(token_ids)} tokens; "
            "each sampled token needs the logprob it was sampled with"
        )
    if source == "processed":
        return [float(step[token].logprob) for step, token in zip(steps, token_ids, strict=True)]
    t = logprob_temperature(temperature)
    values = []
    for step, token in zip(steps, token_ids, strict=True):
        scaled = torch.tensor([entry.logprob for entry in step.values()], dtype=torch.float32) / t
        values.append(float(step[token].logprob / t - torch.logsumexp(scaled, dim=0)))
    return values


def package(
    rows: Sequence[VllmRow], outputs: Sequence[RowOutput], eos_token_ids: Sequence[int],
    tokenizer: PreTrainedTokenizerBase,
) -> list[Completion]:
    """Completions of rows (prefix first, then what vLLM generated), in the built-in engine's packaging."""
    if not rows:
        return []  # (batch_decode of no sequences is not an empty list)
    eos = frozenset(eos_token_ids)
    results, versions = [], []
    for row, out in zip(rows, outputs, strict=True):
        prefix = row.prefix
        tokens = [*(prefix.token_ids if prefix else ()), *out.token_ids]
        logprobs = [*(prefix.logprobs if prefix else ()), *out.logprobs]
        finish = finish_reason_of(out.finish_reason)
        ended_on_eos = finish == "stop" and bool(tokens) and tokens[-1] in eos
        results.append(RowResult(tokens, logprobs, finish, ended_on_eos))
        versions.append([*(prefix.token_versions if prefix else ()), *out.versions])
    return completions_of(results, versions, tokenizer)


def package_finished(
    rows: Sequence[VllmRow], eos_token_ids: Sequence[int], tokenizer: PreTrainedTokenizerBase
) -> list[Completion]:
    """Completions of rows whose prefix had already finished (nothing generated for them)."""
    if not rows:
        return []
    eos = frozenset(eos_token_ids)
    results, versions = [], []
    for row in rows:
        assert row.prefix is not None and row.prefix.finish_reason is not None
        tokens = list(row.prefix.token_ids)
        finish = row.prefix.finish_reason
        results.append(RowResult(tokens, list(row.prefix.logprobs), finish, finish == "stop" and tokens[-1] in eos))
        versions.append(list(row.prefix.token_versions))
    return completions_of(results, versions, tokenizer)


def finish_reason_of(vllm_reason: str | None) -> FinishReason:
    """vLLM's finish reason as groupwise's: ``stop`` (EOS, a stop token or string) or ``length``."""
    if vllm_reason == "stop":
        return "stop"
    if vllm_reason == "length":
        return "length"
    raise RuntimeError(f"vLLM ended a row with finish reason {vllm_reason!r}; only 'stop' and 'length' complete it")


def versions_from_spans(
    spans: Sequence[Any] | None, num_tokens: int, fallback: Sequence[int]
) -> list[int]:  # Any: vLLM's weight-version spans
    """Per-token weight versions from vLLM's ``CompletionOutput.weight_versions`` (spans ``[start, end)`` labelled
    with the version string this backend set); ``fallback`` (the versions stamped as the tokens arrived) when vLLM
    reported none."""
    if not spans:
        return list(fallback)
    versions = [0] * num_tokens
    covered = 0
    for span in spans:
        versions[span.start : span.end] = [int(span.version)] * (span.end - span.start)
        covered += span.end - span.start
    if covered != num_tokens:
        raise RuntimeError(f"vLLM's weight-version spans cover {covered} of {num_tokens} tokens")
    return versions


def assemble(
    requests: Sequence[GenerationRequest], rows: Sequence[VllmRow], completions: Sequence[Completion]
) -> list[list[Completion]]:
    """One list per request, ``num_samples`` completions each in sample order."""
    results: list[list[Completion | None]] = [[None] * request.num_samples for request in requests]
    for row, completion in zip(rows, completions, strict=True):
        results[row.request_index][row.sample] = completion
    return [[c for c in per_request if c is not None] for per_request in results]
