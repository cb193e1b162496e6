"""The step sizes derived from P (``groupwise.algo.step_size``), and one value of them everywhere.

Invariants pinned:
- the round size is ``ceil(P × batch_multiplier)`` of the product rounded to 9 decimals: P = 50 and m = 1.1 give 55
  (a bare ceiling of 55.000000000000007 gives 56), P = 25 and m = 1.12 give 28; with dynamic sampling off it is P;
- the step floor is ``max(1, ceil(P × min_step_batch_fraction))`` with the same guard: 10 × 0.3 gives 3, never 0 for
  a tiny fraction, and a fraction outside (0, 1] is refused;
- the real sync trainer, the simulated sync run and the config's derived value all generate the same number of
  prompts per round (P = 25, m = 1.12: 28, where the trainer used to take 29).
"""

from __future__ import annotations

import pytest
from test_sim_run import sim_config
from test_sync_trainer import run, tiny_config

from groupwise.algo.step_size import round_size, step_floor
from groupwise.run.metrics import read_metrics
from groupwise.sim.run import simulate


def test_round_size_is_not_pushed_up_by_float_noise():
    assert 50 * 1.1 > 55  # the float product this guards against
    assert round_size(50, 1.1, True) == 55
    assert round_size(25, 1.12, True) == 28  # 28.000000000000004 in floats
    assert round_size(16, 1.5, True) == 24
    assert round_size(10, 1.25, True) == 13  # a real fraction still rounds up
    assert round_size(10, 2.0, False) == 10  # dynamic sampling off: plain GRPO rounds of P


def test_step_floor_is_not_pushed_up_by_float_noise_and_never_zero():
    assert step_floor(10, 0.3) == 3
    assert step_floor(4, 0.5) == 2
    assert step_floor(5, 0.5) == 3
    assert step_floor(3, 0.01) == 1
    assert step_floor(16, 1e-12) == 1  # the 9-decimal rounding alone would give 0: an empty step
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=r"in \(0, 1\]"):
            step_floor(4, bad)


def rounds_of(metrics_path) -> list[float]:
    """Prompts generated per round, per trained step."""
    return [
        r["ds/groups_generated"] / r["ds/gen_rounds"] for r in read_metrics(metrics_path) if "ds/gen_rounds" in r
    ]


def test_trainer_simulator_and_config_take_the_same_round_size(tmp_path):
    ds = {"batch_multiplier": 1.12, "max_gen_rounds": 2}
    grpo = {"num_prompts_per_step": 25, "num_generations_per_prompt": 2, "dynamic_sampling": ds}
    cfg = tiny_config(tmp_path, run={"max_steps": 1}, grpo=grpo)
    assert cfg.prompts_per_generation_round == 28
    session = run(cfg)
    assert rounds_of(session.run_dir.path / "metrics.jsonl") == [28.0]
    sim = simulate(sim_config(tmp_path, "sim", mode="sync", run={"max_steps": 3}, grpo=grpo))
    assert rounds_of(sim.run_dir.path / "metrics.jsonl") == [28.0, 28.0, 28.0]
