"""Write the three-digit multiplication dataset for the ``calculator`` environment: ``examples/data/multiplication``.

Products ``a * b`` with ``a, b`` in 100..999, drawn with ``random.Random(0)``: 100 held-out items, then 400
training items, no pair in both. A 135M model gets few of these right in its head; with the ``multiply`` tool it
needs one well-formed call and to copy the answer. Each item carries the well-formed first turn as its
``demonstration``, what the warm-start recipe trains on.

    python examples/data/make_multiplication.py     # rewrites both files (deterministic)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

QUESTION = "What is {a} * {b}? Use the multiply tool, then reply with only the number."
NUM_EVAL, NUM_TRAIN = 100, 400
OUT_DIR = Path(__file__).resolve().parent / "multiplication"


def pairs() -> list[tuple[int, int]]:
    """Distinct factor pairs in split order, held-out first."""
    rng = random.Random(0)
    seen: dict[tuple[int, int], None] = {}
    while len(seen) < NUM_EVAL + NUM_TRAIN:
        seen.setdefault((rng.randrange(100, 1000), rng.randrange(100, 1000)))
    return list(seen)


def record(a: int, b: int) -> dict[str, object]:
    """One item; ``demonstration`` is the first turn a warm start teaches (recipes/warm_start_calculator.yaml)."""
    call = {"name": "multiply", "arguments": {"a": a, "b": b}}
    return {
        "id": f"mul/{a}x{b}",
        "messages": [{"role": "user", "content": QUESTION.format(a=a, b=b)}],
        "answer": a * b,
        "demonstration": f"<tool_call>{json.dumps(call)}</tool_call>",
    }


def main() -> None:
    items = pairs()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name, part in (("eval", items[:NUM_EVAL]), ("train", items[NUM_EVAL:])):
        with open(OUT_DIR / f"{name}.jsonl", "w") as f:
            for a, b in part:
                f.write(json.dumps(record(a, b)) + "\n")
        print(f"{OUT_DIR / name}.jsonl: {len(part)} items")


if __name__ == "__main__":
    main()
