"""Synthetic Countdown: reach a target from a few numbers with ``+ - * /`` and parentheses.

Items are generated from ``random.Random(seed)``: draw ``num_numbers`` integers in
``1..max_number``, build a random expression over a random subset of at least two of them (each used
at most once), evaluate it exactly with ``Fraction`` and keep it when the value is an integer in
``1..max_target`` and the item is new. An item is identified by (sorted numbers, target); items are
unique, so the held-out split (the first ``num_eval`` items generated) and the train split (the
next ``num_train``) are disjoint. The generating expression is kept in ``metadata["solution"]``:
it is the item's demonstration and proves the item solvable.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction

from groupwise.types import Prompt

PROMPT_TEMPLATE = (
    "Using the numbers {numbers}, write an expression that equals {target}. "
    "Use each number at most once, with + - * / and parentheses. Answer with the expression only."
)
_OPERATORS = ("+", "-", "*", "/")


@dataclass(frozen=True)
class _Expr:
    """A rendered expression, its exact value and whether it is a bare number (needs no parentheses)."""

    text: str
    value: Fraction
    is_literal: bool


def _combine(lhs: _Expr, op: str, rhs: _Expr) -> _Expr | None:
    """``lhs op rhs``, or None on division by zero. Compound operands are parenthesised."""
    if op == "/" and rhs.value == 0:
        return None
    if op == "+":
        value = lhs.value + rhs.value
    elif op == "-":
        value = lhs.value - rhs.value
    elif op == "*":
        value = lhs.value * rhs.value
    else:
        value = lhs.value / rhs.value
    left = lhs.text if lhs.is_literal else f"({lhs.text})"
    right = rhs.text if rhs.is_literal else f"({rhs.text})"
    return _Expr(text=f"{left}{op}{right}", value=value, is_literal=False)


def random_expression(numbers: list[int], rng: random.Random) -> _Expr | None:
    """A random binary expression tree using every number of ``numbers`` once, in the given order."""
    if len(numbers) == 1:
        return _Expr(text=str(numbers[0]), value=Fraction(numbers[0]), is_literal=True)
    split = rng.randint(1, len(numbers) - 1)
    lhs = random_expression(numbers[:split], rng)
    rhs = random_expression(numbers[split:], rng)
    if lhs is None or rhs is None:
        return None
    return _combine(lhs, rng.choice(_OPERATORS), rhs)


class CountdownTask:
    """Countdown items as chat prompts; default reward ``countdown``."""

    name = "countdown"
    default_reward = "countdown"

    def __init__(
        self,
        num_numbers: int = 3,
        max_number: int = 20,
        max_target: int = 100,
        num_train: int = 2000,
        num_eval: int = 100,
        seed: int = 0,
    ) -> None:
        lower_bounds = {"num_numbers": (num_numbers, 2), "max_number": (max_number, 1),
                        "max_target": (max_target, 1), "num_train": (num_train, 1), "num_eval": (num_eval, 0)}
        for field, (value, low) in lower_bounds.items():
            if value < low:
                raise ValueError(f"countdown: {field}={value} must be >= {low}")
        self.num_numbers = num_numbers
        self.max_number = max_number
        self.max_target = max_target
        self.seed = seed
        items = self._generate(num_eval + num_train, random.Random(seed))
        self._eval_items = items[:num_eval]
        self._train_items = items[num_eval:]

    def _generate(self, count: int, rng: random.Random) -> list[tuple[list[int], int, str]]:
        """``count`` unique (numbers, target, solution) items; raises when the space is too small."""
        seen: set[tuple[tuple[int, ...], int]] = set()
        items: list[tuple[list[int], int, str]] = []
        max_attempts = 200 * count + 10_000
        for _ in range(max_attempts):
            if len(items) == count:
                return items
            numbers = [rng.randint(1, self.max_number) for _ in range(self.num_numbers)]
            used = rng.sample(numbers, rng.randint(2, self.num_numbers))
            expr = random_expression(used, rng)
            if expr is None or expr.value.denominator != 1 or not 1 <= expr.value <= self.max_target:
                continue
            target = int(expr.value)
            key = (tuple(sorted(numbers)), target)
            if key not in seen:
                seen.add(key)
                items.append((numbers, target, expr.text))
        if len(items) == count:
            return items
        raise ValueError(
            f"countdown: found only {len(items)} distinct items of the {count} asked for (num_train + num_eval) "
            f"with num_numbers={self.num_numbers}, max_number={self.max_number}, max_target={self.max_target}; "
            "lower num_train/num_eval or widen the ranges"
        )

    def train_prompts(self) -> list[Prompt]:
        return [self._prompt(item, "train") for item in self._train_items]

    def eval_prompts(self) -> list[Prompt]:
        return [self._prompt(item, "eval") for item in self._eval_items]

    def demonstration(self, prompt: Prompt) -> str:
        """One expression that reaches the target (the one the item was generated from)."""
        solution = prompt.metadata.get("solution")
        if not isinstance(solution, str):
            raise ValueError(f"countdown: prompt {prompt.uid} has no metadata['solution']; it is not from this task")
        return solution

    @staticmethod
    def _prompt(item: tuple[list[int], int, str], split: str) -> Prompt:
        numbers, target, solution = item
        content = PROMPT_TEMPLATE.format(numbers=numbers, target=target)
        return Prompt(
            uid=f"countdown/{split}/{','.join(map(str, numbers))}->{target}",
            answer=str(target),
            messages=({"role": "user", "content": content},),
            metadata={"numbers": list(numbers), "target": target, "solution": solution},
        )
