"""Kill-and-resume chaos (bench/chaos.py): `groupwise train` subprocesses SIGKILLed and resumed until done.

Invariants pinned, for every trial:
- the run finishes after its kills (the last `--resume` exits 0) with one metrics line per step 1..max_steps;
- `groupwise audit` exits 0: no prompt trained twice in an epoch, no dispatched prompt without a fate;
- no complete-looking checkpoint (COMPLETE manifest) fails to load, checked after every kill;
- the kills really happened: one at a random moment and one while a checkpoint was being written (slow tier: and
  one inside the first checkpoint write, after which ``--resume`` starts the run again from step 0);
- a process killed while pruning an old checkpoint leaves no complete-looking checkpoint that fails to load;
- (slow) a run on 2 learner ranks whose driver is SIGKILLed: every child of the killed driver (the rank processes)
  is gone within ``ORPHAN_LIMIT_S`` (5 s) of each kill, and the resumed run passes the same checks.

The CI tier runs one async `in_order` trial with 2 kills (~30 s on 2 cores); the slow tier runs every sampler and
the sync trainer with 3 kills each (`bench/chaos.py` runs the full 30-trial goal).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_modules import load_bench_module

REPO = Path(__file__).resolve().parents[1]


def load_chaos():
    return load_bench_module("chaos.py")


def check(result) -> None:
    details = f"{result} (logs beside the run directory)"
    assert result.final_exit == 0, details
    assert result.metrics_ok and result.steps > 0, details
    assert result.audit_exit == 0 and result.trained_twice == 0 and result.without_fate == 0, details
    assert result.bad_checkpoints == 0, details
    assert result.orphans == 0, details
    assert result.passed


def test_two_kills_then_resume_loses_and_repeats_nothing(tmp_path):
    chaos = load_chaos()
    result = chaos.run_trial(0, "async", "in_order", kills=2, workdir=tmp_path, max_steps=6)
    check(result)
    assert (result.kills_random, result.kills_in_write) == (1, 1), result
    assert result.lives == 3


def test_a_kill_while_pruning_leaves_no_broken_complete_checkpoint(tmp_path, monkeypatch):
    from groupwise.run import checkpoint

    for step in (1, 2):
        checkpoint.save_checkpoint(tmp_path, step, {"trainer": {"step": step}, "extra": {"a": [step]}}, keep_last=5)
    real_rmtree = checkpoint.shutil.rmtree

    def die_after_one_file(path, ignore_errors=False):  # deletes one file of the pruned step, then the process dies
        next(p for p in Path(path).rglob("*.json") if p.name != "COMPLETE").unlink()
        raise KeyboardInterrupt("killed while pruning")

    monkeypatch.setattr(checkpoint.shutil, "rmtree", die_after_one_file)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(tmp_path, 3, {"trainer": {"step": 3}}, keep_last=2)
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real_rmtree)
    complete = [path for _, path in checkpoint.list_checkpoints(tmp_path) if (path / "COMPLETE").is_file()]
    assert [p.name for p in complete] == ["step_2", "step_3"]
    for path in complete:
        checkpoint.load_checkpoint(path)
    assert checkpoint.latest_checkpoint(tmp_path).name == "step_3"


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "sampler"), [("async", "in_order"), ("async", "ready_first"),
                                               ("async", "windowed"), ("sync", "-")])  # fmt: skip
def test_three_kills_per_sampler_and_sync(tmp_path, mode, sampler):
    chaos = load_chaos()
    for index in range(2):
        result = chaos.run_trial(index, mode, sampler, kills=3, workdir=tmp_path, max_steps=12, first_write=index == 0)
        check(result)
        assert result.kills_first_write == (index == 0), result


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_killed_driver_takes_its_rank_processes_with_it(tmp_path, mode):
    chaos = load_chaos()
    sampler = "in_order" if mode == "async" else "-"
    result = chaos.run_trial(0, mode, sampler, kills=2, workdir=tmp_path, max_steps=4, ranks=2)
    check(result)
    assert result.kills_random + result.kills_in_write == 2, result
    assert result.children_killed_with >= 2 * 2, result  # each killed driver had its two ranks
    assert result.orphan_seconds < chaos.ORPHAN_LIMIT_S, result
