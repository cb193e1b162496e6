"""Tools: plain typed functions offered to a model, and every way a call can go wrong answered, not raised.

Invariants pinned:
- every bad tool call (not JSON, an unknown tool, arguments that do not fit, a tool that raises, one past its
  timeout, one answering megabytes) is an answer the model reads, counted in ``tool_errors``;
- tools reach a template without tool support through the system message, and a template with it through its
  ``tools`` argument; a template that only mentions the word "tools" does not take them;
- each family's tool-call syntax (hermes, llama3_json, mistral) reads back what it writes, and a call nested past
  the JSON decoder's depth or holding an integer too long to convert is an error the model reads, not a raise;
- a tool without type hints or ``Args:`` docs is named (before any model loads, without transformers).
"""

from __future__ import annotations

import time

from test_episodes import TOKENIZER, game

from groupwise.episodes.template import PLAIN_CHAT_TEMPLATE, ChatRenderer, template_takes_tools
from groupwise.episodes.tool_env import ToolEnvironment
from groupwise.episodes.tool_formats import TOOL_FORMATS, detect_tool_format
from groupwise.episodes.tools import parse_tool_calls, tool_schema
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
    renderer = ChatRenderer(TOKENIZER, (tool_schema(add),), PLAIN_CHAT_TEMPLATE)
    opening = renderer.offer_tools([{"role": "user", "content": "2 + 3?"}])
    assert opening[0]["role"] == "system" and '"name": "add"' in opening[0]["content"]
    assert "<tool_call>" in opening[0]["content"] and opening[1] == {"role": "user", "content": "2 + 3?"}
    with_tools = "{%- for t in tools -%}[{{ t['function']['name'] }}]{%- endfor -%}" + PLAIN_CHAT_TEMPLATE
    native = ChatRenderer(TOKENIZER, (tool_schema(add),), with_tools)
    assert native.offer_tools([{"role": "user", "content": "hi"}]) == [{"role": "user", "content": "hi"}]
    assert native.text([{"role": "user", "content": "hi"}], generation_prompt=True).startswith("[add]user: hi")
    mentions_tools = "{#- this template has no tools support -#}" + PLAIN_CHAT_TEMPLATE  # the word, not the feature
    assert not template_takes_tools(TOKENIZER, mentions_tools) and template_takes_tools(TOKENIZER, with_tools)
    named_only = ChatRenderer(TOKENIZER, (tool_schema(add),), mentions_tools)
    assert '"name": "add"' in named_only.offer_tools([{"role": "user", "content": "hi"}])[0]["content"]


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


def test_each_tool_format_reads_back_what_it_writes_and_is_found_from_its_template():
    calls = [("multiply", {"a": 123, "b": 456}), ("add", {"a": 1, "b": 2})]
    for name, fmt in TOOL_FORMATS.items():
        written = fmt.write(calls[:1] if name == "llama3_json" else calls)  # Llama 3 writes one call per reply
        parsed = fmt.parse("Let me compute. " + written if name != "llama3_json" else written)
        expected = calls[:1] if name == "llama3_json" else calls
        assert [(c.name, dict(c.arguments or {})) for c in parsed.calls] == expected, name
        assert all(c.error is None for c in parsed.calls)
        assert parsed.content == ("" if name == "llama3_json" else "Let me compute.")
        assert fmt.parse("The answer is 42.").calls == [] and fmt.parse("The answer is 42.").content == (
            "The answer is 42."
        )
    assert detect_tool_format("{{ '<tool_call>' }}") == "hermes"
    assert detect_tool_format("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert detect_tool_format("{{ '<|python_tag|>' }}") == "llama3_json"
    assert detect_tool_format(PLAIN_CHAT_TEMPLATE) == "hermes"


def test_unreadable_calls_are_errors_the_model_reads_never_a_raise():
    deep = '<tool_call>{"name": "add", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}</tool_call>"
    huge = '<tool_call>{"name": "add", "arguments": {"a": ' + "9" * 5_000 + ', "b": 1}}</tool_call>'
    for text in (deep, huge):
        (call,) = parse_tool_calls(text)
        assert call.error is not None and call.name == ""
    (deep_mistral,) = TOOL_FORMATS["mistral"].parse("[TOOL_CALLS]" + "[" * 100_000 + "]" * 100_000).calls
    assert deep_mistral.error is not None
