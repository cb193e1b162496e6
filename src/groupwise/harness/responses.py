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


def usage(prompt_tokens: int, choices: Sequence[ServedChoice]) -> dict[str, int]:
    completion = sum(len(c.token_ids) for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


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


def chat_body(
    response_id: str,
    created: int,
    model: str,
    choices: Sequence[ServedChoice],
    prompt_tokens: int,
    logprobs: bool,
    extension: dict[str, Any],
) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": i,
                "message": _message(c),
                "logprobs": _chat_logprobs(c, logprobs),
                "finish_reason": c.finish_reason,
            }
            for i, c in enumerate(choices)
        ],
        "usage": usage(prompt_tokens, choices),
        "groupwise": extension,
    }


def chat_chunks(
    response_id: str,
    created: int,
    model: str,
    choices: Sequence[ServedChoice],
    prompt_tokens: int,
    logprobs: bool,
    extension: dict[str, Any],
    include_usage: bool,
) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed answer, in order."""
    head = {"id": response_id, "object": "chat.completion.chunk", "created": created, "model": model}
    chunks: list[dict[str, Any]] = []
    for index, choice in enumerate(choices):
        chunks.append(
            {
                **head,
                "choices": [
                    {
                        "index": index,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
        )
        if choice.text:
            chunks.append(
                {
                    **head,
                    "choices": [
                        {
                            "index": index,
                            "delta": {"content": choice.text},
                            "logprobs": _chat_logprobs(choice, logprobs),
                            "finish_reason": None,
                        }
                    ],
                }
            )
        for position, call in enumerate(choice.calls):
            delta = {"tool_calls": [{"index": position, **_call(call)}]}
            chunks.append(
                {**head, "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]}
            )
        chunks.append(
            {
                **head,
                "choices": [{"index": index, "delta": {}, "logprobs": None, "finish_reason": choice.finish_reason}],
                "groupwise": extension,
            }
        )
    if include_usage:
        chunks.append({**head, "choices": [], "usage": usage(prompt_tokens, choices)})
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


def completion_body(
    response_id: str,
    created: int,
    model: str,
    choices: Sequence[ServedChoice],
    prompt_tokens: int,
    logprobs: bool,
    extension: dict[str, Any],
) -> dict[str, Any]:
    """A ``text_completion`` object."""
    return {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": i, "text": c.text, "logprobs": _text_logprobs(c, logprobs), "finish_reason": c.finish_reason}
            for i, c in enumerate(choices)
        ],
        "usage": usage(prompt_tokens, choices),
        "groupwise": extension,
    }


def completion_chunks(
    response_id: str,
    created: int,
    model: str,
    choices: Sequence[ServedChoice],
    prompt_tokens: int,
    logprobs: bool,
    extension: dict[str, Any],
    include_usage: bool,
) -> list[dict[str, Any]]:
    """A streamed text completion: one chunk per choice with its text and finish reason."""
    head = {"id": response_id, "object": "text_completion", "created": created, "model": model}
    chunks: list[dict[str, Any]] = [
        {
            **head,
            "choices": [
                {"index": i, "text": c.text, "logprobs": _text_logprobs(c, logprobs), "finish_reason": c.finish_reason}
            ],
            "groupwise": extension,
        }
        for i, c in enumerate(choices)
    ]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": usage(prompt_tokens, choices)})
    return chunks


def server_sent_events(chunks: Sequence[dict[str, Any]]) -> Iterator[str]:
    """``data: {chunk}`` events, then ``data: [DONE]``."""
    for chunk in chunks:
        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"
