"""Write the guess-the-number dataset for the ``guess_number`` environment: ``examples/data/guess_number/*.jsonl``.

Each item is one game: the user turn says the range (1 to ``high``, ``high`` in 8..32) and the answer is the
secret. Every (high, secret) pair is made, shuffled with ``random.Random(0)``; the first 60 are the held-out
split, the rest the training split, so no game is in both.

    python examples/data/make_guess_number.py     # rewrites both files (deterministic)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

QUESTION = "I am thinking of a number from 1 to {high}. Guess it: reply with one number."
HIGHS = range(8, 33)
NUM_EVAL = 60
SHUFFLE_SEED = 0
OUT_DIR = Path(__file__).resolve().parent / "guess_number"


def games() -> list[tuple[int, int]]:
    """Every (high, secret) pair in split order: shuffled, held-out first."""
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
    for name, part in (("eval", items[:NUM_EVAL]), ("train", items[NUM_EVAL:])):
        with open(OUT_DIR / f"{name}.jsonl", "w") as f:
            for high, secret in part:
                f.write(json.dumps(record(high, secret)) + "\n")
        print(f"{OUT_DIR / name}.jsonl: {len(part)} games")


if __name__ == "__main__":
    main()
