"""The endpoint's answers as OpenAI writes them: chat completions, text completions, and their stream chunks.

A streamed answer (``stream: true``) is written after its choices were sampled: the same content as the unstreamed
body, as server-sent events in the chunk shapes OpenAI's SDK and the agent frameworks read (a role chunk, the
content, each tool call, the finish reason, the usage when ``stream_options.include_usage`` asks for it, then
``[DONE]``). Each answer carries a ``groupwise`` object beside OpenAI's fields: the sampling settings the run used
(and the request's values it overrode), the request keys it ignored, and every choice's token ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServedCall:
    """A tool call read from a served reply, with the id the endpoint gave it."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ServedChoice:
    """One sampled choice as served: its ``text`` (stop string and tool-call markup removed), its calls, the
    finish reason OpenAI names (``stop``, ``length``, ``tool_calls``), and the sampled tokens with their logprobs
    and texts."""

    text: str
    calls: tuple[ServedCall, ...]
    finish_reason: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    tokens: tuple[str, ...]


@dataclass(frozen=True)
class Answer:
    """What every shape of one request's answer holds: its id, time and model name, the choices served, the prompt
    length, whether logprobs were asked for, and the ``groupwise`` object."""

    response_id: str
    created: int
    model: str
    choices: Sequence[ServedChoice]
    prompt_tokens: int
    logprobs: bool
    extension: dict[str, Any]

    def head(self, kind: str) -> dict[str, Any]:
        return {"id": self.response_id, "object": kind, "created": self.created, "model": self.model}

    @property
    def usage(self) -> dict[str, int]:
        completion = sum(len(c.token_ids) for c in self.choices)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }


def _message(choice: ServedChoice) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": choice.text if choice.text or not choice.calls else None}
    if choice.calls:
        message["tool_calls"] = [_call(call) for call in choice.calls]
    return message


def _call(call: ServedCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _chat_logprobs(choice: ServedChoice, wanted: bool) -> dict[str, Any] | None:
    if not wanted:
        return None
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
            for t, lp in zip(choice.tokens, choice.logprobs, strict=True)
        ]
    }


def chat_body(answer: Answer) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    choices = [
        {
            "index": i,
            "message": _message(c),
            "logprobs": _chat_logprobs(c, answer.logprobs),
            "finish_reason": c.finish_reason,
        }
        for i, c in enumerate(answer.choices)
    ]
    return {**answer.head("chat.completion"), "choices": choices, "usage": answer.usage, "groupwise": answer.extension}


def chat_chunks(answer: Answer, include_usage: bool) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed answer, in order: per choice its role, its content, each
    tool call, its finish reason (with the ``groupwise`` object); then the usage when asked for."""
    head = answer.head("chat.completion.chunk")

    def chunk(index: int, delta: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}

    chunks: list[dict[str, Any]] = []
    for index, choice in enumerate(answer.choices):
        chunks.append(chunk(index, {"role": "assistant", "content": ""}))
        if choice.text:
            chunks.append(chunk(index, {"content": choice.text}, _chat_logprobs(choice, answer.logprobs)))
        for position, call in enumerate(choice.calls):
            chunks.append(chunk(index, {"tool_calls": [{"index": position, **_call(call)}]}))
        chunks.append({**chunk(index, {}, finish=choice.finish_reason), "groupwise": answer.extension})
    if include_usage:
        chunks.append({**head, "choices": [], "usage": answer.usage})
    return chunks


def _text_logprobs(choice: ServedChoice, wanted: bool) -> dict[str, Any] | None:
    if not wanted:
        return None
    offsets, at = [], 0
    for token in choice.tokens:
        offsets.append(at)
        at += len(token)
    return {
        "tokens": list(choice.tokens),
        "token_logprobs": list(choice.logprobs),
        "top_logprobs": None,
        "text_offset": offsets,
    }


def _text_choices(answer: Answer) -> list[dict[str, Any]]:
    return [
        {"index": i, "text": c.text, "logprobs": _text_logprobs(c, answer.logprobs), "finish_reason": c.finish_reason}
        for i, c in enumerate(answer.choices)
    ]


def completion_body(answer: Answer) -> dict[str, Any]:
    """A ``text_completion`` object."""
    return {
        **answer.head("text_completion"),
        "choices": _text_choices(answer),
        "usage": answer.usage,
        "groupwise": answer.extension,
    }


def completion_chunks(answer: Answer, include_usage: bool) -> list[dict[str, Any]]:
    """A streamed text completion: one chunk per choice with its text and finish reason."""
    head = answer.head("text_completion")
    chunks = [{**head, "choices": [choice], "groupwise": answer.extension} for choice in _text_choices(answer)]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": answer.usage})
    return chunks


def server_sent_events(chunks: Sequence[dict[str, Any]]) -> Iterator[str]:
    """``data: {chunk}`` events, then ``data: [DONE]``."""
    for chunk in chunks:
        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"
