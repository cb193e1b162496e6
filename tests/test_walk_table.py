"""``bench/guess_number.py`` reads a number-walk run so that a policy that plays badly cannot look good.

Invariants pinned, on run directories written here (``train_data`` rows and ``metrics.jsonl`` as a run writes them):
- a walker that always moves up: every move counted as up, every walk up won and every walk down lost, so its
  falling moves per won walk show beside a one-way policy;
- a walker that opens each walk with a reply that moves nothing and then walks straight: no first reply moved, no
  walk won in the fewest moves, each won walk one move longer than its distance;
- the reward of every generated game is read from ``reward/unfiltered_mean`` (filtered groups included), beside
  the trained games' own mean.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench_modules import load_bench_module

from groupwise.environments.number_walk import NumberWalkEnvironment
from groupwise.types import Prompt

TABLE = load_bench_module("guess_number.py")
WALKS = [(5, 7), (10, 13), (20, 18), (9, 6)]  # two up, two down


def play(start: int, goal: int, replies) -> dict:
    """A ``train_data`` row of one walk played through ``number_walk``, replying ``replies(turn, position, goal)``."""
    env = NumberWalkEnvironment(max_moves=6, bonus=0.2)
    env.reset(Prompt(uid=f"walk/{start}/{goal}", answer=str(goal), text="walk", metadata={"start": start}), 0)
    assistant, reward = [], 0.0
    for turn in range(6):
        assistant.append(replies(turn, env.position, goal))
        result = env.step({"role": "assistant", "content": assistant[-1]})
        reward += result.reward
        if result.done:
            break
    return {"prompt_uid": f"walk/{start}/{goal}", "raw_reward": reward, "episode": {"assistant": assistant}}


def write_run(root: Path, replies, unfiltered: float | None) -> Path:
    (root / "train_data").mkdir(parents=True)
    rows = [play(start, goal, replies) for start, goal in WALKS]
    (root / "train_data" / "step_1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = {"step": 1} if unfiltered is None else {"step": 1, "reward/unfiltered_mean": unfiltered}
    (root / "metrics.jsonl").write_text(json.dumps(metrics) + "\n")
    return root


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_a_walker_that_always_moves_up_wins_the_walks_up_and_loses_the_walks_down(tmp_path):
    run = write_run(tmp_path / "up", lambda turn, position, goal: f"I'm on {position + 1}.", unfiltered=0.35)
    [row] = TABLE.walk_table(TABLE.walk_turns(run), window=4)[2:]
    _, turns, moved, toward, up, won_up, won_down, first_moved = cells(row)
    assert (turns, moved, up, won_up, won_down, first_moved) == ("17", "1.00", "1.00", "1.00", "0.00", "1.00")
    assert toward == f"{5 / 17:.2f}"  # the 2 + 3 moves of the walks up; the 6 + 6 of the walks down go away
    [games] = TABLE.window_table(TABLE.trained_games(run), TABLE.unfiltered_rewards(run), window=4)[2:]
    _, n, every_game, trained, solved, fewest, _, per_solved, *_ = cells(games)
    assert (n, every_game, solved, fewest, per_solved) == ("4", "0.35", "0.50", "0.50", "2.50")
    assert trained == f"{(1 + 0.2 * 4 + 1 + 0.2 * 3) / 4:.2f}"


def test_a_walker_whose_first_reply_moves_nothing_wins_nothing_in_the_fewest_moves(tmp_path):
    def replies(turn: int, position: int, goal: int) -> str:
        return f"I'm on the {position if turn == 0 else position + (1 if goal > position else -1)}."

    run = write_run(tmp_path / "opens", replies, unfiltered=None)
    [row] = TABLE.walk_table(TABLE.walk_turns(run), window=4)[2:]
    _, _, _, toward, _, won_up, won_down, first_moved = cells(row)
    assert (toward, won_up, won_down, first_moved) == ("1.00", "1.00", "1.00", "0.00")
    [games] = TABLE.window_table(TABLE.trained_games(run), TABLE.unfiltered_rewards(run), window=4)[2:]
    _, _, every_game, _, solved, fewest, _, per_solved, *_ = cells(games)
    assert (every_game, solved, fewest) == ("–", "1.00", "0.00")
    assert per_solved == f"{(3 + 4 + 3 + 4) / 4:.2f}"  # each walk its distance plus the opening reply
