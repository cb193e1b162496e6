"""The endpoint's OpenAI wire format: request bodies read and checked, responses and stream chunks written.

Plain data in, plain data out: no server, no tokenizer. A body that cannot be served is a :class:`WireError`, which
the server answers the way OpenAI does (a status and ``{"error": {"message", "type", "param", "code"}}``).

What is read: chat ``messages`` (roles ``system``, ``developer`` — rendered as ``system`` —, ``user``,
``assistant``, ``tool``; content as a string or text parts), ``tools``, ``tool_choice``, ``max_tokens`` /
``max_completion_tokens``, ``stop``, ``seed``, ``logprobs``, ``n``, ``stream`` (and ``stream_options.
include_usage``), ``temperature`` and ``top_p``; a completion's ``prompt`` as text or as token ids. Other keys
(penalties, ``user``, ``response_format`` ...) are accepted and listed back in the response's ``groupwise.ignored``:
a training run samples with its own settings, and the response says which it used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_CHOICES = 16
_CHAT_KEYS = {
    "model",
    "messages",
    "tools",
    "tool_choice",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "logprobs",
    "top_logprobs",
    "n",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "parallel_tool_calls",
}
_COMPLETION_KEYS = {
    "model",
    "prompt",
    "max_tokens",
    "stop",
    "seed",
    "logprobs",
    "n",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "echo",
}


class WireError(Exception):
    """A request the endpoint refuses: the HTTP status and OpenAI's error fields."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.code, self.kind = message, status, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ChatMessage:
    """One request message, normalised: ``content`` as one string, an assistant's ``tool_calls`` as (name,
    arguments) with the arguments' JSON written canonically (sorted keys) so an echoed call compares equal."""

    role: str
    content: str
    tool_calls: tuple[tuple[str, str], ...] = ()
    name: str | None = None


@dataclass(frozen=True)
class Sampling:
    """What a request asks of sampling: its token cap, stop strings, seed, choices and the settings the run may
    override."""

    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    n: int = 1
    logprobs: bool = False
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    include_usage: bool = False
    ignored: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[ChatMessage, ...]
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str = "auto"  # auto | none | required | a function's name
    sampling: Sampling = field(default_factory=Sampling)


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str | tuple[int, ...]
    sampling: Sampling = field(default_factory=Sampling)


def canonical_arguments(arguments: str) -> str:
    """A call's arguments as canonical JSON (sorted keys, no spaces) when they parse, else as given."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, RecursionError):
        return arguments.strip()


def read_chat_request(body: Any) -> ChatRequest:
    """A ``/v1/chat/completions`` body, checked; :class:`WireError` naming the field otherwise."""
    body = _object(body)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise WireError("'messages' must be a non-empty list of messages", param="messages")
    messages = tuple(_message(m, f"messages[{i}]") for i, m in enumerate(raw))
    tools = _tools(body.get("tools"))
    choice = _tool_choice(body.get("tool_choice"), tools)
    if body.get("top_logprobs") not in (None, 0):
        raise WireError(
            "top_logprobs is not supported: the engine records the sampled token's logprob only", param="top_logprobs"
        )
    cap = body.get("max_completion_tokens", body.get("max_tokens"))
    return ChatRequest(messages, tools, choice, _sampling(body, cap, _CHAT_KEYS, bool(body.get("logprobs"))))


def read_completion_request(body: Any) -> CompletionRequest:
    """A ``/v1/completions`` body: ``prompt`` as a string or a list of token ids (token in, token out)."""
    body = _object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # one prompt given as a batch of one
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    ):
        read: str | tuple[int, ...] = tuple(prompt)
    elif isinstance(prompt, str) and prompt:
        read = prompt
    else:
        raise WireError(
            "'prompt' must be a non-empty string or a non-empty list of token ids (one prompt)", param="prompt"
        )
    if body.get("echo"):
        raise WireError("echo is not supported", param="echo")
    logprobs = body.get("logprobs")
    if logprobs not in (None, 0, 1, True, False):
        raise WireError(
            "logprobs above 1 is not supported: the engine records the sampled token's logprob only", param="logprobs"
        )
    wants = logprobs is not None and logprobs is not False
    return CompletionRequest(read, _sampling(body, body.get("max_tokens"), _COMPLETION_KEYS, wants))


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise WireError("the request body must be a JSON object")
    return body


def _message(raw: Any, where: str) -> ChatMessage:
    if not isinstance(raw, dict):
        raise WireError(f"{where} must be an object with 'role' and 'content'", param=where)
    role = raw.get("role")
    if role not in ROLES:
        raise WireError(f"{where} has the role {role!r}; the roles are {', '.join(ROLES)}", param=f"{where}.role")
    content = _content(raw.get("content"), f"{where}.content", may_be_empty=role == "assistant")
    calls: tuple[tuple[str, str], ...] = ()
    if role == "assistant" and raw.get("tool_calls"):
        calls = _calls(raw["tool_calls"], f"{where}.tool_calls")
    name = raw.get("name")
    return ChatMessage(
        "system" if role == "developer" else role, content, calls, name if isinstance(name, str) else None
    )


def _content(raw: Any, where: str, may_be_empty: bool) -> str:
    if raw is None and may_be_empty:
        return ""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        parts = []
        for index, part in enumerate(raw):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise WireError(
                    f"{where}[{index}] is a {kind!r} part; this model takes text parts only", param=f"{where}[{index}]"
                )
            parts.append(part["text"])
        return "".join(parts)
    raise WireError(f"{where} must be a string or a list of text parts", param=where)


def _calls(raw: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, list):
        raise WireError(f"{where} must be a list", param=where)
    calls = []
    for index, call in enumerate(raw):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise WireError(f"{where}[{index}] needs a function with a name", param=f"{where}[{index}]")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        calls.append((function["name"], canonical_arguments(arguments)))
    return tuple(calls)


def _tools(raw: Any) -> tuple[dict[str, Any], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise WireError("'tools' must be a list", param="tools")
    for index, tool in enumerate(raw):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise WireError(
                f"tools[{index}] must be {{'type': 'function', 'function': {{'name': ...}}}}", param=f"tools[{index}]"
            )
    return tuple(raw)


def _tool_choice(raw: Any, tools: Sequence[Mapping[str, Any]]) -> str:
    names = [t["function"]["name"] for t in tools]
    if raw is None or raw in ("auto", "none", "required"):
        return raw or "auto"
    function = raw.get("function") if isinstance(raw, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or name not in names:
        raise WireError(
            f"tool_choice must be auto, none, required or one of the request's tools ({names})", param="tool_choice"
        )
    return name


def _sampling(body: Mapping[str, Any], cap: Any, known: set[str], logprobs: bool) -> Sampling:
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise WireError("max_tokens must be a positive integer", param="max_tokens")
    n = body.get("n", 1) if body.get("n") is not None else 1
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_CHOICES:
        raise WireError(f"n must be an integer from 1 to {MAX_CHOICES}", param="n")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise WireError("seed must be an integer", param="seed")
    options = body.get("stream_options")
    return Sampling(
        max_tokens=cap,
        stop=_stop(body.get("stop")),
        seed=seed,
        n=n,
        logprobs=logprobs,
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 0.0, 1.0),
        stream=bool(body.get("stream")),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        ignored=tuple(sorted(k for k, v in body.items() if k not in known and v is not None)),
    )


def _stop(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    stops = [raw] if isinstance(raw, str) else raw
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise WireError("stop must be a non-empty string or a list of up to 4 of them", param="stop")
    return tuple(stops)


def _number(body: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise WireError(f"{key} must be a number from {low:g} to {high:g}", param=key)
    return float(value)
