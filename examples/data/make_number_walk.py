"""Write the number-walk dataset for the ``number_walk`` environment: ``examples/data/number_walk/*.jsonl``.

Each item is one walk: the user turn says where the walk starts and where the goal is, the answer is the goal and
``start`` the starting number. Every walk from a start in 1..30 to a goal 2 or 3 steps up or down is made,
shuffled with ``random.Random(0)``; the walks from a start that is a multiple of 5 (24 walks) are the held-out
split, the rest the training split, so no held-out walk is asked in training. Ten moves reach every goal, and a
walker that steps up or down at random still reaches one 2 or 3 steps away in 55 or 34 % of the games (in 4.2 or
5.3 moves on average where it does), so a group carries a signal from the first step and the moves of a won walk
have room to fall to the distance.

    python examples/data/make_number_walk.py     # rewrites both files (deterministic)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from groupwise.environments.number_walk import choices

QUESTION = (
    "You are on {start} on the number line; the goal is {goal}. You have {moves} moves. Each move goes one step up "
    "or down: reply with the number you move to, {first} or {second}."
)
STARTS = range(1, 31)
DISTANCES = (2, 3)
MOVES = 10
SHUFFLE_SEED = 0
OUT_DIR = Path(__file__).resolve().parent / "number_walk"


def walks() -> list[tuple[int, int]]:
    """Every (start, goal) pair, shuffled."""
    items = [(start, start + sign * d) for start in STARTS for d in DISTANCES for sign in (1, -1)]
    random.Random(SHUFFLE_SEED).shuffle(items)
    return items


def record(start: int, goal: int) -> dict[str, object]:
    first, second = choices(start, goal, MOVES)
    question = QUESTION.format(start=start, goal=goal, moves=MOVES, first=first, second=second)
    return {
        "id": f"walk/{start}/{goal}",
        "messages": [{"role": "user", "content": question}],
        "answer": goal,
        "start": start,
    }


def main() -> None:
    items = walks()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    held_out = [walk for walk in items if walk[0] % 5 == 0]
    training = [walk for walk in items if walk[0] % 5 != 0]
    for name, part in (("eval", held_out), ("train", training)):
        with open(OUT_DIR / f"{name}.jsonl", "w") as f:
            for start, goal in part:
                f.write(json.dumps(record(start, goal)) + "\n")
        print(f"{OUT_DIR / name}.jsonl: {len(part)} walks")


if __name__ == "__main__":
    main()
