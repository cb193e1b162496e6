"""The built-in engine as evaluation uses it while a generation stream runs on it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import Tensor

from groupwise.generation.base import Generator, RequestStream
from groupwise.types import Completion, GenerationRequest, SamplingParams


class PausingGenerator:
    """``engine``, with every call parking ``stream`` first (at a token boundary; its rows keep their slots), so an
    evaluation between rollouts shares the stream's weights without a decode step of the stream meanwhile."""

    def __init__(self, engine: Generator, stream: RequestStream) -> None:
        self.engine, self.stream = engine, stream

    @property
    def version(self) -> int:
        return self.engine.version

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        with self.stream.paused():
            return self.engine.generate(requests, sampling)

    def load_weights(self, state: Mapping[str, Tensor], version: int) -> None:
        with self.stream.paused():
            self.engine.load_weights(state, version)
