"""The default CPU thread setting (``groupwise.trainer.cpu_threads``).

Invariants pinned:
- an explicit ``OMP_NUM_THREADS`` always wins: the count is left as the user set it;
- without it, a CPU model under 5M parameters runs on one thread; a larger one, or a model on another device,
  keeps torch's default; the events.log line says which count is in effect and why;
- ``prepare_openmp_environment`` sets ``OMP_WAIT_POLICY=PASSIVE`` before torch is imported (libgomp reads it
  only then), keeps a wait policy or spin count the user set, and says when torch was loaded too early for it;
- the ``groupwise`` entry point does this before any command imports torch.
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from groupwise.model import build_tiny_model
from groupwise.trainer.cpu_threads import apply_cpu_threads, choose_threads, prepare_openmp_environment


def test_an_explicit_omp_num_threads_wins_for_any_model() -> None:
    for parameters in (10_000, 50_000_000):
        choice = choose_threads(parameters, "cpu", {"OMP_NUM_THREADS": "3"})
        assert choice.threads is None and choice.reason == "OMP_NUM_THREADS=3 from the environment"


def test_small_cpu_models_get_one_thread_and_large_ones_torch_default() -> None:
    small = choose_threads(1_060_000, "cpu", {})
    assert small.threads == 1 and small.reason == "a 1.1M-parameter model, under 5M: one thread"
    assert choose_threads(4_999_999, "cpu", {}).threads == 1
    large = choose_threads(5_000_000, "cpu", {})
    assert large.threads is None and "torch's default" in large.reason
    assert choose_threads(1_000, "cuda:0", {}).threads is None


def test_apply_sets_one_thread_for_a_tiny_model_unless_the_user_chose(monkeypatch) -> None:
    model = build_tiny_model(1, 32, 2, 64, 32, vocab_size=20, seed=0)
    monkeypatch.delenv("OMP_NUM_THREADS")
    torch.set_num_threads(2)  # conftest restores the session's count after the test
    line = apply_cpu_threads(model)
    assert torch.get_num_threads() == 1
    parameters = sum(p.numel() for p in model.parameters())
    assert line.startswith(f"cpu threads: 1 (a {parameters / 1e3:.0f}k-parameter model, under 5M: one thread); ")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    assert apply_cpu_threads(model).startswith("cpu threads: 2 (OMP_NUM_THREADS=2 from the environment)")
    assert torch.get_num_threads() == 2


def test_wait_policy_is_passive_unless_the_user_chose_one() -> None:
    env: dict[str, str] = {}
    note = prepare_openmp_environment(env)
    # torch is loaded in this test process, so the variable would come too late: say so, change nothing
    assert env == {} and "torch was loaded before groupwise could set OMP_WAIT_POLICY" in note
    user = {"GOMP_SPINCOUNT": "1000"}
    assert prepare_openmp_environment(user) == "GOMP_SPINCOUNT=1000 (from the environment)"
    assert user == {"GOMP_SPINCOUNT": "1000"}


def test_the_entry_point_sets_the_wait_policy_before_torch_loads() -> None:
    code = (
        "import os, sys\n"
        "from groupwise.cli.main import main\n"
        "assert 'torch' not in sys.modules\n"
        "main(['config', 'check', '--help'])\n"
        "assert os.environ['OMP_WAIT_POLICY'] == 'PASSIVE', os.environ.get('OMP_WAIT_POLICY')\n"
        "assert 'torch' not in sys.modules\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    kept = code.replace("== 'PASSIVE'", "== 'ACTIVE'")
    subprocess.run([sys.executable, "-c", kept], env=env, check=True, capture_output=True)
