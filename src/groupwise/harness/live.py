"""One session while its harness runs: its limits, its tree, what it was served, and its request log.

A request is served in two halves around the sampling: :meth:`LiveSession.prepare` checks the limits, places the
request in the session's tree (:mod:`groupwise.harness.tree`) and makes the generation request; :meth:`LiveSession.
serve` records what was sampled and turns it into OpenAI choices (a request's ``stop`` strings cut the sampled
tokens after the token that completes one; tool calls are read in the model family's syntax).

Limits (docs/harnesses.md): ``max_requests`` requests per session and ``max_tokens`` tokens after its opening
(model and environment together, over all its sequences): past either, a request is answered at once with no
content and ``finish_reason: "length"``, the way an OpenAI model that ran out of room answers, and counted. The
new messages of a request that extends a sequence take at most ``max_new_tokens`` tokens: past it their contents
are cut to fit and marked, as an environment's answer is, and counted. A request whose context leaves no room in
the model's positions is refused with OpenAI's 400 ``context_length_exceeded``.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from groupwise.episodes.tool_formats import ToolFormat
from groupwise.harness.render import RequestRenderer, served_key
from groupwise.harness.responses import ServedCall, ServedChoice
from groupwise.harness.tree import NewContextTooLong, Placement, SessionTree
from groupwise.harness.wire import ChatRequest, CompletionRequest, Sampling, WireError
from groupwise.seeding import derive_seed
from groupwise.types import Completion, GenerationRequest


@dataclass(frozen=True)
class SessionLimits:
    """``episode.max_turns`` (requests), ``episode.max_tokens`` (the session's budget), ``generation.
    max_new_tokens`` (per request), ``episode.max_observation_tokens`` (new context per request) and the model's
    positions."""

    max_requests: int
    max_tokens: int
    max_request_tokens: int
    max_new_tokens: int
    max_context: int | None = None


@dataclass
class SessionCounts:
    """What a session did, for its record and the ``harness/*`` metrics."""

    requests: int = 0
    limited_requests: int = 0
    refused_requests: int = 0
    env_tokens: int = 0
    served_tokens: int = 0
    retokenized_tokens: int = 0
    truncated_messages: int = 0
    tool_calls: int = 0
    unreadable_tool_calls: int = 0


@dataclass(frozen=True)
class Prepared:
    """A request ready to sample (``request`` set), or one answered at once because a limit was reached."""

    number: int
    placement: Placement | None = None
    request: GenerationRequest | None = None


@dataclass
class LiveSession:
    """One sample's session while its harness runs (thread-safe: requests may come concurrently)."""

    key: str
    sample_index: int
    seed: int
    renderer: RequestRenderer
    limits: SessionLimits
    tree: SessionTree = field(init=False)
    counts: SessionCounts = field(default_factory=SessionCounts)
    log: list[dict[str, Any]] = field(default_factory=list)
    last_reply: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.tree = SessionTree(self.renderer)

    def prepare_chat(self, chat: ChatRequest, version: int) -> Prepared:
        """Place a chat request and make its generation request (or answer it at once past a limit)."""
        number = self._count_request()
        if number > self.limits.max_requests:
            return self._limited(number)
        tools = chat.tools if chat.tool_choice != "none" else ()
        try:
            placement = self.tree.place(chat.messages, tools, version, max_new_tokens=self.limits.max_new_tokens)
        except NewContextTooLong as exc:
            raise self._refused(f"{exc} (episode.max_observation_tokens: the template's framing alone)") from exc
        return self._sampled(number, placement, chat.sampling)

    def prepare_tokens(self, completion: CompletionRequest, version: int) -> Prepared:
        """Place a completion request (its prompt as token ids, or as text tokenized as given)."""
        number = self._count_request()
        if number > self.limits.max_requests:
            return self._limited(number)
        ids = completion_prompt_ids(completion.prompt, self.renderer)
        return self._sampled(number, self.tree.place_tokens(ids, version), completion.sampling)

    def _sampled(self, number: int, placement: Placement, sampling: Sampling) -> Prepared:
        with self._lock:
            spent = self.counts.env_tokens + self.counts.served_tokens + placement.env_tokens
        room = [self.limits.max_tokens - spent, self.limits.max_request_tokens]
        if sampling.max_tokens is not None:
            room.append(sampling.max_tokens)
        if self.limits.max_context is not None:
            positions = self.limits.max_context - len(placement.context)
            if positions <= 0:
                self.tree.abandon(placement)
                raise self._refused(
                    f"the context takes {len(placement.context)} tokens, the model's positions "
                    f"{self.limits.max_context}"
                )
            room.append(positions)
        if min(room) <= 0:
            self.tree.abandon(placement)
            return self._limited(number)
        with self._lock:
            self.counts.env_tokens += placement.env_tokens
            self.counts.retokenized_tokens += placement.retokenized_tokens
            self.counts.truncated_messages += placement.truncated
        seed = derive_seed("harness-request", self.seed, number, sampling.seed)
        return Prepared(
            number, placement, GenerationRequest(placement.context, sampling.n, seed, max_new_tokens=min(room))
        )

    def _count_request(self) -> int:
        with self._lock:
            self.counts.requests += 1
            return self.counts.requests

    def _limited(self, number: int) -> Prepared:
        with self._lock:
            self.counts.limited_requests += 1
        return Prepared(number)

    def _refused(self, message: str) -> WireError:
        with self._lock:
            self.counts.refused_requests += 1
        return WireError(message, code="context_length_exceeded")

    def abandon(self, prepared: Prepared) -> None:
        """A prepared request whose sampling failed or was cancelled: nothing of it is recorded."""
        if prepared.placement is not None:
            self.tree.abandon(prepared.placement)

    def serve(
        self,
        prepared: Prepared,
        completions: list[Completion],
        sampling: Sampling,
        read_calls: ToolFormat | None,
        asked: dict[str, Any],
    ) -> list[ServedChoice]:
        """Record what was sampled for ``prepared`` and answer it; ``read_calls``: the tool format to read calls
        with, or None (a text completion, or ``tool_choice: none``); ``asked``: the request as data, for the log."""
        if prepared.placement is None:
            return [ServedChoice("", (), "length", (), (), ())] * sampling.n
        cut = [_cut_at_stop(c, sampling.stop, self.renderer.tokenizer) for c in completions]
        choices = [
            self._choice(prepared.number, i, completion, text, sampling.logprobs, read_calls)
            for i, (completion, text) in enumerate(cut)
        ]
        keys = [served_key(c.text, [(call.name, call.arguments) for call in c.calls]) for c in choices]
        self.tree.record(prepared.placement, [c for c, _ in cut], keys)
        with self._lock:
            self.counts.served_tokens += sum(len(c.token_ids) for c, _ in cut)
            self.last_reply = choices[0].text
            self.log.append({"request": asked, **_log_entry(prepared.placement, cut, choices)})
        return choices

    def _choice(
        self,
        number: int,
        index: int,
        completion: Completion,
        text: str,
        logprobs: bool,
        read_calls: ToolFormat | None,
    ) -> ServedChoice:
        tokens = tuple(str(self.renderer.tokenizer.decode([t])) for t in completion.token_ids) if logprobs else ()
        finish: str = completion.finish_reason
        calls: tuple[ServedCall, ...] = ()
        if read_calls is not None:
            parsed = read_calls.parse(text)
            if parsed.calls and all(call.error is None for call in parsed.calls):
                calls = tuple(
                    ServedCall(
                        f"call_{self.sample_index}_{number}_{index}_{k}", call.name, _arguments_json(call.arguments)
                    )
                    for k, call in enumerate(parsed.calls)
                )
                text, finish = parsed.content, "tool_calls"
            with self._lock:
                self.counts.tool_calls += len(calls)
                self.counts.unreadable_tool_calls += sum(call.error is not None for call in parsed.calls)
        return ServedChoice(text, calls, finish, completion.token_ids, completion.logprobs, tokens)


def completion_prompt_ids(prompt: str | tuple[int, ...], renderer: RequestRenderer) -> tuple[int, ...]:
    """A text completion's prompt as token ids: as given, or its text tokenized with the tokenizer's special tokens
    (a BOS where the model wants one), as a completion prompt is tokenized elsewhere."""
    if isinstance(prompt, tuple):
        return prompt
    return tuple(int(i) for i in renderer.tokenizer(prompt, add_special_tokens=True)["input_ids"])


def _arguments_json(arguments: Any) -> str:
    return json.dumps(dict(arguments or {}), ensure_ascii=False)


def _cut_at_stop(completion: Completion, stops: tuple[str, ...], tokenizer: Any) -> tuple[Completion, str]:
    """``completion`` cut after the first token that completes one of ``stops`` (the recorded tokens then end
    there), and the text served: the completion's text without the stop string and what follows it."""
    text = completion.text
    found = [text.find(s) for s in stops if s in text]
    if not found:
        return completion, text
    at = min(found)
    low, high = 1, len(completion.token_ids)  # the fewest tokens whose text holds a stop string
    while low < high:
        middle = (low + high) // 2
        prefix = tokenizer.decode(list(completion.token_ids[:middle]), skip_special_tokens=False)
        if any(s in prefix for s in stops):
            high = middle
        else:
            low = middle + 1
    kept = Completion(
        completion.token_ids[:low],
        completion.logprobs[:low],
        tokenizer.decode(list(completion.token_ids[:low]), skip_special_tokens=False),
        "stop",
        completion.token_versions[low - 1],
        token_versions=completion.token_versions[:low],
    )
    return kept, text[:at]


def _log_entry(placement: Placement, cut: list[tuple[Completion, str]], choices: list[ServedChoice]) -> dict[str, Any]:
    """What a served request leaves in the session's log: where it was placed and each choice's sampled ids."""
    return {
        "kind": placement.kind,
        "sequence": placement.sequence,
        "context_tokens": len(placement.context),
        "choices": [
            {
                "token_ids": list(c.token_ids),
                "text": c.text,
                "content": choice.text,
                "calls": [[call.name, call.arguments] for call in choice.calls],
                "finish_reason": choice.finish_reason,
            }
            for (c, _), choice in zip(cut, choices, strict=True)
        ],
    }
