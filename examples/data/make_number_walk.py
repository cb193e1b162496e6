"""Write the number-walk dataset for the ``number_walk`` environment: ``examples/data/number_walk/*.jsonl``.

Each item is one walk: the user turn says where the walk starts and where the goal is, the answer is the goal and
``start`` the starting number. Every walk from a start in 1..30 to a goal 2 or 3 steps up or down is made,
shuffled with ``random.Random(0)``; the walks from a start that is a multiple of 5 (24 walks) are the held-out
split, the rest the training split, so no held-out walk is asked in training. Ten moves reach every goal, and a
walker that steps up or down at random still reaches one 2 or 3 steps away in 55 or 34 % of the games (in 4.2 or
5.3 moves on average where it does), so a group carries a signal from the first step and the moves of a won walk
have room to fall to the distance.

The guided walk (``examples/data/number_walk_guided/``, for ``number_walk`` with ``nearer_first``) asks the same
walks with 6 moves and the move toward the goal offered first, as the environment's answers offer it.

    python examples/data/make_number_walk.py     # rewrites all four files (deterministic)
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
SHUFFLE_SEED = 0
HERE = Path(__file__).resolve().parent
# (folder, moves per walk, whether the move toward the goal is offered first)
DATASETS = ((HERE / "number_walk", 10, False), (HERE / "number_walk_guided", 6, True))


def walks() -> list[tuple[int, int]]:
    """Every (start, goal) pair, shuffled."""
    items = [(start, start + sign * d) for start in STARTS for d in DISTANCES for sign in (1, -1)]
    random.Random(SHUFFLE_SEED).shuffle(items)
    return items


def record(start: int, goal: int, moves: int, nearer_first: bool) -> dict[str, object]:
    first, second = choices(start, goal, moves, nearer_first)
    question = QUESTION.format(start=start, goal=goal, moves=moves, first=first, second=second)
    return {
        "id": f"walk/{start}/{goal}",
        "messages": [{"role": "user", "content": question}],
        "answer": goal,
        "start": start,
    }


def main() -> None:
    items = walks()
    held_out = [walk for walk in items if walk[0] % 5 == 0]
    training = [walk for walk in items if walk[0] % 5 != 0]
    for out_dir, moves, nearer_first in DATASETS:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, part in (("eval", held_out), ("train", training)):
            with open(out_dir / f"{name}.jsonl", "w") as f:
                for start, goal in part:
                    f.write(json.dumps(record(start, goal, moves, nearer_first)) + "\n")
            print(f"{out_dir / name}.jsonl: {len(part)} walks")


if __name__ == "__main__":
    main()
