#!/usr/bin/env bash
# Downloads, into .whl/, the wheels a GPU machine without a package index needs to run groupwise there.
#
# The GPU image (Python 3.12, torch, transformers, accelerate, peft, tensorboard, matplotlib, rich, PyYAML,
# numpy, tqdm, requests) lacks pydantic and its own dependencies (pydantic-core, annotated-types,
# typing-inspection, and a typing-extensions new enough for them), looptime (the simulator) and gguf (GGUF
# loading). The versions below are exact pins inside pyproject.toml's ranges; --no-deps because every other
# requirement is already in the image. On the GPU machine:
#
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site:src python3 bench/gpu.py --out "$OUT/gpu.json"
#
# Usage: scripts/gpu_wheels.sh [PYTHON]   (PYTHON: an interpreter with pip, default python3)
set -euo pipefail
python="${1:-python3}"
cd "$(dirname "$0")/.."
wheels=(
    "pydantic==2.14.4"
    "pydantic-core==2.50.5"
    "annotated-types==0.8.0"
    "typing-inspection==0.4.5"
    "typing-extensions==4.16.0"
    "looptime==0.9"
    "gguf==0.19.0"
)
rm -rf .whl
mkdir -p .whl
"$python" -m pip download -q --no-deps --only-binary=:all: --dest .whl \
    --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    "${wheels[@]}"
count=$(ls .whl/*.whl | wc -l)
if [ "$count" -ne "${#wheels[@]}" ]; then
    echo "expected ${#wheels[@]} wheels in .whl/, found $count" >&2
    exit 1
fi
ls -l .whl
echo "total: $(du -cb .whl/*.whl | tail -1 | cut -f1) bytes in $count wheels (at most 64 MiB travel with the tree)"
