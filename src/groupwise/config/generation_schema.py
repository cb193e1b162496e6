"""The ``generation`` section: how completions are sampled, and by which backend (the built-in engine or vLLM).

Only single-field ranges live here; rules that relate two fields are in :mod:`groupwise.config.rules` and
:mod:`groupwise.config.backend_rules`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from groupwise.config.base import Section, invalid
from groupwise.plugins import is_plugin_target

GENERATION_BACKENDS = ("builtin", "vllm")
"""The generation backends that ship with groupwise (each is one line of :mod:`groupwise.generation.factory`)."""
BUILTIN_ENGINE_KEYS = ("fast_decode", "cuda_graphs", "compile", "projections")
"""``generation`` keys only the built-in engine reads; under another backend they keep their defaults."""
VLLM_OWN_ENGINE_ARGS = (
    "model", "tokenizer", "dtype", "seed", "enforce_eager", "max_num_seqs", "max_model_len", "logprobs_mode",
    "max_logprobs", "gpu_memory_utilization", "weight_transfer_config",
)  # fmt: skip
"""vLLM engine arguments the backend sets itself (from the model, ``generation`` and ``generation.vllm``)."""


class VllmSection(Section):
    """The vLLM backend's engine (``generation.backend: vllm``; docs/generation.md, "Backends")."""

    enforce_eager: bool | None = None
    """Run vLLM's model eagerly (``true``), or compiled with CUDA graphs (``false``: faster decoding, a start that
    takes minutes). ``null`` = ``true`` on a CPU (the compiled start took 2–10 minutes there), vLLM's default
    (``false``) on CUDA."""
    max_num_seqs: int = Field(256, ge=1)
    """Most sequences (rows) vLLM decodes at once (≥ 1); its scheduler queues the rest."""
    kv_cache_gib: int = Field(2, ge=1)
    """The KV cache of a CPU engine in GiB (≥ 1; ``VLLM_CPU_KVCACHE_SPACE``). CPU only."""
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """Fraction of the GPU's memory vLLM may take for weights, activations and KV cache (0 < f ≤ 1). The learner
    shares the GPU, so the default leaves it half. CUDA only."""
    engine_args: dict[str, Any] = Field(default_factory=dict)
    """More keyword arguments for vLLM's engine as they are (e.g. ``enable_prefix_caching: true``,
    ``quantization: fp8``); not those the backend sets itself (``model``, ``dtype``, ``seed``, the keys above, the
    logprob settings)."""

    @field_validator("engine_args")
    @classmethod
    def _not_the_backends_own(cls, engine_args: dict[str, Any]) -> dict[str, Any]:
        own = sorted(set(engine_args) & set(VLLM_OWN_ENGINE_ARGS))
        if own:
            raise invalid(
                f"generation.vllm.engine_args may not set {own}: the backend sets them from the model, generation "
                "and generation.vllm keys",
                "remove them (set generation.vllm.enforce_eager / max_num_seqs / kv_cache_gib / "
                "gpu_memory_utilization, model.dtype, run.seed instead)",
            )
        return engine_args


class GenerationSection(Section):
    """How training completions are sampled."""

    backend: str = "builtin"
    """The generation backend: ``builtin`` (the in-process KV-cache sampling engine, docs/generation.md), ``vllm``
    (vLLM's engine: ``pip install groupwise[vllm]`` on a CUDA machine, ``make test-vllm`` builds a CPU
    environment; settings in ``generation.vllm``), or a backend of your own as ``package.module:function`` (called
    with a ``groupwise.generation.factory.GeneratorSpec``, it returns a ``Generator``).
    :mod:`groupwise.generation.factory` builds each."""
    max_new_tokens: int = Field(16, ge=1)
    """Completion length cap in tokens (≥ 1)."""
    temperature: float = Field(1.0, ge=0.01)
    """Sampling temperature (≥ 0.01). 0 (greedy) is not allowed for training: identical samples have no reward
    variance; evaluation reports greedy accuracy on its own. Below 0.01 sampling is greedy in all but name and the
    logits scaled by 1 / temperature overflow (1e-300 makes every logprob NaN), so the training logprobs and their
    importance ratios are not finite."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass (0 < p ≤ 1; 1 = off)."""
    top_k: int = Field(0, ge=0)
    """Keep only the k most likely tokens (≥ 0; 0 = off)."""
    stop: list[str] = Field(default_factory=list)
    """Extra stop strings (non-empty); generation also stops at EOS."""
    micro_batch_groups: int = Field(64, ge=1)
    """Prompt groups per generation-engine call (≥ 1); bounds generation memory."""
    fast_decode: bool = True
    """Decode Llama-family models (Llama, Qwen2) with the engine's fast step (same arithmetic as the model's
    forward, checked on a probe at the first call; other models always use their forward). false forces the
    model's forward. See docs/generation.md."""
    cuda_graphs: Literal["auto", "on", "off"] = "auto"
    """Run the fast decode step as CUDA graphs, one per row bucket, from static buffers (docs/generation.md):
    ``auto`` = when the model is on a CUDA device and the fast step takes it; ``on`` = the same, and an error
    where graphs cannot run (no CUDA device, or a model the fast step refuses); ``off`` = no graphs on CUDA.
    YAML reads a bare on/off as true/false; those mean on/off here."""
    compile: Literal["auto", "on", "off"] = "auto"
    """Compile the fast decode step with torch's compiler where it is not a CUDA graph (a CPU; docs/generation.md,
    "A compiled decode step"): ``on`` = compile (each compile's seconds are logged), ``off`` = never, ``auto`` =
    only a run planning at least 100,000 decode steps (``run.max_steps × max_new_tokens``), since on a CPU the
    compiled step was no faster beyond the noise and its compiles cost minutes. YAML reads a bare on/off as
    true/false; those mean on/off here."""
    projections: Literal["auto", "dense", "onednn"] = "auto"
    """The fast decode step's linear projections (docs/generation.md, "oneDNN or dense"): ``auto`` = oneDNN's packed
    weights for a float32 model on a CPU from a hidden size of 384, dense ``addmm`` on a plain copy otherwise (below
    that size oneDNN's per-call cost outweighs its kernel); ``dense`` or ``onednn`` forces one, to measure or to
    override the rule on a machine where it measures otherwise. ``onednn`` needs ``model.dtype: float32`` on a
    CPU."""
    continuous_batching: bool = False
    """Decode with continuous batching (docs/generation.md): requests join a running decode loop as rows finish,
    each handed back as soon as its own G completions are done, instead of one batch per engine call that only
    shrinks. The async runtimes feed requests to the engine while it runs; in sync mode a call with more rows than
    fit at once no longer waits for each chunk's slowest row. Needs the fast decode step (Llama and Qwen2 models;
    other models run one batch per call, and ``events.log`` says so); needed by ``async.partial_rollouts``. With
    ``backend: vllm`` the stream is vLLM's ``AsyncLLM`` (any model vLLM serves)."""
    vllm: VllmSection = Field(default_factory=VllmSection)
    """The vLLM engine's settings (``backend: vllm`` only)."""

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, backend: str) -> str:
        if backend in GENERATION_BACKENDS or is_plugin_target(backend):
            return backend
        raise invalid(
            f"generation.backend must be one of {', '.join(GENERATION_BACKENDS)} or a backend factory "
            "'package.module:function'",
            "pick a shipped backend, or name your backend's factory as package.module:function",
        )

    @field_validator("cuda_graphs", "compile", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: Any) -> Any:  # Any: pydantic's raw input, before validation
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("stop")
    @classmethod
    def _stop_strings_not_empty(cls, stop: list[str]) -> list[str]:
        if any(not s for s in stop):
            raise invalid("generation.stop must not contain an empty string", "remove the empty entry")
        return stop
