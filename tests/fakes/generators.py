"""`ToyGenerator`: a generation backend of the tests' own, plugged in as ``generation.backend:
fakes.generators:toy_backend`` — the proof that a backend needs nothing but the generator factory.

It samples digit tokens uniformly (logprob ``-log 10`` each, recorded as a real backend records the sampled
token's logprob), from a counter RNG seeded by (request seed, sample index), so a prompt samples the same
completions whatever batch it lands in; it never streams. `ShiftedGenerator` is the built-in engine with its
recorded logprobs off by a known amount (the rollout–trainer mismatch tests).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import replace

from torch import Tensor

from groupwise.generation.factory import BACKENDS, GeneratorSpec
from groupwise.types import Completion, GenerationRequest, SamplingParams

DIGITS = "0123456789"


class ToyGenerator:
    """A :class:`~groupwise.generation.base.Generator` that samples digits, then EOS (see the module docstring)."""

    def __init__(self, spec: GeneratorSpec) -> None:
        self.tokenizer = spec.tokenizer
        self.eos = int(spec.eos_token_ids[0])
        self.digit_ids = [int(self.tokenizer.convert_tokens_to_ids(d)) for d in DIGITS]
        self._version = 0
        self.calls = 0
        self.loads: list[int] = []

    @property
    def version(self) -> int:
        return self._version

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        self.calls += 1
        return [[self._sample(request.seed, i, sampling) for i in range(request.num_samples)] for request in requests]

    def _sample(self, seed: int, index: int, sampling: SamplingParams) -> Completion:
        rng = random.Random(f"{seed}/{index}")
        length = rng.randint(1, max(1, sampling.max_new_tokens - 1))
        ids = tuple(rng.choice(self.digit_ids) for _ in range(length)) + (self.eos,)
        logprobs = (-math.log(len(DIGITS)),) * length + (0.0,)
        text = self.tokenizer.decode(list(ids), skip_special_tokens=False)
        return Completion(ids, logprobs, text, "stop", self._version)

    def load_weights(self, state: Mapping[str, Tensor], version: int) -> None:
        self.loads.append(version)
        self._version = version


def toy_backend(spec: GeneratorSpec) -> ToyGenerator:
    """The factory ``generation.backend: fakes.generators:toy_backend`` names."""
    return ToyGenerator(spec)


SHIFT = 0.05
"""What :class:`ShiftedGenerator` adds to every recorded logprob."""


class ShiftedGenerator:
    """The built-in engine with every recorded logprob raised by :data:`SHIFT`: a generator whose logprobs disagree
    with the learner's by a known gap (``generation.backend: fakes.generators:shifted_backend``)."""

    def __init__(self, spec: GeneratorSpec) -> None:
        self.engine = BACKENDS["builtin"](spec)

    @property
    def version(self) -> int:
        return self.engine.version

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        return [[replace(c, logprobs=tuple(lp + SHIFT for lp in c.logprobs)) for c in per_request]
                for per_request in self.engine.generate(requests, sampling)]  # fmt: skip

    def load_weights(self, state: Mapping[str, Tensor], version: int) -> None:
        self.engine.load_weights(state, version)


def shifted_backend(spec: GeneratorSpec) -> ShiftedGenerator:
    """The factory ``generation.backend: fakes.generators:shifted_backend`` names."""
    return ShiftedGenerator(spec)


def raising_backend(spec: GeneratorSpec) -> ToyGenerator:
    """A factory that fails as a user's may (a server it needs is down)."""
    raise RuntimeError("the sampling server at :9000 is down")


def not_a_generator_backend(spec: GeneratorSpec) -> dict[str, int]:
    """A factory that returns something else than a generator."""
    return {"version": 0}


def two_argument_backend(spec: GeneratorSpec, server: str) -> ToyGenerator:
    """A factory that needs more than the GeneratorSpec it is called with."""
    return ToyGenerator(spec)


class ShortToyGenerator(ToyGenerator):
    """A toy that returns one completion per request, whatever the request asked for."""

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        return [completions[:1] for completions in super().generate(requests, sampling)]


def short_backend(spec: GeneratorSpec) -> ShortToyGenerator:
    return ShortToyGenerator(spec)


class BrokenToyGenerator(ToyGenerator):
    """A toy that breaks the Generator contract in one way (``how``) from call ``after + 1`` on (test only)."""

    how = ""
    after = 0

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list:
        outputs = super().generate(requests, sampling)
        if self.calls <= self.after:
            return outputs
        return [[self._broken(c) for c in per_request] for per_request in outputs]

    def _broken(self, completion: Completion) -> object:
        broken = {
            "string": lambda: completion.text,
            "nan": lambda: replace(completion, logprobs=(math.nan, *completion.logprobs[1:])),
            "vocab": lambda: replace(completion, token_ids=(10**6, *completion.token_ids[1:])),
            "version": lambda: replace(completion, weight_version=self.version + 5, token_versions=()),
            "finish": lambda: replace(completion, finish_reason="done"),
        }
        return broken[self.how]()


def broken_backend(how: str, after: int = 0):
    """A factory of a :class:`BrokenToyGenerator` breaking the contract ``how``."""

    def make(spec: GeneratorSpec) -> BrokenToyGenerator:
        generator = BrokenToyGenerator(spec)
        generator.how, generator.after = how, after
        return generator

    return make


string_backend, nan_backend, vocab_backend, version_backend, finish_backend = (
    broken_backend(how) for how in ("string", "nan", "vocab", "version", "finish")
)
late_nan_backend = broken_backend("nan", after=1)  # its first answer (the probe's) keeps the contract
