"""Setting vLLM up as a generation backend: the lazy import, its environment, the engine's arguments, the model folder,
the stream's ``AsyncLLM``.

vLLM is optional (``pip install groupwise[vllm]`` on a CUDA machine; ``scripts/install_vllm.sh`` builds the CPU
environment): nothing here imports it at module import time, so the core imports without it, and
:func:`groupwise.optional_packages.vllm_unavailable` says why it cannot be used before anything is built.

Environment variables, set (only where the user has not set them) before vLLM is imported:

* ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the synchronous engine (``vllm.LLM``) runs its engine core in this process
  instead of a child process. ``AsyncLLM`` (the stream) always runs its engine core in a child process.
* ``VLLM_CPU_KVCACHE_SPACE``: the KV cache of a CPU engine, in GiB (``VllmSettings.kv_cache_gib``).
* ``VLLM_CPU_OMP_THREADS_BIND=nobind``: vLLM's CPU worker otherwise pins its OpenMP threads to cores (``auto``, or a
  list such as ``0-7``); an in-process engine would pin the learner's threads with them. Set a list on a dedicated
  machine.

What building an engine does to the process it is built in, and :func:`process_state_kept` undoes: vLLM's CPU
worker replaces ``torch.set_num_threads`` with a no-op for the whole process (an in-process engine would silently
freeze the learner's thread count), and the worker seeds the global ``random``, numpy and torch generators with the
engine's seed. Also worth knowing: the first call that asks for logprobs compiles vLLM's rank kernel with
``torch.compile`` (tens of seconds, once per engine process, even under ``enforce_eager``).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from groupwise.model.loading import pretrained
from groupwise.optional_packages import VLLM_INSTALL_HINT, vllm_unavailable

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

LogprobSource = Literal["processed", "full_vocab"]


@dataclass(frozen=True)
class VllmSettings:
    """What a vLLM engine is built with.

    ``model_dir`` is a Hugging Face folder (weights, config, tokenizer: :func:`write_model_folder` writes one from a
    policy). ``logprobs`` says where the recorded sampling logprobs come from (:mod:`groupwise.generation.vllm.rows`):
    ``processed`` (vLLM's post-temperature logprob of the sampled token; exact without top-k/top-p) or
    ``full_vocab`` (the whole vocabulary's raw logits each step, tempered here; any top-k/top-p, slower for large
    vocabularies). ``max_model_len`` None: the model's ``max_position_embeddings``. ``kv_cache_gib`` sizes the KV
    cache on CPU; ``gpu_memory_utilization`` on CUDA. ``extra`` goes to the engine arguments as is.
    """

    model_dir: str
    dtype: str = "float32"
    device: str = "cpu"
    enforce_eager: bool = True
    logprobs: LogprobSource = "processed"
    max_model_len: int | None = None
    max_num_seqs: int = 256
    kv_cache_gib: int = 2
    gpu_memory_utilization: float = 0.5
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.logprobs not in ("processed", "full_vocab"):
            raise ValueError(f"logprobs={self.logprobs!r} must be 'processed' or 'full_vocab'")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r}: the vLLM backend runs on 'cpu' or 'cuda'")
        if not isinstance(self.kv_cache_gib, int) or self.kv_cache_gib < 1:
            raise ValueError(f"kv_cache_gib={self.kv_cache_gib!r} must be a whole number of GiB >= 1")


def logprob_source_for(top_k: int, top_p: float) -> LogprobSource:
    """``processed`` where vLLM's own logprob is the one recorded (no top-k/top-p), else ``full_vocab``."""
    return "processed" if top_k <= 0 and top_p >= 1.0 else "full_vocab"


def engine_kwargs(settings: VllmSettings) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` / ``AsyncEngineArgs`` for ``settings``."""
    kwargs: dict[str, Any] = {
        "model": settings.model_dir,
        "dtype": settings.dtype,
        "enforce_eager": settings.enforce_eager,
        "seed": settings.seed,
        "max_num_seqs": settings.max_num_seqs,
        # processed: after temperature (and after top-k/top-p, which is why filtered sampling takes full_vocab)
        "logprobs_mode": "processed_logprobs" if settings.logprobs == "processed" else "raw_logits",
        "max_logprobs": 0 if settings.logprobs == "processed" else -1,
        "disable_log_stats": True,
    }
    if settings.max_model_len is not None:
        kwargs["max_model_len"] = settings.max_model_len
    if settings.device == "cuda":
        kwargs["gpu_memory_utilization"] = settings.gpu_memory_utilization
    kwargs.update(settings.extra)
    return kwargs


def import_vllm(settings: VllmSettings) -> Any:  # Any: the vllm module (vllm is optional and imported lazily)
    """Set the environment defaults (module docstring) and import vLLM; a clear error when it is missing."""
    why = vllm_unavailable()
    if why is not None:
        raise ImportError(f"{why}: {VLLM_INSTALL_HINT}")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    if settings.device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.kv_cache_gib))
    import vllm

    return vllm


@contextmanager
def process_state_kept() -> Iterator[None]:
    """Build an engine inside this: afterwards ``torch.set_num_threads`` (made a no-op by vLLM's CPU worker), the
    thread count and the global random generators (seeded by vLLM's worker) are what they were, so the rest of the
    process (the learner) is as it was."""
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    python_state, numpy_state, torch_state = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        torch.random.set_rng_state(torch_state)


async def build_async_llm(settings: VllmSettings) -> Any:  # Any: a vLLM AsyncLLM (vllm: optional, lazy)
    """The stream's ``AsyncLLM`` (its engine core in a child process; on CUDA, weight transfer over CUDA IPC), built
    on the running loop that serves it, with this process's state kept (:func:`process_state_kept`)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    kwargs = engine_kwargs(settings)
    if settings.device == "cuda":
        from vllm.config import WeightTransferConfig

        kwargs["weight_transfer_config"] = WeightTransferConfig(backend="ipc")
    with process_state_kept():
        return AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))


def write_model_folder(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, directory: str | Path) -> Path:
    """Write ``model`` (a plain causal LM: merge LoRA adapters first) and ``tokenizer`` as a Hugging Face folder
    vLLM loads (``config.json``, ``generation_config.json``, safetensors weights, the tokenizer files)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    pretrained(model).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
