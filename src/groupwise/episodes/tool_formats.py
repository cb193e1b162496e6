"""How a model writes tool calls: one format per model family, chosen from the chat template.

A model trained on a chat template that takes ``tools`` writes its calls in that family's syntax; the registry
:data:`TOOL_FORMATS` holds the ones groupwise reads and writes:

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks inside the reply (Qwen2/2.5/3,
  Hermes, SmolLM3; and what :func:`~groupwise.episodes.tools.tool_instructions` teaches a model whose template has
  no ``tools`` support);
- ``llama3_json``: the whole reply is one JSON object ``{"name": ..., "parameters": {...}}``, optionally after
  ``<|python_tag|>`` (Llama 3.1–3.3);
- ``mistral``: ``[TOOL_CALLS]`` followed by a JSON list of ``{"name": ..., "arguments": {...}}`` (Mistral v3+).

:func:`detect_tool_format` picks one from the template's text (the markers each family's template writes),
``hermes`` otherwise. Reading a reply never raises: a call that cannot be read (not JSON, nested past the JSON
decoder's depth, an integer of more digits than Python converts) is a :class:`ToolCall` with ``error`` set, which
the model reads back as the tool's answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote: the tool's name and arguments, or ``error`` when it could not be read."""

    name: str = ""
    arguments: Mapping[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True)
class ParsedReply:
    """A reply split into its text outside the calls (``content``, stripped) and its calls, in order."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)


class ToolFormat(Protocol):
    """One family's tool-call syntax: read calls from a reply, write calls as that family's model would."""

    name: str

    def parse(self, text: str) -> ParsedReply: ...

    def write(self, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str: ...


def _read_json(body: str) -> tuple[Any, str | None]:
    """``(value, None)`` or ``(None, why it cannot be read)``; never raises (deep nesting and huge integers are
    errors of the call, not of the run)."""
    try:
        return json.loads(body), None
    except json.JSONDecodeError as exc:
        return None, f"the tool call is not valid JSON ({exc.msg})"
    except RecursionError:
        return None, "the tool call is nested too deeply to read"
    except ValueError as exc:  # e.g. an integer longer than Python's int conversion limit
        return None, f"the tool call cannot be read ({exc})"


def _call(data: Any, arguments_key: str) -> ToolCall:
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return ToolCall(error=f'a tool call needs {{"name": ..., "{arguments_key}": {{...}}}}')
    arguments = data.get(arguments_key, data.get("arguments", {}))
    if not isinstance(arguments, dict):
        return ToolCall(name=data["name"], error=f"the tool call's {arguments_key} must be a JSON object")
    return ToolCall(name=data["name"], arguments=arguments)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class HermesFormat:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number of them in a reply."""

    name = "hermes"
    pattern = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, text: str) -> ParsedReply:
        calls = []
        for body in self.pattern.findall(text):
            data, error = _read_json(body)
            calls.append(ToolCall(error=error) if error is not None else _call(data, "arguments"))
        return ParsedReply(self.pattern.sub("", text).strip(), calls)

    def write(self, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
        return "\n".join(f"<tool_call>\n{_dumps({'name': n, 'arguments': dict(a)})}\n</tool_call>" for n, a in calls)


class Llama3JsonFormat:
    """The whole reply is ``{"name": ..., "parameters": {...}}`` (after an optional ``<|python_tag|>``)."""

    name = "llama3_json"
    tag = "<|python_tag|>"

    def parse(self, text: str) -> ParsedReply:
        body = text.strip().removeprefix(self.tag).strip()
        if not (body.startswith("{") and body.endswith("}") and '"name"' in body):
            return ParsedReply(text.strip())
        data, error = _read_json(body)
        return ParsedReply("", [ToolCall(error=error) if error is not None else _call(data, "parameters")])

    def write(self, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
        return "; ".join(_dumps({"name": n, "parameters": dict(a)}) for n, a in calls)


class MistralFormat:
    """``[TOOL_CALLS]`` and a JSON list of ``{"name": ..., "arguments": {...}}`` after the reply's text."""

    name = "mistral"
    marker = "[TOOL_CALLS]"

    def parse(self, text: str) -> ParsedReply:
        content, found, body = text.partition(self.marker)
        if not found:
            return ParsedReply(text.strip())
        data, error = _read_json(body.strip())
        if error is not None:
            return ParsedReply(content.strip(), [ToolCall(error=error)])
        items = data if isinstance(data, list) else [data]
        return ParsedReply(content.strip(), [_call(item, "arguments") for item in items])

    def write(self, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
        return self.marker + _dumps([{"name": n, "arguments": dict(a)} for n, a in calls])


TOOL_FORMATS: dict[str, ToolFormat] = {f.name: f for f in (HermesFormat(), Llama3JsonFormat(), MistralFormat())}
"""The tool-call syntaxes groupwise reads and writes, by name (``episode.tool_format``)."""

_MARKERS = (("[TOOL_CALLS]", "mistral"), ("<|python_tag|>", "llama3_json"), ("<tool_call>", "hermes"))


def detect_tool_format(template: str | None) -> str:
    """The format a chat template's model family writes, by the markers its template renders (``hermes`` when
    none is found: the format :func:`~groupwise.episodes.tools.tool_instructions` describes)."""
    text = template or ""
    return next((name for marker, name in _MARKERS if marker in text), "hermes")


def tool_format(name: str, template: str | None) -> ToolFormat:
    """The format named ``name``, or for ``auto`` the one :func:`detect_tool_format` finds in ``template``."""
    return TOOL_FORMATS[detect_tool_format(template) if name == "auto" else name]
