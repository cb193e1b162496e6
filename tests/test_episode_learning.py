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

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


def won_in_the_fewest_moves(train_data: Path) -> float:
    """The share of a step's trained walks that reached the goal in as many moves as its distance."""
    rows = [json.loads(line) for line in train_data.read_text().splitlines() if line.strip()]
    straight = 0
    for row in rows:
        start, goal = (int(n) for n in row["prompt_uid"].split("/")[1:])  # "walk/<start>/<goal>"
        straight += row["raw_reward"] >= 1 and row["episode"]["turns"] == abs(goal - start)
    return straight / len(rows)


def test_guided_walk_reward_rises_and_won_walks_get_shorter(tmp_path):
    groupwise("train", "examples/number_walk_guided.yaml", f"run.output_dir={tmp_path}", "run.name=rl",
              "run.max_steps=6", "eval.every=0", "checkpoint.every=0", "model.device=cpu", *QUIET)  # fmt: skip
    rewards = [r["reward/unfiltered_mean"] for r in read_metrics(tmp_path / "rl" / "metrics.jsonl")
               if "reward/unfiltered_mean" in r]  # fmt: skip
    straight = [won_in_the_fewest_moves(tmp_path / "rl" / "train_data" / f"step_{step}.jsonl") for step in range(1, 7)]
    assert sum(rewards[-3:]) > sum(rewards[:3]), f"sampled reward should rise: {rewards}"
    assert sum(straight[-3:]) > sum(straight[:3]), f"walks won in the fewest moves should rise: {straight}"
