"""The ``Generator`` interface: what the loops and the controller need from any sampling backend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from torch import Tensor

from groupwise.types import Completion, GenerationRequest, SamplingParams


@runtime_checkable
class Generator(Protocol):
    """Samples completions with the logprobs recorded at sampling time, under versioned weights.

    - ``generate`` returns one list per request, in request order, each holding exactly
      ``request.num_samples`` completions in sample-index order. Sampling depends only on
      (request seed, sample index, position) and the weights, not on batch composition.
    - Every completion is stamped with ``version``, the weight version that produced it.
    - ``load_weights`` replaces the weights (a full state dict of the policy) and sets ``version``.
    """

    @property
    def version(self) -> int: ...

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]: ...

    def load_weights(self, state: Mapping[str, Tensor], version: int) -> None: ...
