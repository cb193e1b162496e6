#!/usr/bin/env bash
# Installs PyTorch (torch==2.13.0) into the virtual environment whose python is given:
#
#   bash scripts/install_torch.sh VENV/bin/python
#
# * A machine with a CUDA GPU (nvidia-smi lists one): pip's default build from the configured index (on Linux, the
#   CUDA build PyPI serves).
# * A machine without one: PyTorch's CPU build, from PyTorch's CPU wheel index (https://download.pytorch.org/whl/cpu,
#   about 200 MB, no CUDA libraries). Where that index cannot be reached (a machine that sees only a package mirror),
#   the plain `pip install torch==2.13.0` from the configured index instead: a CPU wheel when the mirror or a local
#   wheel directory serves one; otherwise, on Linux, PyPI's default build, which carries CUDA libraries (it runs on
#   the CPU all the same). The script says which it installed.
set -euo pipefail
python="$1"
version="2.13.0"
cpu_index="https://download.pytorch.org/whl/cpu"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "CUDA GPU found: installing pip's default PyTorch build (torch==$version)"
    "$python" -m pip install -q "torch==$version"
elif "$python" -m pip install -q --retries 1 --timeout 20 --index-url "$cpu_index" "torch==$version"; then
    echo "no CUDA GPU: installed torch==$version with --index-url $cpu_index"
else
    echo "no CUDA GPU, and $cpu_index cannot be reached: installing torch==$version from the configured index"
    "$python" -m pip install -q "torch==$version"
fi
"$python" -c 'import torch; print(f"torch {torch.__version__}: " + (f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"))'
