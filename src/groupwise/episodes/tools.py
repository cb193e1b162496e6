"""Tools as plain Python functions: their schema, how a model is told about them, running a call.

A model calls a tool in its family's syntax (:mod:`groupwise.episodes.tool_formats`; by default
``<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call>``, the format Qwen- and Hermes-style
chat templates train, and the one :func:`tool_instructions` describes to a model whose template has no ``tools``
support). Everything that can go wrong with a call — text that is not JSON, an unknown tool, arguments that do not
fit the tool's type hints (:mod:`groupwise.episodes.tool_arguments`), a tool that raises, answers too much or
answers a value that cannot be written as text — becomes a readable error string the model gets back as the
tool's answer, never an exception of the run. A tool tells the two kinds of failure apart itself: it raises
:class:`ToolError` for a failure that is the call's (the code the model wrote raised: the model reads the message),
and :class:`ToolInfrastructureError` for one of its own machinery (its sandbox could not start, its server is gone):
that is not the model's to read, so it fails the episode (``episode.retry_failed_episodes`` retries it with a fresh
environment) and, in async mode, counts as an infrastructure failure of the prompt.
"""

from __future__ import annotations

import inspect
import json
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from groupwise.episodes.tool_arguments import ArgumentMisfit, checked_arguments
from groupwise.episodes.tool_formats import ToolCall

ERROR_PREFIX = "error: "


class ToolError(Exception):
    """Raised by a tool to answer with an error the model reads (``error: <message>``, counted in
    ``episode/tool_errors``): the call failed for a reason that is the call's own."""


class ToolInfrastructureError(Exception):
    """Raised by a tool whose own machinery failed: never an answer to the model; the episode fails (the async
    controller classifies it ``infra``: :mod:`groupwise.controller.failures`)."""


@dataclass(frozen=True)
class ToolAnswer:
    """The text a tool call answered with, and whether it was an error."""

    text: str
    is_error: bool


def tool_schema(tool: Callable[..., Any]) -> dict[str, Any]:
    """The JSON schema transformers' chat templates take for ``tool`` (typed parameters, Google-style docstring)."""
    from transformers.utils import get_json_schema

    return get_json_schema(tool)


def tool_problem(tool: Callable[..., Any]) -> str | None:
    """Why ``tool`` cannot be offered to a model (what :func:`tool_schema` needs: a name, a type hint for every
    parameter, a docstring with an ``Args:`` entry for each), or None. Checked without importing transformers."""
    name = getattr(tool, "__name__", None)
    if not callable(tool) or not isinstance(name, str):
        return f"{tool!r} is not a named function"
    try:
        hints = typing.get_type_hints(tool)
        parameters = inspect.signature(tool).parameters.values()
    except Exception as exc:  # unresolvable annotations, builtins without a signature
        return f"{name}: its signature cannot be read ({type(exc).__name__}: {exc})"
    doc = inspect.getdoc(tool) or ""
    args = doc.split("Args:", 1)[1] if "Args:" in doc else ""
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            return f"{name}: *{parameter.name} cannot be described to a model; give named parameters"
        if parameter.name not in hints:
            return f"{name}: parameter {parameter.name!r} has no type hint"
        if not re.search(rf"^\s*{re.escape(parameter.name)}\b.*:", args, re.M):
            return f"{name}: its docstring has no 'Args:' entry for {parameter.name!r}"
    if not doc.split("Args:", 1)[0].strip():
        return f"{name}: its docstring has no description before 'Args:'"
    return None


def tool_instructions(schemas: Sequence[Mapping[str, Any]]) -> str:
    """A system-prompt paragraph describing the tools of ``schemas`` (:func:`tool_schema`'s, or a request's OpenAI
    ``tools``) and the ``hermes`` call format, for templates without ``tools``. Each tool is described by the fields
    an OpenAI function has (name, description, parameters), so a tool reads the same whether its schema was made
    from a Python function or written by hand."""
    described = "\n".join(json.dumps(_openai_fields(schema.get("function", schema))) for schema in schemas)
    return (
        "You can call these tools:\n" + described + "\nTo call one, write <tool_call>{\"name\": NAME, \"arguments\": "
        "{...}}</tool_call> and stop; its answer comes back in the next message. When you know the answer, reply "
        "without a tool call."
    )


def _openai_fields(function: Mapping[str, Any]) -> dict[str, Any]:
    return {key: function[key] for key in ("name", "description", "parameters") if key in function}


def run_tool_call(call: ToolCall, tools: Mapping[str, Callable[..., Any]], max_chars: int) -> ToolAnswer:
    """Run one parsed call; its answer as text cut to ``max_chars`` (an error string for a bad call, arguments that
    do not fit the tool's type hints, a raise, or a value that cannot be written as text). Raises only a
    :class:`ToolInfrastructureError` of the tool."""
    if call.error is not None:
        return ToolAnswer(f"error: {call.error}", True)
    tool = tools.get(call.name)
    if tool is None:
        return ToolAnswer(f"error: unknown tool {call.name!r}; the tools are {', '.join(sorted(tools))}", True)
    try:
        arguments = checked_arguments(tool, call.arguments or {})
    except ArgumentMisfit as exc:
        return ToolAnswer(f"error: {call.name} cannot take these arguments ({exc})"[:max_chars], True)
    try:
        value = tool(**arguments)
    except ToolInfrastructureError:
        raise
    except ToolError as exc:
        return ToolAnswer(f"{ERROR_PREFIX}{exc}"[:max_chars], True)
    except Exception as exc:  # the tool's own failure is the model's to read, not the run's to die of
        return ToolAnswer(f"error: {call.name} raised {_described(exc)}"[:max_chars], True)
    try:
        text = value if isinstance(value, str) else json.dumps(value, default=str)
    except Exception as exc:  # tuple keys, a circular value, an int past Python's str conversion limit
        kind = type(value).__name__
        return ToolAnswer(f"error: {call.name}'s answer ({kind}) cannot be written as text ({_described(exc)})"[
            :max_chars], True)  # fmt: skip
    return ToolAnswer(text[:max_chars], False)


def _described(exc: BaseException) -> str:
    """``exc`` as ``Class: message``, also when its message cannot be made (a ``__str__`` that raises)."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 — the description of a failure must not fail
        return type(exc).__name__
