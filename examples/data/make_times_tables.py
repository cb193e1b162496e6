"""Write the times-tables chat dataset: ``examples/data/times_tables/{train,eval}.jsonl``.

Every product ``a * b`` with ``a, b`` in 2..20 and at least one factor at most 12 (297 ordered pairs:
``7 * 13`` and ``13 * 7`` are two items), asked as one user turn. The pairs are shuffled with
``random.Random(0)``; the first 100 are the held-out split, the other 197 the training split, so the splits
are disjoint. The answer is the product; ``a`` and ``b`` are kept as metadata.

    python examples/data/make_times_tables.py     # rewrites both files (deterministic)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

QUESTION = "What is {a} * {b}? Reply with only the number."
FACTORS = range(2, 21)
MAX_SMALLER_FACTOR = 12
NUM_EVAL = 100
SHUFFLE_SEED = 0
OUT_DIR = Path(__file__).resolve().parent / "times_tables"


def pairs() -> list[tuple[int, int]]:
    """The factor pairs in split order: shuffled, held-out first."""
    items = [(a, b) for a in FACTORS for b in FACTORS if min(a, b) <= MAX_SMALLER_FACTOR]
    random.Random(SHUFFLE_SEED).shuffle(items)
    return items


def record(a: int, b: int) -> dict[str, object]:
    return {
        "id": f"times/{a}x{b}",
        "messages": [{"role": "user", "content": QUESTION.format(a=a, b=b)}],
        "answer": a * b,
        "a": a,
        "b": b,
    }


def split_lines() -> dict[str, str]:
    """File name → its JSONL text."""
    items = pairs()
    splits = {"eval.jsonl": items[:NUM_EVAL], "train.jsonl": items[NUM_EVAL:]}
    return {name: "".join(json.dumps(record(a, b)) + "\n" for a, b in chosen) for name, chosen in splits.items()}


def main() -> None:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in split_lines().items():
        (OUT_DIR / name).write_text(text, encoding="utf-8")
        print(f"wrote {OUT_DIR / name} ({text.count(chr(10))} prompts)")


if __name__ == "__main__":
    main()
