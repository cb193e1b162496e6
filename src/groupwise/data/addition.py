"""Synthetic addition: prompt ``"{a}+{b}="``, answer ``str(a + b)``.

All operand pairs whose digit counts lie in ``min_digits..max_digits`` are enumerated (1-digit
numbers include 0), shuffled with ``random.Random(seed)``; the first ``num_eval`` pairs are held
out and the train split is the rest, capped at ``num_train``. The splits are disjoint by
construction, and the held-out split does not depend on ``num_train``.

``num_train`` and ``num_eval`` are caps. The space is tiny for 1-digit operands (100 pairs), so the
held-out split never takes more than ``MAX_EVAL_FRACTION`` of the pairs: with 1-digit operands at
most 20 pairs are held out and at least 80 remain for training, whatever ``num_eval`` says.
"""

from __future__ import annotations

import random

from groupwise.types import Prompt

MAX_EVAL_FRACTION = 0.2


def operands_with_digits(min_digits: int, max_digits: int) -> range:
    """Every non-negative integer with ``min_digits..max_digits`` decimal digits (0 counts as 1 digit)."""
    low = 0 if min_digits == 1 else 10 ** (min_digits - 1)
    return range(low, 10**max_digits)


class AdditionTask:
    """Addition of two non-negative integers; default reward ``exact_numeric``."""

    name = "addition"
    default_reward = "exact_numeric"

    def __init__(
        self,
        min_digits: int = 1,
        max_digits: int = 1,
        num_train: int | None = None,
        num_eval: int = 100,
        seed: int = 0,
    ) -> None:
        if not 1 <= min_digits <= max_digits:
            raise ValueError(
                f"addition: min_digits={min_digits}, max_digits={max_digits}; need 1 <= min_digits <= max_digits"
            )
        if max_digits > 3:
            raise ValueError(
                f"addition: max_digits={max_digits} would enumerate 10^{2 * max_digits} operand pairs; use at most 3"
            )
        if num_train is not None and num_train < 1:
            raise ValueError(f"addition: num_train={num_train} must be >= 1 (or None for all remaining pairs)")
        if num_eval < 0:
            raise ValueError(f"addition: num_eval={num_eval} must be >= 0")
        operands = operands_with_digits(min_digits, max_digits)
        pairs = [(a, b) for a in operands for b in operands]
        random.Random(seed).shuffle(pairs)
        num_held_out = min(num_eval, int(len(pairs) * MAX_EVAL_FRACTION))
        self.min_digits = min_digits
        self.max_digits = max_digits
        self.seed = seed
        self._eval_pairs = pairs[:num_held_out]
        train_pairs = pairs[num_held_out:]
        self._train_pairs = train_pairs if num_train is None else train_pairs[:num_train]

    def train_prompts(self) -> list[Prompt]:
        return [self._prompt(a, b, "train") for a, b in self._train_pairs]

    def eval_prompts(self) -> list[Prompt]:
        return [self._prompt(a, b, "eval") for a, b in self._eval_pairs]

    def demonstration(self, prompt: Prompt) -> str:
        """The completion an SFT recipe trains on: the answer itself."""
        return prompt.answer

    @staticmethod
    def _prompt(a: int, b: int, split: str) -> Prompt:
        return Prompt(
            uid=f"addition/{split}/{a}+{b}",
            answer=str(a + b),
            text=f"{a}+{b}=",
            metadata={"a": a, "b": b},
        )
