"""What a plan recommends and how sure it is (docs/simulator.md, "groupwise plan").

Invariants pinned:
- the error band is the root-mean-square log error of the calibration's speed-ups, and a speed-up S reads as
  S·e^(±r);
- a setting is starred only when its mode beats the other mode's best by more than the band; within the band
  nothing is starred and the verdict says the model cannot tell; within a mode the fastest is starred, near-ties
  (1 %) broken by the smaller wasted share;
- the verdict sentence names the setting, its speed-up over sync and the band's half-width;
- a GPU, a model size or a mixture-of-experts model outside the calibration is warned about; lengths not read from
  a run are said to be assumed.
"""

from __future__ import annotations

import math

import pytest

from groupwise.config.job_schema import JobSection
from groupwise.sim.plan import PlanPoint, PlanRow
from groupwise.sim.plan_verdict import (
    VERL_H20,
    calibration_warnings,
    error_band,
    half_width,
    lengths_note,
    star,
    verdict,  # fmt: skip
)

SYNC = PlanPoint("sync", 32, 32)


def row(speedup: float, waste: float = 0.0, window: int = 2, mode: str = "async", best: bool = False) -> PlanRow:
    point = SYNC if mode == "sync" else PlanPoint("async", 24, 8, "ready_first", window, "continue")
    return PlanRow(point, speedup=speedup, waste_fraction=waste, best=best)


def test_the_band_is_the_rms_log_error_of_the_calibration():
    assert error_band([math.log(2.0), -math.log(2.0)]) == pytest.approx(math.log(2.0))
    assert half_width(2.0, math.log(2.0)) == pytest.approx(2.0 * (2.0 - 0.5) / 2)
    assert error_band(VERL_H20.speedup_log_errors) == pytest.approx(0.670, abs=0.001)


def test_a_star_only_when_one_mode_beats_the_other_by_more_than_the_band():
    sync, fast, slower = row(1.0, mode="sync"), row(2.1), row(1.8, window=1)
    assert star([sync, fast, slower], band=0.5) is fast  # 2.1 > e^0.5 = 1.65
    assert star([sync, fast, slower], band=0.8) is None  # 2.1 < e^0.8 = 2.23: cannot tell
    assert star([sync, row(0.5)], band=0.5) is sync
    assert star([sync, row(0.8)], band=0.5) is None


def test_near_ties_within_a_mode_go_to_the_smaller_waste():
    sync, wasteful, frugal = row(1.0, mode="sync"), row(2.100, waste=0.2), row(2.095, waste=0.0, window=1)
    assert star([sync, wasteful, frugal], band=0.3) is frugal
    assert star([sync, wasteful, row(1.9, waste=0.0, window=1)], band=0.3) is wasteful  # not a tie


def test_the_verdict_sentence():
    band = math.log(1.15)
    rows = [row(1.0, mode="sync"), row(2.1, best=True)]
    assert verdict(rows, band) == "async ready_first, staleness 2, partial continue, split 24:8: 2.10× sync, ± 0.29×."
    unsure = verdict([row(1.0, mode="sync"), row(1.1)], band)
    assert unsure.startswith("no recommendation: the fastest async setting") and "cannot tell" in unsure
    assert verdict([row(1.0, mode="sync", best=True), row(0.5)], band).startswith("sync, colocated: the fastest")
    tied = verdict([row(1.0, mode="sync"), row(1.101, waste=0.2), row(1.1, waste=0.0, window=1)], band)
    assert "(async ready_first, staleness 1," in tied  # the near-tie with less waste is named


def job(gpu: str = "H20", params: float = 7.6e9, active: float | None = None) -> JobSection:
    return JobSection.model_validate({
        "model": {"params": params, "active_params": active, "layers": 28, "hidden": 3584, "kv_heads": 4,
                  "head_dim": 128},
        "cluster": {"gpu": gpu, "rollout_gpus": 8, "train_gpus": 8, "tensor_parallel": 4},
    })  # fmt: skip


def test_what_lies_outside_the_calibration_is_warned_about():
    assert calibration_warnings(job()) == []
    (gpu,) = calibration_warnings(job(gpu="H100"))
    assert "H100 is outside the calibrated GPUs (H20)" in gpu
    (size,) = calibration_warnings(job(params=1.5e9))
    assert "1.5B-parameter model is outside the calibrated sizes (7.6B" in size
    (moe,) = calibration_warnings(job(params=30e9, active=3e9))
    assert "mixture-of-experts" in moe


def test_lengths_not_read_from_a_run_are_said_to_be_assumed():
    assert lengths_note(job(), None).startswith("Lengths: assumed, not measured (median 1,000 tokens")
    assert lengths_note(job(), "runs/x").startswith("Lengths: median and drift read from runs/x")
