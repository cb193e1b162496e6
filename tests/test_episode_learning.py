"""(slow) SmolLM2-135M-Instruct learns from multi-turn episodes on this CPU: calculator and guess-the-number.

Invariants pinned (slow tier, ``make test-slow``; each run is its example's own settings, fewer steps):
- the calculator tool (``recipes/warm_start_calculator.yaml`` then ``examples/calculator.yaml``, 4 RL steps):
  held-out greedy accuracy gains at least 25 points over the warm start's, and the trained episodes call the tool
  more at the last step than at the first.
- guess-the-number (``examples/guess_number.yaml``, 6 steps, evaluated at steps 0 and 6): held-out greedy accuracy
  rises, and the sampled episodes' mean reward over the last three steps is above the first three's.
- the guided number walk (``examples/number_walk_guided.yaml``, 6 steps): the sampled episodes' mean reward over
  the last three steps is above the first three's, and so is the share of trained walks won in the fewest moves
  (unlike the moves per won walk, a share of all walks: longer walks joining the won ones cannot lower it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from bench_modules import load_bench_module

from groupwise.run.metrics import read_metrics

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
GROUPWISE = [sys.executable, "-m", "groupwise.cli"]
QUIET = ["logging.progress=false", "logging.tensorboard=false"]


def groupwise(*args: str) -> None:
    subprocess.run([*GROUPWISE, *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def test_calculator_tool_use_gains_25_points_over_the_warm_start(tmp_path):
    groupwise("sft", "recipes/warm_start_calculator.yaml", f"run.output_dir={tmp_path}", "run.name=warm")
    warm = [r["eval/accuracy"] for r in read_metrics(tmp_path / "warm" / "metrics.jsonl") if "eval/accuracy" in r]
    groupwise("train", "examples/calculator.yaml", "model.source=hf", f"model.path={tmp_path / 'warm' / 'final'}",
              f"run.output_dir={tmp_path}", "run.name=rl", "run.max_steps=4", "model.device=cpu", *QUIET)  # fmt: skip
    records = read_metrics(tmp_path / "rl" / "metrics.jsonl")
    accuracy = [r["eval/accuracy"] for r in records if "eval/accuracy" in r]
    calls = [r["episode/tool_calls_mean"] for r in records if "episode/tool_calls_mean" in r]
    assert max(accuracy) >= warm[-1] + 0.25, f"held-out accuracy {accuracy} after a warm start at {warm[-1]}"
    assert calls[-1] > calls[0], f"tool calls per episode should rise: {calls}"


def test_guess_number_reward_rises(tmp_path):
    groupwise("train", "examples/guess_number.yaml", f"run.output_dir={tmp_path}", "run.name=rl", "run.max_steps=6",
              "eval.every=6", "model.device=cpu", *QUIET)  # fmt: skip
    records = read_metrics(tmp_path / "rl" / "metrics.jsonl")
    accuracy = [r["eval/accuracy"] for r in records if "eval/accuracy" in r]
    rewards = [r["reward/unfiltered_mean"] for r in records if "reward/unfiltered_mean" in r]
    assert accuracy[-1] > accuracy[0], f"held-out accuracy should rise: {accuracy}"
    assert sum(rewards[-3:]) > sum(rewards[:3]), f"sampled reward should rise: {rewards}"


def won_in_the_fewest_moves(run_dir: Path) -> list[float]:
    """Per step, the share of its trained walks that reached the goal in as many moves as their distance, from
    ``bench/guess_number.py``'s reading of ``train_data``."""
    steps = load_bench_module("guess_number.py").trained_games(run_dir)
    return [sum(reward >= 1 and turns == fewest for _, reward, turns, fewest in steps[step]) / len(steps[step])
            for step in sorted(steps)]  # fmt: skip


def test_guided_walk_reward_rises_and_won_walks_get_shorter(tmp_path):
    groupwise("train", "examples/number_walk_guided.yaml", f"run.output_dir={tmp_path}", "run.name=rl",
              "run.max_steps=6", "eval.every=0", "checkpoint.every=0", "model.device=cpu", *QUIET)  # fmt: skip
    rewards = [r["reward/unfiltered_mean"] for r in read_metrics(tmp_path / "rl" / "metrics.jsonl")
               if "reward/unfiltered_mean" in r]  # fmt: skip
    straight = won_in_the_fewest_moves(tmp_path / "rl")
    assert len(straight) == 6, f"one share per trained step: {straight}"
    assert sum(rewards[-3:]) > sum(rewards[:3]), f"sampled reward should rise: {rewards}"
    assert sum(straight[-3:]) > sum(straight[:3]), f"walks won in the fewest moves should rise: {straight}"
