"""The times-tables chat dataset of the SmolLM2 example (examples/data/times_tables/).

Invariants pinned:
- the committed files are exactly what examples/data/make_times_tables.py writes (regenerating changes nothing);
- the held-out and training splits are disjoint, 100 and 197 items, together every pair a, b in 2..20 with a
  factor at most 12, each asked once;
- every item is one user turn asking for a * b with the product as its answer, and loads as a jsonl task whose
  final_number reward gives 1 to the reply "a * b = product" and 0 to a wrong product.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from groupwise.data.jsonl_dataset import JsonlTask
from groupwise.data.rewards import final_number
from groupwise.types import Completion

DATA_DIR = Path(__file__).resolve().parent.parent / "examples" / "data"
SCRIPT = DATA_DIR / "make_times_tables.py"


def load_script():
    spec = importlib.util.spec_from_file_location("make_times_tables", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def task() -> JsonlTask:
    return JsonlTask(DATA_DIR / "times_tables" / "train.jsonl", DATA_DIR / "times_tables" / "eval.jsonl")


def test_committed_files_are_what_the_script_writes():
    for name, text in load_script().split_lines().items():
        assert (DATA_DIR / "times_tables" / name).read_text(encoding="utf-8") == text, f"regenerate {name}"


def test_splits_are_disjoint_and_cover_every_pair_once():
    data = task()
    train = [(p.metadata["a"], p.metadata["b"]) for p in data.train_prompts()]
    held_out = [(p.metadata["a"], p.metadata["b"]) for p in data.eval_prompts()]
    assert (len(held_out), len(train)) == (100, 197)
    assert not set(train) & set(held_out)
    expected = {(a, b) for a in range(2, 21) for b in range(2, 21) if min(a, b) <= 12}
    assert sorted(train + held_out) == sorted(expected)


def test_every_item_asks_for_its_product_and_the_reward_checks_it():
    data = task()
    for prompt in data.train_prompts() + data.eval_prompts():
        a, b = prompt.metadata["a"], prompt.metadata["b"]
        assert prompt.answer == str(a * b)
        (turn,) = prompt.messages or ()
        assert turn["role"] == "user"
        assert re.fullmatch(rf"What is {a} \* {b}\? Reply with only the number\.", turn["content"])
        right = Completion(token_ids=(), logprobs=(), text=f"{a} * {b} = {a * b}", finish_reason="stop",
                           weight_version=0)
        wrong = Completion(token_ids=(), logprobs=(), text=f"{a} * {b} = {a * b + 1}", finish_reason="stop",
                           weight_version=0)
        assert (final_number(prompt, right), final_number(prompt, wrong)) == (1.0, 0.0)
