"""Tools: plain typed functions offered to a model, and every way a call can go wrong answered, not raised.

Invariants pinned:
- every bad tool call (not JSON, an unknown tool, arguments that do not fit, a tool that raises, one past its
  timeout, one answering megabytes) is an answer the model reads, counted in ``tool_errors``;
- tools reach a template without tool support through the system message, and a template with it through its
  ``tools`` argument;
- a tool without type hints or ``Args:`` docs is named (before any model loads, without transformers).
"""

from __future__ import annotations

import time

from test_episodes import TOKENIZER, game

from groupwise.episodes.template import PLAIN_CHAT_TEMPLATE, ChatRenderer
from groupwise.episodes.tool_env import ToolEnvironment
from groupwise.types import Prompt


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first term.
        b: The second term.
    """
    return a + b


def explode(a: int) -> int:
    """Always fails.

    Args:
        a: Anything.
    """
    raise ZeroDivisionError("on purpose")


def dawdle(a: int) -> int:
    """Takes its time.

    Args:
        a: Anything.
    """
    time.sleep(2)
    return a


def flood(a: int) -> str:
    """Answers ten megabytes.

    Args:
        a: Anything.
    """
    return "x" * 10_000_000


class Tools(ToolEnvironment):
    """A tool environment (test only) scoring a final reply of "5" as 1."""

    tool_timeout_s = 0.2

    @property
    def tools(self):
        return (add, explode, dawdle, flood)

    def score(self, prompt: Prompt, final_reply: str) -> float:
        return float(final_reply.strip() == "5")


def test_every_bad_tool_call_is_an_answer_the_model_reads_and_is_counted():
    env = Tools()
    env.reset(game("p", 1), 0)
    reply = "".join([
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"name": "subtract", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>',
        '<tool_call>{"name": "explode", "arguments": {"a": 1}}</tool_call>',
        '<tool_call>{"name": "dawdle", "arguments": {"a": 1}}</tool_call>',
        '<tool_call>{"name": "flood", "arguments": {"a": 1}}</tool_call>',
    ])  # fmt: skip
    result = env.step({"role": "assistant", "content": reply})
    answers = [m["content"] for m in result.messages]
    assert answers[0] == "5"
    assert answers[1].startswith("error: the tool call is not valid JSON")
    assert answers[2].startswith("error: unknown tool 'subtract'; the tools are add, dawdle, explode, flood")
    assert answers[3].startswith("error: add cannot take these arguments")
    assert answers[4] == "error: explode raised ZeroDivisionError: on purpose"
    assert answers[5] == "error: dawdle took longer than 0.2 s and was stopped"
    assert answers[6] == "x" * env.max_answer_chars  # ten megabytes cut to what a model can read
    assert dict(result.info) == {"tool_calls": 7, "tool_errors": 5} and not result.done
    final = env.step({"role": "assistant", "content": "5"})
    assert final.done and final.reward == 1.0


def test_tools_reach_a_template_without_tool_support_through_the_system_message():
    renderer = ChatRenderer(TOKENIZER, (add,), PLAIN_CHAT_TEMPLATE)
    opening = renderer.offer_tools([{"role": "user", "content": "2 + 3?"}])
    assert opening[0]["role"] == "system" and '"name": "add"' in opening[0]["content"]
    assert "<tool_call>" in opening[0]["content"] and opening[1] == {"role": "user", "content": "2 + 3?"}
    with_tools = "{%- for t in tools -%}[{{ t['function']['name'] }}]{%- endfor -%}" + PLAIN_CHAT_TEMPLATE
    native = ChatRenderer(TOKENIZER, (add,), with_tools)
    assert native.offer_tools([{"role": "user", "content": "hi"}]) == [{"role": "user", "content": "hi"}]
    assert native.text([{"role": "user", "content": "hi"}], generation_prompt=True).startswith("[add]user: hi")


def test_a_tool_that_cannot_be_described_to_a_model_is_named():
    from groupwise.episodes.tools import tool_problem

    def untyped(a, b: int) -> int:
        """Adds.

        Args:
            a: One.
            b: Two.
        """
        return a + b

    def undocumented(a: int) -> int:
        """Adds."""
        return a

    assert tool_problem(add) is None
    assert tool_problem(untyped) == "untyped: parameter 'a' has no type hint"
    assert tool_problem(undocumented) == "undocumented: its docstring has no 'Args:' entry for 'a'"
