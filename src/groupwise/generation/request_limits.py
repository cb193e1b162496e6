"""Requests with a token limit of their own, on a generator whose calls take one limit for every row.

An episode turn may sample only what its episode has room for (``GenerationRequest.max_new_tokens``). A generation
stream applies each request's limit to its own rows; a batch-per-call engine gets one call per distinct limit, the
sampling's ``max_new_tokens`` lowered to it, and the answers back in request order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from groupwise.types import Completion, GenerationRequest, SamplingParams

BatchCall = Callable[[Sequence[GenerationRequest], SamplingParams], list[list[Completion]]]


def request_limit(request: GenerationRequest, max_new: int) -> int:
    """The token limit of ``request``'s rows: its own ``max_new_tokens`` when set (1 to ``max_new``), else
    ``max_new``; raises on a limit outside that range."""
    limit = max_new if request.max_new_tokens is None else request.max_new_tokens
    if not 1 <= limit <= max_new:
        raise ValueError(f"a request asks for max_new_tokens={limit}; it must be 1 to the sampling's {max_new}")
    return limit


def has_own_limits(requests: Sequence[GenerationRequest]) -> bool:
    return any(request.max_new_tokens is not None for request in requests)


def generate_by_limit(
    requests: Sequence[GenerationRequest], sampling: SamplingParams, generate: BatchCall
) -> list[list[Completion]]:
    """``generate`` once per distinct limit (a request's own, else the sampling's), in request order; a limit above
    the sampling's is an error."""
    by_limit: dict[int, list[int]] = {}
    for index, request in enumerate(requests):
        by_limit.setdefault(request_limit(request, sampling.max_new_tokens), []).append(index)
    results: list[list[Completion]] = [[] for _ in requests]
    for limit, indices in by_limit.items():
        plain = [replace(requests[i], max_new_tokens=None) for i in indices]
        for index, completions in zip(indices, generate(plain, replace(sampling, max_new_tokens=limit)), strict=True):
            results[index] = completions
    return results
