"""The unfitted check against NeMo RL's published runs (``bench/sim_nemo_rl.py``; docs/simulator.md, "A check on
runs it was not fitted on").

Invariants pinned:
- the capped log-normal's mean is the closed form (the plain log-normal mean when the cap is far), and the median
  the bench solves for gives back the published mean;
- every predicted step time is the documented one within 2 % (the simulation is deterministic), so the table in
  the docs is the one the model gives; the dense run's speed-up has the published sign, the MoE run's does not.
"""

from __future__ import annotations

import math
import sys

import pytest
from bench_modules import REPO, load_bench_module

DOCUMENTED = {("Llama-3.1-8B", "sync"): 87.6, ("Llama-3.1-8B", "async"): 69.4,
              ("Qwen3-30B-A3B", "sync"): 153.0, ("Qwen3-30B-A3B", "async"): 117.6}  # fmt: skip


@pytest.fixture(scope="module")
def nemo():
    sys.path.insert(0, str(REPO / "bench"))  # the bench imports sim_calibration as the script does, from bench/
    try:
        yield load_bench_module("sim_nemo_rl.py")
    finally:
        sys.path.remove(str(REPO / "bench"))


def test_the_capped_mean_and_the_median_that_gives_it(nemo):
    sigma = 0.6
    assert nemo.truncated_mean(1000.0, sigma, 1e12) == pytest.approx(1000.0 * math.exp(sigma**2 / 2))
    assert nemo.truncated_mean(1000.0, sigma, 1.0) == pytest.approx(1.0, rel=1e-6)  # everything capped
    median = nemo.median_for_mean(3004.0, 3946.0)
    assert nemo.truncated_mean(median, nemo.lognormal_sigma(4.0), 3946.0) == pytest.approx(3004.0, rel=1e-6)


def test_the_documented_table_and_which_speed_up_has_the_right_sign(nemo):
    modes = ("sync", "async")
    seconds = {(case.name, mode): nemo.step_seconds(case, mode, 20) for case in nemo.CASES for mode in modes}
    for key, documented in DOCUMENTED.items():
        assert seconds[key] == pytest.approx(documented, rel=0.02), key
    llama, qwen = nemo.CASES
    assert llama.sync.step_s / llama.async_.step_s > 1
    assert seconds[llama.name, "sync"] / seconds[llama.name, "async"] > 1
    assert qwen.sync.step_s / qwen.async_.step_s < 1 < seconds[qwen.name, "sync"] / seconds[qwen.name, "async"]
