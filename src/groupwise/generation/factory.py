"""One factory for every generation backend: ``build_generator(spec)`` builds the one ``generation.backend`` names.

Adding a backend is one module (a class implementing :class:`~groupwise.generation.base.Generator`, and
:class:`~groupwise.generation.base.StreamingGenerator` when it can stream), one value of ``generation.backend`` in the
config schema (``GENERATION_BACKENDS``), and one line in :data:`BACKENDS`; or, without touching groupwise, a plug-in
``generation.backend: package.module:function`` that takes a :class:`GeneratorSpec` and returns the generator.
Nothing else names a backend class: the runtimes and the trainer see a ``Generator`` and ask
:func:`stream_support` what it can do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from groupwise.generation.base import Generator, OwnsEngine, RequestStream, StreamingGenerator, StreamSupport
from groupwise.generation.contract import GeneratorContractError, check_completions, probe_problem
from groupwise.plugins import PluginImportError, import_plugin
from groupwise.types import Completion, GenerationRequest, SamplingParams

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from groupwise.config import GenerationSection, ModelSection


@dataclass(frozen=True)
class GeneratorSpec:
    """What a backend is built from: the ``generation`` and ``model`` sections, the model whose weights it samples
    from (the policy, or a copy of its own), the tokenizer and the token ids that end a completion."""

    generation: GenerationSection
    model_section: ModelSection
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    eos_token_ids: Sequence[int]
    planned_decode_steps: int | None = None
    """Decode steps the run plans (``run.max_steps × generation.max_new_tokens``; None: unknown), for
    ``generation.compile: auto``."""


def _builtin(spec: GeneratorSpec) -> Generator:
    from groupwise.generation.compiled_step import compile_wanted  # torch: only when a generator is built
    from groupwise.generation.engine import Engine

    gen = spec.generation
    return Engine(
        spec.model, spec.tokenizer, spec.eos_token_ids, fast_decode=gen.fast_decode, cuda_graphs=gen.cuda_graphs,
        continuous_batching=gen.continuous_batching,
        compile_step=compile_wanted(gen.compile, spec.planned_decode_steps), projections=gen.projections,
    )  # fmt: skip


def _vllm(spec: GeneratorSpec) -> Generator:
    from groupwise.generation.vllm.factory import build_vllm_generator  # vLLM is optional: imported when chosen

    return build_vllm_generator(spec)


class UnservedArchitecture(ValueError):
    """The model's architecture is not one the chosen backend serves (the message names it; the trainer reports a
    config error on ``model.path``)."""


class BackendPluginError(ValueError):
    """A plug-in ``generation.backend`` factory that raised, or returned something that is not a Generator; the
    message names the backend and what happened (the trainer reports it as a config error on that key)."""


BACKENDS: dict[str, Callable[[GeneratorSpec], Generator]] = {
    "builtin": _builtin,
    "vllm": _vllm,
}


def build_generator(spec: GeneratorSpec) -> Generator:
    """The generator of ``spec.generation.backend``: a shipped one, or a plug-in factory ``package.module:function``
    (called with ``spec``; it must return a :class:`Generator`). A plug-in factory that raises, or returns anything
    else, raises :class:`BackendPluginError` with its own message; so does a plug-in generator whose answer to one
    probe request breaks the Generator contract (:func:`~groupwise.generation.contract.probe_problem`)."""
    name = spec.generation.backend
    build = BACKENDS.get(name)
    if build is not None:
        return _checked(name, build(spec))
    factory = import_plugin(name, "generation backend")
    if not callable(factory):
        raise PluginImportError(f"generation backend {name!r}: it is a {type(factory).__name__}, not callable")
    try:
        generator = factory(spec)
    except Exception as exc:  # the user's factory: its failure is theirs to fix, reported as such
        raise BackendPluginError(
            f"generation backend {name!r}: the factory raised {type(exc).__name__}: {exc}"
        ) from exc
    generator = _checked(name, generator)
    problem = probe_problem(generator, spec)
    if problem is not None:
        raise BackendPluginError(f"generation backend {name!r} does not keep the Generator contract: {problem}")
    return generator


def _checked(name: str, generator: object) -> Generator:
    if not isinstance(generator, Generator):
        raise BackendPluginError(
            f"generation backend {name!r} returned a {type(generator).__name__}, which is not a Generator (it needs "
            "version, generate and load_weights: groupwise.generation.base.Generator)"
        )
    return generator


class GeneratedCountError(GeneratorContractError):
    """A generator that returned another number of completions than its requests asked for."""


def checked_outputs(
    generator: Generator, requests: Sequence[GenerationRequest], outputs: list[list[Completion]]
) -> list[list[Completion]]:
    """``outputs`` of ``generator.generate(requests)`` when they hold one list per request and ``num_samples``
    completions in each, each keeping the contract (:mod:`groupwise.generation.contract`); else a
    :class:`GeneratedCountError` naming the generator and what it returned (a short group would otherwise surface
    far downstream, as a group too small to train), or a :class:`GeneratorContractError` naming the completion."""
    counts = [len(per_request) for per_request in outputs] if isinstance(outputs, list) else None
    asked = [request.num_samples for request in requests]
    if counts == asked:
        check_completions(generator, outputs)
        return outputs
    what = type(generator).__name__
    if counts is None or len(counts) != len(asked):
        got = f"a {type(outputs).__name__}" if counts is None else f"{len(counts)} list(s)"
        raise GeneratedCountError(f"the generator {what} returned {got} for {len(asked)} request(s); it must "
                                  "return one list of completions per request")
    index = next(i for i, (c, a) in enumerate(zip(counts, asked, strict=True)) if c != a)
    short = sum(c != a for c, a in zip(counts, asked, strict=True))
    raise GeneratedCountError(
        f"the generator {what} returned {counts[index]} completion(s) for request {index}, which asked for "
        f"{asked[index]} ({short} of {len(asked)} request(s) got another count than asked); a generator returns "
        "exactly num_samples completions per request"
    )


def stream_support(generator: Generator) -> StreamSupport:
    """The one capability query: can ``generator`` run a request stream (continuous batching, weights loaded
    mid-generation, resumed attempts) for its model?"""
    if isinstance(generator, StreamingGenerator):
        return generator.stream_support()
    return StreamSupport(False, f"the {type(generator).__name__} generator does not run a request stream")


def open_stream(
    generator: Generator, sampling: SamplingParams, *, max_rows: int, partial: str = "off", kv: str = "recompute",
    reuse_prefixes: bool = True,
) -> RequestStream:  # fmt: skip
    """A request stream on ``generator`` (which :func:`stream_support` said can run one)."""
    support = stream_support(generator)
    if not support.available or not isinstance(generator, StreamingGenerator):
        raise ValueError(f"this generator cannot run a request stream: {support.reason}")
    return generator.open_stream(sampling, max_rows=max_rows, partial=partial, kv=kv, reuse_prefixes=reuse_prefixes)


def shutdown_generator(generator: Generator) -> None:
    """Stop the engine ``generator`` runs outside this process's objects, if it runs one (:class:`OwnsEngine`: the
    vLLM backend's engine and its processes); the built-in engine holds nothing to stop."""
    if isinstance(generator, OwnsEngine):
        generator.shutdown()
