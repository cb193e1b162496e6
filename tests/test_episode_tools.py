"""Tools: plain typed functions offered to a model, and every way a call can go wrong answered, not raised.

Invariants pinned:
- every bad tool call (not JSON, an unknown tool, arguments that do not fit, a tool that raises, one past its
  timeout, one answering megabytes) is an answer the model reads, counted in ``tool_errors``;
- tools reach a template without tool support through the system message, and a template with it through its
  ``tools`` argument; a template that only mentions the word "tools" does not take them;
- each family's tool-call syntax (hermes, llama3_json, mistral) reads back what it writes, and a call nested past
  the JSON decoder's depth or holding an integer too long to convert is an error the model reads, not a raise;
- a tool without type hints or ``Args:`` docs is named (before any model loads, without transformers);
- a tool's answer that cannot be written as text (tuple keys, a circular value, an integer past Python's
  conversion limit) is an error the model reads, counted;
- arguments are checked against the tool's type hints: a string is never read as a number (``add("3", "69")``
  answers an error), an integral float is an int, an int a float, a list a tuple, and nothing else is converted;
- a turn's calls run at once, each with its own ``tool_timeout_s``: four hanging calls do not push the turn past
  ``episode.step_timeout_s``; calls past ``max_calls_per_turn`` are answered without running;
- a tool tells its own failures apart: a ``ToolError`` is the call's (``error: <its message>``, counted), a
  ``ToolInfrastructureError`` its machinery's (raised out of ``step``, never an answer; classified ``infra``).
"""

from __future__ import annotations

import json
import math
import time
from typing import Literal

import pytest
from test_episodes import TOKENIZER, game

from groupwise.controller.failures import classify_failure
from groupwise.episodes.template import PLAIN_CHAT_TEMPLATE, ChatRenderer, template_takes_tools
from groupwise.episodes.tool_env import ToolEnvironment
from groupwise.episodes.tool_formats import TOOL_FORMATS, detect_tool_format
from groupwise.episodes.tools import ToolError, ToolInfrastructureError, tool_schema
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
        (call,) = TOOL_FORMATS["hermes"].parse(text).calls
        assert call.error is not None and call.name == ""
    (deep_mistral,) = TOOL_FORMATS["mistral"].parse("[TOOL_CALLS]" + "[" * 100_000 + "]" * 100_000).calls
    assert deep_mistral.error is not None


def pairs(a: int) -> dict:
    """Answers a dictionary keyed by tuples.

    Args:
        a: Anything.
    """
    return {(a, a): a}


def loop(a: int) -> list:
    """Answers a list that holds itself.

    Args:
        a: Anything.
    """
    value: list = [a]
    value.append(value)
    return value


def factorial(n: int) -> int:
    """n! exactly.

    Args:
        n: The number.
    """
    return math.factorial(n)


def scale(x: float, factors: tuple[int, ...], unit: str | None = None, mode: Literal["up", "down"] = "up") -> str:
    """Scales a number.

    Args:
        x: The number.
        factors: The factors.
        unit: The unit.
        mode: The direction.
    """
    return f"{x!r} {factors!r} {unit!r} {mode}"


def hang(a: int) -> int:
    """Never answers in time.

    Args:
        a: Anything.
    """
    time.sleep(3)
    return a


class MoreTools(ToolEnvironment):
    """A tool environment (test only) with tools whose answers cannot be written as JSON, typed tools and a tool
    that hangs."""

    tool_timeout_s = 0.2

    @property
    def tools(self):
        return (add, pairs, loop, factorial, scale, hang)

    def score(self, prompt: Prompt, final_reply: str) -> float:
        return 0.0


def answered(env: ToolEnvironment, *calls: tuple[str, dict]) -> tuple[list[str], dict]:
    env.reset(game("p", 1), 0)
    reply = "".join(f'<tool_call>{json.dumps({"name": n, "arguments": a})}</tool_call>' for n, a in calls)
    result = env.step({"role": "assistant", "content": reply})
    return [m["content"] for m in result.messages], dict(result.info)


def test_an_answer_that_cannot_be_written_as_text_is_an_error_the_model_reads():
    answers, info = answered(MoreTools(), ("pairs", {"a": 1}), ("loop", {"a": 1}), ("factorial", {"n": 2000}),
                             ("factorial", {"n": 20}))  # fmt: skip
    assert answers[0] == "error: pairs's answer (dict) cannot be written as text (TypeError: keys must be " \
        "str, int, float, bool or None, not tuple)"
    assert answers[1] == "error: loop's answer (list) cannot be written as text (ValueError: Circular " \
        "reference detected)"
    assert answers[2].startswith("error: factorial's answer (int) cannot be written as text (ValueError: "
                                 "Exceeds the limit (4300 digits) for integer string conversion")
    assert answers[3] == str(math.factorial(20))
    assert info == {"tool_calls": 4, "tool_errors": 3}


def test_arguments_are_checked_against_the_type_hints_and_converted_only_losslessly():
    answers, info = answered(
        MoreTools(),
        ("add", {"a": "3", "b": "69"}),  # a string is never read as a number
        ("add", {"a": 3.0, "b": 69}),  # an integral float is an int
        ("add", {"a": 3.5, "b": 1}),
        ("add", {"a": True, "b": 1}),  # JSON's true is not an integer
        ("scale", {"x": 2, "factors": [1, 2]}),  # an int is a float; a list is a tuple
        ("scale", {"x": 2.5, "factors": [1, "2"], "unit": None}),
        ("scale", {"x": 1, "factors": [], "unit": "m", "mode": "sideways"}),
        ("scale", {"x": 1, "factors": [], "unit": 5}),
    )  # fmt: skip
    assert answers == [
        "error: add cannot take these arguments (argument 'a' must be an integer, not the string '3')",
        "72",
        "error: add cannot take these arguments (argument 'a' must be an integer, not the number 3.5)",
        "error: add cannot take these arguments (argument 'a' must be an integer, not the boolean True)",
        "2.0 (1, 2) None up",
        "error: scale cannot take these arguments (argument 'factors'[1] must be an integer, not the string '2')",
        "error: scale cannot take these arguments (argument 'mode' must be one of 'up', 'down', not the string "
        "'sideways')",
        "error: scale cannot take these arguments (argument 'unit' must be a string or null, not the integer 5)",
    ]
    assert info == {"tool_calls": 8, "tool_errors": 6}


def test_calls_deep_nested_or_holding_huge_integers_are_answered_and_counted_end_to_end():
    env = MoreTools()
    env.reset(game("p", 1), 0)
    deep = '<tool_call>{"name": "add", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}</tool_call>"
    huge = '<tool_call>{"name": "add", "arguments": {"a": ' + "9" * 5_000 + ', "b": 1}}</tool_call>'
    result = env.step({"role": "assistant", "content": deep + huge})
    assert [m["content"] for m in result.messages] == [
        "error: the tool call is nested too deeply to read",
        "error: the tool call cannot be read (Exceeds the limit (4300 digits) for integer string conversion: "
        "value has 5000 digits; use sys.set_int_max_str_digits() to increase the limit)",
    ]
    assert dict(result.info) == {"tool_calls": 2, "tool_errors": 2}


class CallsHanging:
    """A generator (test only) whose every turn writes four calls to ``hang`` (as text: the char tokenizer has no
    braces), sampled as the tokens "x<eos>"."""

    version = 0

    def generate(self, requests, sampling):
        from groupwise.types import Completion

        call = '<tool_call>{"name": "hang", "arguments": {"a": 1}}</tool_call>'
        text = call * 4
        ids = (*TOKENIZER.convert_tokens_to_ids(["x"]), TOKENIZER.eos_token_id)
        return [[Completion(ids, (-1.0, -1.0), text, "stop", 0)] for _ in requests]


def test_hanging_calls_of_one_turn_run_at_once_and_never_fail_the_group():
    from test_episodes import run, settings

    started = time.perf_counter()
    # four calls past tool_timeout_s=0.2 one after another would take 0.8 s, past the step deadline of 0.5 s
    [episodes] = run(CallsHanging(), settings(factory=MoreTools, timeout_s=0.5, max_turns=1,
                                                max_observation_tokens=400), [game("p", 1)])
    assert time.perf_counter() - started < 1.5
    assert not isinstance(episodes, Exception), episodes
    for episode in episodes:
        assert (episode.tool_calls, episode.tool_errors, episode.end) == (4, 4, "max_turns")
        assert [m["content"] for m in episode.observations[0]] == ["error: hang took longer than 0.2 s and was "
                                                                   "stopped"] * 4  # fmt: skip


def test_calls_past_the_turns_limit_are_answered_without_running():
    env = MoreTools()
    env.max_calls_per_turn = 2
    answers, info = answered(env, ("add", {"a": 1, "b": 1}), ("add", {"a": 2, "b": 2}), ("add", {"a": 3, "b": 3}))
    assert answers == ["2", "4", "error: not run: a turn may call at most 2 tools"]
    assert info == {"tool_calls": 3, "tool_errors": 1}


def refuse(a: int) -> int:
    """Says the call was wrong in its own words.

    Args:
        a: Anything.
    """
    raise ToolError(f"{a} is not a prime")


def unplugged(a: int) -> int:
    """Its server is gone.

    Args:
        a: Anything.
    """
    raise ToolInfrastructureError("the server is gone")


class OwnWords(Tools):
    """Tools (test only) that fail in their own words, or for their own machinery."""

    @property
    def tools(self):
        return (add, refuse, unplugged)


def test_a_tool_tells_its_own_failure_from_the_calls_and_only_the_calls_is_an_answer():
    env = OwnWords()
    env.reset(game("p", 1), 0)
    answers, info = answered(env, ("refuse", {"a": 4}), ("add", {"a": 1, "b": 1}))
    assert answers == ["error: 4 is not a prime", "2"] and info == {"tool_calls": 2, "tool_errors": 1}
    with pytest.raises(ToolInfrastructureError, match="the server is gone"):  # not the model's to read
        answered(env, ("unplugged", {"a": 1}))
    assert classify_failure(ToolInfrastructureError("x")) == "infra"
