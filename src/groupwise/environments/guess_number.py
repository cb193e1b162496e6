"""``guess_number``: find a secret number from "higher"/"lower" answers.

The prompt's ``answer`` is the secret. Each model turn's last number is its guess; the environment answers
``higher``, ``lower`` or ends the episode. Reward ``1 + bonus × (max_guesses − guesses used)`` for finding it (fewer
guesses, more reward), 0 when the guesses run out. With ``remind`` each answer ends with the opening question again,
so a quiz whose answer is the secret ("What is 7 * 8?") stays in view of a small model after a wrong try.
"""

from __future__ import annotations

import re

from groupwise.episodes.environment import Message, StepResult
from groupwise.types import Prompt

_INTEGER = re.compile(r"-?\d+")


class GuessNumberEnvironment:
    """One game per episode: the secret is ``int(prompt.answer)``."""

    def __init__(self, max_guesses: int = 6, bonus: float = 0.1, remind: bool = False) -> None:
        if max_guesses < 1:
            raise ValueError(f"max_guesses must be ≥ 1, got {max_guesses}")
        self.max_guesses, self.bonus, self.remind = max_guesses, bonus, remind
        self.secret = 0
        self.guesses = 0
        self.question = ""

    def reset(self, prompt: Prompt, sample_index: int) -> list[Message]:
        self.secret, self.guesses = int(prompt.answer), 0
        opening = [dict(m) for m in prompt.messages] if prompt.messages is not None else [
            {"role": "user", "content": prompt.text or ""}]  # fmt: skip
        self.question = next((m["content"] for m in reversed(opening) if m["role"] == "user"), "")
        return opening

    def step(self, assistant_message: Message) -> StepResult:
        numbers = _INTEGER.findall(assistant_message["content"])
        self.guesses += 1
        left = self.max_guesses - self.guesses
        if numbers and int(numbers[-1]) == self.secret:
            return StepResult(reward=1.0 + self.bonus * left, done=True, info={"solved": 1})
        if left <= 0:
            return StepResult(done=True)
        if not numbers:
            answer = "Please answer with one number."
        else:
            answer = "Higher." if int(numbers[-1]) < self.secret else "Lower."
        reminder = f" {self.question}" if self.remind and self.question else ""
        return StepResult(messages=[{"role": "user", "content": f"{answer} {left} guesses left.{reminder}"}])
