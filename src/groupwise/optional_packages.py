"""Whether an optional package a config asks for is installed, asked without importing it (``config check`` stays
fast and imports no torch)."""

from __future__ import annotations

import importlib.util

VLLM_INSTALL_HINT = (
    "install groupwise[vllm] (pip install 'groupwise[vllm]') on a CUDA machine; on a CPU, `make test-vllm` (or "
    "scripts/install_vllm.sh) builds .venv-vllm with vLLM's CPU build"
)


def vllm_unavailable() -> str | None:
    """Why ``generation.backend: vllm`` cannot run here (the ``vllm`` package is missing), or None when it can."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:  # (a folder named vllm on the path is no package)
        return "generation.backend 'vllm' needs the vllm package, which is not installed in this environment"
    return None
