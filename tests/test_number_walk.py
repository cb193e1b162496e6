"""The shipped ``number_walk`` environment and its data: a walk to the goal, one step per turn.

Invariants pinned:
- a turn moves to the reply's last number when that is a neighbour of the position, else by its last ``up`` or
  ``down``; a reply with neither uses a move and stays put, and the answer says how to reply;
- reaching the goal ends the episode with ``1 + bonus × moves left``; running out of moves ends it with nothing;
- with ``progress_reward`` r each move pays r × the distance it gained (−r away, 0 for no move): a won walk gets
  r × its distance whatever its path, lost walks that moved differently get different rewards, and an r at which a
  lost walk could count as solved (r × distance ≥ 1) is refused, as is r < 0;
- a walker that always steps toward the goal wins every walk in ``|goal − start|`` moves, and each step away costs
  two more: the moves a solved walk takes measure how well the policy walks, whatever share it solves;
- the two numbers offered are in an order that does not tell which is nearer (the nearer first in about half of
  the states) and is the same in another process (a replayed episode reads the same answers);
- the data: every walk 2 or 3 steps, the held-out walks (starts that are multiples of 5) never in training, each
  opening offering the numbers the environment would offer, and a random walker's chance of winning what the
  data's docstring says (45 % and 22 %), computed exactly;
- with ``nearer_first`` the move toward the goal is always offered first, so a policy that takes the first number
  offered (in the opening and in every answer) wins every walk in ``|goal − start|`` moves, and a reply that moves
  nothing costs exactly one move; the guided data asks the same walks, split the same way, each opening offering
  the nearer move first within 6 moves;
- the name ``number_walk`` is a built-in environment, and a prompt without ``start`` is refused by name.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from groupwise.config.episode_schema import BUILTIN_ENVIRONMENTS
from groupwise.environments.number_walk import NumberWalkEnvironment, choices, next_move
from groupwise.episodes.environment import StepResult
from groupwise.types import Prompt

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "examples" / "data" / "number_walk"
GUIDED_DATA = ROOT / "examples" / "data" / "number_walk_guided"


def walk(start: int, goal: int) -> Prompt:
    return Prompt(uid=f"walk/{start}/{goal}", answer=str(goal), text="walk", metadata={"start": start})


def reply(env: NumberWalkEnvironment, text: str) -> StepResult:
    return env.step({"role": "assistant", "content": text})


@pytest.mark.parametrize(
    "text, position, move",
    [("16", 15, 1), ("I'm on the 14.", 15, -1), ("Up (to 11", 10, 1), ("down", 10, -1), ("UP, then down", 3, -1),
     ("I'm on 15", 15, 0), ("20 is too far, so up", 15, 1), ("The best way to solve this", 4, 0), ("-1", 0, -1)],
)  # fmt: skip
def test_a_turn_moves_to_a_neighbour_number_else_by_up_or_down(text, position, move):
    assert next_move(text, position) == move


def test_the_goal_pays_the_moves_left_and_running_out_pays_nothing():
    env = NumberWalkEnvironment(max_moves=4, bonus=0.2)
    env.reset(walk(5, 7), 0)
    first = reply(env, "6")
    assert not first.done and first.reward == 0.0
    [message] = first.messages
    assert message["role"] == "user" and message["content"].startswith("You are on 6; the goal is 7. 3 moves left.")
    low_high = choices(6, 7, 3)
    assert message["content"].endswith(f"Move to {low_high[0]} or {low_high[1]}?") and sorted(low_high) == [5, 7]
    done = reply(env, "7")
    assert done.done and not done.messages and done.reward == pytest.approx(1.0 + 0.2 * 2)
    assert done.info == {"solved": 1}

    env.reset(walk(5, 7), 1)
    stay = reply(env, "no idea")
    assert env.position == 5 and stay.messages[0]["content"].startswith("Reply with the number you move to.")
    assert [reply(env, "down").done for _ in range(3)] == [False, False, True]
    assert env.position == 2 and env.moves == 4
    env.reset(walk(5, 7), 2)
    assert (env.position, env.moves) == (5, 0)  # a reset starts the walk again


def play(env: NumberWalkEnvironment, start: int, goal: int, toward: list[bool]) -> tuple[float, int]:
    """Walk with one step toward (True) or away from (False) the goal per move: (the episode's reward, which is the
    sum of its turns' rewards, and the moves used)."""
    env.reset(walk(start, goal), 0)
    total = 0.0
    for index, right in enumerate(toward):
        direction = 1 if (goal > env.position) == right else -1
        result = reply(env, str(env.position + direction))
        total += result.reward
        if result.done:
            return total, index + 1
    raise AssertionError("the walk did not end")


@pytest.mark.parametrize("start, goal", [(5, 8), (5, 2), (1, -2), (30, 32)])
def test_each_step_away_costs_two_moves(start, goal):
    env = NumberWalkEnvironment(max_moves=6, bonus=0.2)
    distance = abs(goal - start)
    assert play(env, start, goal, [True] * 6) == (pytest.approx(1.0 + 0.2 * (6 - distance)), distance)
    _, moves = play(env, start, goal, [False] + [True] * 5)
    assert moves == distance + 2
    assert play(env, start, goal, [False] * 6) == (0.0, 6)


@pytest.mark.parametrize("start, goal", [(5, 8), (5, 2)])
def test_the_progress_reward_pays_the_distance_gained_so_lost_walks_differ_and_won_ones_keep_their_ranking(start, goal):
    env = NumberWalkEnvironment(max_moves=6, bonus=0.2, progress_reward=0.1)
    distance = abs(goal - start)
    straight, _ = play(env, start, goal, [True] * 6)
    detour, _ = play(env, start, goal, [False] + [True] * 5)
    assert straight == pytest.approx(1.0 + 0.2 * (6 - distance) + 0.1 * distance)
    assert detour == pytest.approx(1.0 + 0.2 * (6 - distance - 2) + 0.1 * distance)  # the path does not matter
    lost_away, moves = play(env, start, goal, [False] * 6)
    assert (lost_away, moves) == (pytest.approx(-0.6), 6)
    lost_both = play(env, start, goal, [True, False] * 3)[0]
    assert lost_both == pytest.approx(0.0) and lost_both > lost_away  # two lost walks, two rewards: a signal
    env.reset(walk(start, goal), 0)
    toward = 1 if goal > start else -1
    steps = [reply(env, text) for text in ("no idea", str(start + toward), str(start))]
    assert [s.reward for s in steps] == [0.0, pytest.approx(0.1), pytest.approx(-0.1)]


def test_a_progress_reward_that_could_make_a_lost_walk_count_as_solved_is_refused():
    with pytest.raises(ValueError, match="progress_reward must be ≥ 0"):
        NumberWalkEnvironment(progress_reward=-0.1)
    env = NumberWalkEnvironment(max_moves=10, progress_reward=0.4)
    env.reset(walk(5, 7), 0)  # 0.4 × 2 < 1: a lost walk stays below the solved reward
    with pytest.raises(ValueError, match=r"progress_reward 0.4 × distance 3 ≥ 1"):
        env.reset(walk(5, 8), 0)


def test_the_order_offered_does_not_tell_which_is_nearer_and_is_the_same_in_another_process():
    states = [(position, goal, left) for position in range(-5, 40) for goal in range(-5, 40) if goal != position
              for left in range(1, 7)]  # fmt: skip
    nearer_first = sum(abs(choices(*state)[0] - state[1]) < abs(choices(*state)[1] - state[1]) for state in states)
    assert 0.45 < nearer_first / len(states) < 0.55
    sample = states[::97]
    code = "import json, sys; from groupwise.environments.number_walk import choices; " \
           "print(json.dumps([choices(*s) for s in json.loads(sys.argv[1])]))"  # fmt: skip
    other = subprocess.run([sys.executable, "-c", code, json.dumps(sample)], capture_output=True, text=True, check=True)
    assert json.loads(other.stdout) == [list(choices(*state)) for state in sample]


def random_walk_wins(distance: int, moves: int) -> Fraction:
    """The exact chance that a walker stepping up or down with probability ½ each reaches ``+distance``."""
    alive = {0: Fraction(1)}
    won = Fraction(0)
    for _ in range(moves):
        after: dict[int, Fraction] = {}
        for position, chance in alive.items():
            for step in (1, -1):
                if position + step == distance:
                    won += chance / 2
                else:
                    after[position + step] = after.get(position + step, Fraction(0)) + chance / 2
        alive = after
    return won


def test_the_data_holds_out_whole_starts_and_offers_what_the_environment_offers():
    splits = {name: read_split(DATA, name) for name in ("train", "eval")}
    assert (len(splits["train"]), len(splits["eval"])) == (96, 24)
    assert {r["start"] % 5 == 0 for r in splits["eval"]} == {True}
    assert {r["start"] % 5 == 0 for r in splits["train"]} == {False}
    for record in splits["train"] + splits["eval"]:
        assert abs(record["answer"] - record["start"]) in (2, 3)
        first, second = choices(record["start"], record["answer"], 10)
        assert record["messages"][0]["content"].endswith(f"reply with the number you move to, {first} or {second}.")
    assert round(float(random_walk_wins(2, 10)), 2) == 0.55 and round(float(random_walk_wins(3, 10)), 2) == 0.34


def test_number_walk_is_built_in_and_needs_a_start():
    assert BUILTIN_ENVIRONMENTS["number_walk"] == "groupwise.environments.number_walk:NumberWalkEnvironment"
    with pytest.raises(ValueError, match="has no 'start' field"):
        NumberWalkEnvironment().reset(Prompt(uid="w", answer="3", text="walk"), 0)
    with pytest.raises(ValueError, match="max_moves must be"):
        NumberWalkEnvironment(max_moves=0)


def read_split(folder: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (folder / f"{name}.jsonl").read_text().splitlines()]


def walk_prompt(record: dict) -> Prompt:
    return Prompt(uid=record["id"], answer=str(record["answer"]), messages=tuple(record["messages"]),
                  metadata={"start": record["start"]})  # fmt: skip


def play_first_offered(record: dict, stand_still_turns: int) -> tuple[int, float]:
    """Play a guided walk replying with its own position for ``stand_still_turns`` turns, then always with the first
    number offered; return the moves used and the reward."""
    env = NumberWalkEnvironment(max_moves=6, bonus=0.2, nearer_first=True)
    text = env.reset(walk_prompt(record), 0)[0]["content"]
    for moves in range(1, 7):
        offered = [int(n) for n in re.findall(r"-?\d+", text)[-2:]]  # "... to 14 or 16." / "Move to 14 or 16?"
        answer = str(env.position) if moves <= stand_still_turns else str(offered[0])
        result = reply(env, answer)
        if result.done:
            return moves, result.reward
        text = result.messages[0]["content"]
    raise AssertionError("the walk did not end within its moves")


def test_nearer_first_offers_the_move_toward_the_goal_and_taking_it_wins_in_the_distance():
    for position in range(-5, 40):
        for goal in (position - 3, position - 1, position + 2):
            first, second = choices(position, goal, 4, nearer_first=True)
            assert abs(goal - first) < abs(goal - second) and {first, second} == {position - 1, position + 1}
    for record in read_split(GUIDED_DATA, "eval"):
        distance = abs(record["answer"] - record["start"])
        for stand_still in (0, 1):
            moves, reward = play_first_offered(record, stand_still_turns=stand_still)
            assert (moves, reward) == (distance + stand_still, pytest.approx(1 + 0.2 * (6 - distance - stand_still)))


def test_the_guided_data_is_the_same_walks_with_the_nearer_move_offered_first():
    for name in ("train", "eval"):
        guided, plain = read_split(GUIDED_DATA, name), read_split(DATA, name)
        assert [r["id"] for r in guided] == [r["id"] for r in plain]
        for record in guided:
            first, second = choices(record["start"], record["answer"], 6, nearer_first=True)
            assert "You have 6 moves." in record["messages"][0]["content"]
            assert record["messages"][0]["content"].endswith(f"you move to, {first} or {second}.")
