"""Write the guess-the-number dataset for the ``guess_number`` environment: ``examples/data/guess_number/*.jsonl``.

Each item is one game: the user turn says the range (1 to ``high``, ``high`` in 5..16) and the answer is the
secret. Every (high, secret) pair is made, shuffled with ``random.Random(0)``; the games of the ranges 1–7, 1–11
and 1–15 (33 games) are the held-out split, the rest the training split, so no held-out question is asked in
training. The ranges are small on purpose: four guesses that halve the range find any secret of a range up to
1–15 (and all but one of 1–16), so a model that reads the answers can solve almost every game, and a 135M model
that guesses blindly still wins often enough for the group to carry a signal from the first step.

    python examples/data/make_guess_number.py     # rewrites both files (deterministic)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

QUESTION = "I am thinking of a number from 1 to {high}. Guess it: reply with one number."
HIGHS = range(5, 17)
EVAL_HIGHS = (7, 11, 15)
SHUFFLE_SEED = 0
OUT_DIR = Path(__file__).resolve().parent / "guess_number"


def games() -> list[tuple[int, int]]:
    """Every (high, secret) pair, shuffled."""
    items = [(high, secret) for high in HIGHS for secret in range(1, high + 1)]
    random.Random(SHUFFLE_SEED).shuffle(items)
    return items


def record(high: int, secret: int) -> dict[str, object]:
    return {
        "id": f"guess/{high}/{secret}",
        "messages": [{"role": "user", "content": QUESTION.format(high=high)}],
        "answer": secret,
    }


def main() -> None:
    items = games()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    held_out = [game for game in items if game[0] in EVAL_HIGHS]
    training = [game for game in items if game[0] not in EVAL_HIGHS]
    for name, part in (("eval", held_out), ("train", training)):
        with open(OUT_DIR / f"{name}.jsonl", "w") as f:
            for high, secret in part:
                f.write(json.dumps(record(high, secret)) + "\n")
        print(f"{OUT_DIR / name}.jsonl: {len(part)} games")


if __name__ == "__main__":
    main()
