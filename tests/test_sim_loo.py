"""The leave-one-out fit of ``bench/sim_loo.py`` (docs/simulator.md, "Leave-one-out").

Invariants pinned:
- the sync training fit recovers the network bandwidth and colocated MFU that made the training times it is
  given (training = compute ÷ MFU + 16 updates at the bandwidth), to the grid's resolution;
- the golden-section search finds the minimum of a unimodal loss.
"""

from __future__ import annotations

import sys

import pytest
from bench_modules import REPO, load_bench_module


@pytest.fixture(scope="module")
def loo():
    sys.path.insert(0, str(REPO / "bench"))  # sim_loo imports sim_calibration as the script does, from bench/
    try:
        yield load_bench_module("sim_loo.py")
    finally:
        sys.path.remove(str(REPO / "bench"))


def test_the_sync_training_fit_recovers_the_constants_that_made_the_times(loo, monkeypatch):
    network, mfu = loo.BANDWIDTHS[12], 0.45  # 15.7 GB/s
    compute = {32: 200.0, 64: 100.0, 128: 50.0}
    made = {g: (0.0, 0.0, compute[g] / mfu + loo.updates(g, network)) for g in compute}
    monkeypatch.setattr(loo, "SYNC", made)
    fitted_network, fitted_mfu = loo.fit_sync_training(compute, [32, 64, 128])
    assert fitted_network == pytest.approx(network) and fitted_mfu == pytest.approx(mfu, rel=1e-3)


def test_golden_section_finds_the_minimum(loo):
    assert loo.golden(lambda x: (x - 0.3) ** 2, 0.0, 1.0, 60) == pytest.approx(0.3, abs=1e-6)
