#!/usr/bin/env bash
# Creates TRL's own environment (default .venv-trl) for bench/trl_matched.py: TRL is not a groupwise dependency.
#
#   bash scripts/install_trl.sh [VENV] [GROUPWISE_VENV]
#
# PyTorch first (torch==2.13.0, as groupwise's .venv, by scripts/install_torch.sh: without a CUDA GPU its CPU build,
# from PyTorch's CPU wheel index, or from the configured index where that cannot be reached), then trl with torch held there and transformers held at the version GROUPWISE_VENV (default .venv) has, so both
# sides of the benchmark run the same model code; without that venv, the version groupwise was last measured with.
# pydantic is there because bench/trl_runner.py imports groupwise's countdown reward from its source tree (the
# package's data module imports it); groupwise itself is not installed here. Needs only PyPI (and PyTorch's CPU
# wheel index where it can be reached).
set -euo pipefail
venv="${1:-.venv-trl}"
groupwise_venv="${2:-.venv}"
trl_version="${TRL_VERSION:-1.16.0}"
transformers_version="5.25.0"
if [ -x "$groupwise_venv/bin/python" ]; then
    transformers_version="$("$groupwise_venv/bin/python" -c 'import importlib.metadata as m; print(m.version("transformers"))')"
fi
export PIP_DEFAULT_TIMEOUT="${PIP_DEFAULT_TIMEOUT:-60}" PIP_RETRIES="${PIP_RETRIES:-10}"
python3 -m venv "$venv"
pip="$venv/bin/python -m pip"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
printf 'torch==2.13.0\ntransformers==%s\n' "$transformers_version" >"$constraints"
echo "[1/2] PyTorch (torch==2.13.0)"
bash "$(dirname "$0")/install_torch.sh" "$venv/bin/python"
echo "[2/2] trl==$trl_version, transformers==$transformers_version, accelerate, datasets, pydantic"
$pip install -q -c "$constraints" "trl==$trl_version" "transformers==$transformers_version" accelerate datasets pydantic
$venv/bin/python -c 'import torch, transformers, trl; print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}")'
