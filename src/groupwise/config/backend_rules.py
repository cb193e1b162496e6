"""Cross-field rules of ``generation.backend``: what the vLLM backend reads and what it cannot do.

The built-in engine's own keys under another backend are refused in :mod:`groupwise.config.rules`
(``BUILTIN_ENGINE_KEYS``); whether the ``vllm`` package is installed is a check against the machine
(:mod:`groupwise.trainer.preflight`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from groupwise.config.checks import no_effect, rule
from groupwise.config.issues import ConfigIssue

if TYPE_CHECKING:
    from groupwise.config.schema import RunConfig


@rule("generation", "model")
def vllm_keys_need_the_vllm_backend(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """generation.vllm keys keep their defaults unless generation.backend is vllm; kv_cache_gib is for a CPU
    engine and gpu_memory_utilization for a CUDA one."""
    gen = cfg.generation
    if gen.backend != "vllm":
        yield from no_effect(gen.vllm, "generation.vllm", f"with generation.backend '{gen.backend}'",
                             "remove it, or set generation.backend: vllm")
        return
    defaults = type(gen.vllm)()
    device = cfg.model.device
    if device == "cuda" and gen.vllm.kv_cache_gib != defaults.kv_cache_gib:
        yield ConfigIssue("generation.vllm.kv_cache_gib", gen.vllm.kv_cache_gib,
                          "generation.vllm.kv_cache_gib sizes a CPU engine's KV cache; on model.device 'cuda' vLLM "
                          "takes generation.vllm.gpu_memory_utilization of the GPU instead",
                          "remove generation.vllm.kv_cache_gib (set gpu_memory_utilization)")  # fmt: skip
    if device == "cpu" and gen.vllm.gpu_memory_utilization != defaults.gpu_memory_utilization:
        yield ConfigIssue("generation.vllm.gpu_memory_utilization", gen.vllm.gpu_memory_utilization,
                          "generation.vllm.gpu_memory_utilization has no effect with model.device 'cpu'",
                          "remove it (a CPU engine's KV cache is generation.vllm.kv_cache_gib)")  # fmt: skip


@rule("mode", "generation", "async_")
def vllm_keeps_the_kv_cache(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """Under generation.backend vllm, partial rollouts keep the rows' KV cache (async.partial_rollout_kv: keep):
    vLLM pauses running requests with their cache and cannot rebuild it under the new weights."""
    section = cfg.async_
    if cfg.generation.backend != "vllm" or section.partial_rollouts != "continue":
        return
    if section.partial_rollout_kv != "keep":
        yield ConfigIssue(
            "async.partial_rollout_kv", section.partial_rollout_kv,
            "with generation.backend vllm a weight load pauses the running requests with their KV cache (vLLM's "
            "pause in 'keep' mode) and they go on with it: vLLM does not recompute it under the new weights",
            "set async.partial_rollout_kv: keep, or generation.backend: builtin",
        )


@rule("generation", "learner")
def vllm_with_one_learner(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """generation.backend vllm trains with one learner process (learner.num_ranks 1)."""
    if cfg.generation.backend == "vllm" and cfg.learner.num_ranks > 1:
        yield ConfigIssue(
            "learner.num_ranks", cfg.learner.num_ranks,
            "the vLLM backend is not built for data-parallel learner ranks yet (vLLM sets up torch.distributed in "
            "the process it runs in, next to the ranks' own process group; untested)",
            "set learner.num_ranks: 1, or generation.backend: builtin",
        )
