"""``generation.backend: vllm``: the factory function that builds the vLLM generator a run samples with.

One vLLM engine per run, chosen by ``generation.continuous_batching``:

* **off** — :class:`~groupwise.generation.vllm.engine.VllmGenerator` over an in-process ``vllm.LLM``: one batch
  per call (vLLM batches a call's rows itself), weights reloaded in place after every step.
* **on** — :class:`~groupwise.generation.vllm.stream.VllmStream` over ``AsyncLLM``, from the start: it is the
  run's generator *and* the stream the async runtimes open on it (``open_stream`` returns the stream itself), so
  weight loads, evaluation and rollouts share one engine (vLLM allows one in-process engine per process). Partial
  rollouts pause it in vLLM's ``keep`` mode.

The engine loads the policy the spec holds (adapters merged: the builder hands a plain model), written once as a
Hugging Face folder that is removed as soon as the engine has read it. The sampling logprobs it records are the
built-in engine's (tempered, unfiltered): vLLM's processed logprobs without top-k/top-p, else the full vocabulary's
logits (:func:`~groupwise.generation.vllm.setup.logprob_source_for`).
"""

from __future__ import annotations

import shutil
import tempfile
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel

from groupwise.generation.base import Generator
from groupwise.generation.factory import UnservedArchitecture
from groupwise.generation.vllm.engine import VllmGenerator
from groupwise.generation.vllm.setup import VllmSettings, logprob_source_for, write_model_folder
from groupwise.generation.vllm.stream import VllmStream
from groupwise.model.loading import resolve_device
from groupwise.types import SamplingParams

if TYPE_CHECKING:  # the factory imports this module when vllm is chosen: a type-only import keeps no cycle
    from groupwise.generation.factory import GeneratorSpec


def vllm_settings(spec: GeneratorSpec, model_dir: str) -> VllmSettings:
    """The engine settings of ``spec`` (``generation.vllm``, the model's device and dtype) for the folder
    ``model_dir``."""
    gen, engine = spec.generation, spec.generation.vllm
    device = resolve_device(spec.model_section.device).type
    if device not in ("cpu", "cuda"):
        raise ValueError(f"model.device resolves to {device!r}; the vLLM backend runs on cpu or cuda")
    return VllmSettings(
        model_dir=model_dir,
        dtype=spec.model_section.dtype,
        device=device,
        enforce_eager=engine.enforce_eager if engine.enforce_eager is not None else device == "cpu",
        logprobs=logprob_source_for(gen.top_k, gen.top_p),
        max_num_seqs=engine.max_num_seqs,
        kv_cache_gib=engine.kv_cache_gib,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        extra=dict(engine.engine_args),
    )


def stream_sampling(spec: GeneratorSpec) -> SamplingParams:
    """The stream's default sampling: the ``generation`` section's (the runtimes pass the same to ``open_stream``)."""
    gen = spec.generation
    return SamplingParams(gen.max_new_tokens, gen.temperature, gen.top_p, gen.top_k, tuple(gen.stop))


def check_served(architectures: list[str]) -> None:
    """Raise :class:`UnservedArchitecture` unless vLLM's model registry serves one of ``architectures`` natively.

    vLLM would otherwise fall back to its generic transformers backend, which fails inside vLLM (after the model
    load, with a traceback from its internals) for models that backend cannot compile."""
    from vllm.model_executor.models import ModelRegistry  # vLLM is imported by now (the engine is next)

    served = set(ModelRegistry.get_supported_archs())
    if not any(name in served for name in architectures):
        raise UnservedArchitecture(
            f"vLLM {_vllm_version()} does not serve the architecture {', '.join(architectures) or '(none)'} "
            "natively (its model registry lists Llama, Qwen2, Mistral, Gemma and most other decoder families)"
        )


def _architectures(model: torch.nn.Module) -> list[str]:
    """The architectures the model's config names (what vLLM's registry is keyed by), else its class name."""
    named = list(model.config.architectures or []) if isinstance(model, PreTrainedModel) else []
    return named or [type(model).__name__]


def _vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def build_vllm_generator(spec: GeneratorSpec) -> Generator:
    """The vLLM generator of ``spec`` (module docstring); raises ``ImportError`` naming the install when vLLM is
    missing (``config check`` and the preflight report that first, as a config error), and
    :class:`UnservedArchitecture` before building an engine that would fail on the model."""
    check_served(_architectures(spec.model))
    folder = tempfile.mkdtemp(prefix="groupwise-vllm-model-")
    try:
        write_model_folder(spec.model, spec.tokenizer, folder)
        settings = vllm_settings(spec, folder)
        weight_names = list(spec.model.state_dict())
        if spec.generation.continuous_batching:
            return VllmStream(settings, spec.tokenizer, spec.eos_token_ids, weight_names, stream_sampling(spec))
        return VllmGenerator(settings, spec.tokenizer, spec.eos_token_ids, weight_names)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the engine has read it (new weights are loaded in place)
