"""Write the three-digit multiplication dataset for the ``calculator`` environment: ``examples/data/multiplication``.

``train.jsonl`` and ``eval.jsonl`` are the RL splits; ``sft.jsonl`` is the warm start's (recipes/
warm_start_calculator.yaml): for each training item, its first turn (the user's question; demonstration: the
``multiply`` call) and its second (the question, that call and the tool's answer; demonstration: the product),
so the warm start teaches both halves of using the tool and RL starts from episodes that can end right.

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


def warm_start_records(a: int, b: int) -> list[dict[str, object]]:
    """The item's two turns as demonstrations: the call, then (after the tool's answer) the product."""
    first = record(a, b)
    call = str(first["demonstration"])
    second = {
        "id": f"mul/{a}x{b}/answer",
        "messages": [*first["messages"], {"role": "assistant", "content": call},  # type: ignore[list-item]
                     {"role": "tool", "content": str(a * b)}],
        "answer": a * b,
        "demonstration": str(a * b),
    }  # fmt: skip
    return [first, second]


def main() -> None:
    items = pairs()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    splits = {"eval": [record(a, b) for a, b in items[:NUM_EVAL]],
              "train": [record(a, b) for a, b in items[NUM_EVAL:]],
              "sft": [r for a, b in items[NUM_EVAL:] for r in warm_start_records(a, b)]}  # fmt: skip
    for name, records in splits.items():
        with open(OUT_DIR / f"{name}.jsonl", "w") as f:
            for item in records:
                f.write(json.dumps(item) + "\n")
        print(f"{OUT_DIR / name}.jsonl: {len(records)} items")


if __name__ == "__main__":
    main()
