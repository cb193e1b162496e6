"""``calculator``: arithmetic with a calculator tool. Reward 1 when the final reply's last number is the answer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from groupwise.data.rewards import final_number
from groupwise.episodes.tool_env import ToolEnvironment
from groupwise.types import Completion, Prompt


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return int(a) * int(b)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first term.
        b: The second term.
    """
    return int(a) + int(b)


class CalculatorEnvironment(ToolEnvironment):
    """The model may call ``multiply`` and ``add``; its reply without a tool call is its answer."""

    system_prompt = "Use the tools for arithmetic. Give the final answer as a number."

    def __init__(self, system_prompt: str | None = None) -> None:
        super().__init__()
        if system_prompt is not None:
            self.system_prompt = system_prompt

    @property
    def tools(self) -> Sequence[Callable[..., Any]]:
        return (multiply, add)

    def score(self, prompt: Prompt, final_reply: str) -> float:
        reply = Completion(token_ids=(), logprobs=(), text=final_reply, finish_reason="stop", weight_version=0)
        return final_number(prompt, reply)
