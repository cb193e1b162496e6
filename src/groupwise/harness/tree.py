"""One session's recorded token sequences, and where each new request continues them.

A harness sends the whole conversation again with every request, as text. Re-rendering and re-tokenizing it would
give other ids than were sampled, so the tree keeps, per session, every sequence of tokens it served from, and places
each request (:meth:`SessionTree.place`):

- **extend**: the request's messages are an earlier request's messages, then the reply served to it (recognised
  by the content returned, :func:`~groupwise.harness.render.message_key`), then new messages. The context is that
  sequence through the reply's *recorded sampled ids*, then the new messages' tokens as the difference of two
  renderings (the template's closing of the reply, the new messages, the generation prompt): environment tokens.
  The sequence grows in place when the reply is its end; otherwise (a retry after a later turn, a second branch)
  a copy of its prefix starts a new sequence.
- **retry**: the request's messages equal an earlier request's: its context again, in a new sequence (or the same
  one, when nothing was served from it).
- **root**: anything else (an edited or dropped earlier turn, a compacted context, a sub-agent, a template that
  rewrites history): the messages rendered whole, every token an environment token, a new sequence. Never a
  splice of recorded tokens and re-rendered text.

Every sampled token trains exactly once: in the sequence that was sampled into; a copy of a prefix carries the
tokens as context only. Each sequence with sampled tokens is one training row (:meth:`SessionTree.rows`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from groupwise.episodes.environment import Message
from groupwise.episodes.episode import largest_fit
from groupwise.episodes.template import TemplateNotAppendOnly
from groupwise.harness.render import MessageKey, RequestRenderer, message_key, tools_key
from groupwise.harness.wire import ChatMessage
from groupwise.types import Completion, FinishReason

PlacementKind = Literal["root", "extend", "retry", "tokens"]


class NewContextTooLong(ValueError):
    """A request's new messages do not fit the cap on new context even with their contents emptied (the chat
    template's framing alone takes more)."""


@dataclass
class TokenSequence:
    """One root-to-leaf path: tokens with their logprobs, weight versions and trainable flags (sampled here)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    trainable: list[bool] = field(default_factory=list)
    last_finish: FinishReason = "stop"  # how its last sampled turn ended
    busy: bool = False  # a request is being sampled at its end
    dead: bool = False  # made for a request that was refused or failed: never continued, never trained

    def add_context(self, ids: Sequence[int], version: int) -> None:
        self.token_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.versions += [version] * len(ids)
        self.trainable += [False] * len(ids)

    def add_sampled(self, completion: Completion) -> None:
        self.token_ids += completion.token_ids
        self.logprobs += completion.logprobs
        self.versions += completion.token_versions
        self.trainable += [True] * len(completion.token_ids)
        self.last_finish = completion.finish_reason

    def prefix_copy(self, end: int) -> TokenSequence:
        """A new sequence starting with this one's first ``end`` tokens, as context (they train here, not there)."""
        return TokenSequence(self.token_ids[:end], [0.0] * end, self.versions[:end], [False] * end)


@dataclass(frozen=True)
class _Reply:
    """A served reply: the sequence and position right after its sampled ids, and what it was an answer to."""

    sequence: int
    end: int
    history: tuple[Message, ...]
    history_keys: tuple[MessageKey, ...]
    message: Message
    key: MessageKey
    sampled: tuple[int, ...]
    tools: str


@dataclass(frozen=True)
class _Request:
    """A placed request: where its context ends, and its messages (as compared, and as rendered)."""

    sequence: int
    end: int
    keys: tuple[MessageKey, ...]
    history: tuple[Message, ...]
    tools: str


@dataclass(frozen=True)
class Placement:
    """Where one request is sampled: the sequence, the context ids, the request's messages as rendered, and what
    placing it added (environment tokens new to the tree; tokens of assistant messages rendered from text)."""

    sequence: int
    context: tuple[int, ...]
    history: tuple[Message, ...]
    keys: tuple[MessageKey, ...]
    tools: str
    kind: PlacementKind
    env_tokens: int
    retokenized_tokens: int
    created: bool  # the sequence was made for this request
    length_before: int
    truncated: bool = False  # its new messages were cut to fit


class SessionTree:
    """A session's sequences; thread-safe (a harness may send requests concurrently)."""

    def __init__(self, renderer: RequestRenderer) -> None:
        self.renderer = renderer
        self.sequences: list[TokenSequence] = []
        self._replies: list[_Reply] = []
        self._requests: list[_Request] = []
        self._lock = threading.Lock()

    def place(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[Mapping[str, Any]],
        version: int,
        max_new_tokens: int | None = None,
    ) -> Placement:
        """Where a request is sampled (see the module docstring); the sequence is busy until :meth:`record` or
        :meth:`abandon`. The new messages a request adds to a sequence take at most ``max_new_tokens`` tokens: their
        contents are cut to fit and marked, as an environment's answer is (cut before anything is rendered, so a
        megabyte costs no more than the cap); the request's own messages, as later requests echo them, still
        recognise the sequence."""
        keys = tuple(message_key(m) for m in messages)
        with self._lock:
            placed = self._retry(keys, tools) or self._extend(messages, keys, tools, version, max_new_tokens)
            placed = placed or self._root(messages, keys, tools, version)
            self.sequences[placed.sequence].busy = True
            self._requests.append(_Request(placed.sequence, len(placed.context), keys, placed.history, placed.tools))
            return placed

    def place_tokens(self, ids: Sequence[int], version: int) -> Placement:
        """Where a token-in request is sampled: after the sequence its ids extend (the rest of the ids environment
        tokens), else in a new sequence of its own."""
        with self._lock:
            extended = [
                n
                for n, s in enumerate(self.sequences)
                if not s.dead
                and not s.busy
                and s.token_ids
                and len(s.token_ids) <= len(ids)
                and list(ids[: len(s.token_ids)]) == s.token_ids
            ]
            if extended:
                number = max(extended, key=lambda n: len(self.sequences[n].token_ids))
                sequence, created, before = self.sequences[number], False, len(self.sequences[number].token_ids)
                sequence.add_context(ids[before:], self._version_at(number, version))
                new = len(ids) - before
            else:
                known = max((_common(ids, s.token_ids) for s in self.sequences if not s.dead), default=0)
                sequence, created, before, new = TokenSequence(), True, 0, len(ids) - known if self.sequences else 0
                sequence.add_context(ids, version)
                self.sequences.append(sequence)
                number = len(self.sequences) - 1
            sequence.busy = True
            return Placement(number, tuple(ids), (), (), "", "tokens", new, 0, created, before)

    def record(self, placement: Placement, completions: Sequence[Completion], served: Sequence[MessageKey]) -> None:
        """The choices sampled for ``placement`` (their keys as their echo will have them): the first continues
        the placement's sequence, each other one a copy of its context."""
        with self._lock:
            base = self.sequences[placement.sequence]
            base.busy = False
            for index, (completion, key) in enumerate(zip(completions, served, strict=True)):
                if index == 0:
                    number, sequence = placement.sequence, base
                else:
                    number, sequence = len(self.sequences), base.prefix_copy(len(placement.context))
                    self.sequences.append(sequence)
                sequence.add_sampled(completion)
                if placement.kind == "tokens":
                    continue  # a token-in reply is found again by its ids, not by its messages
                self._replies.append(
                    _Reply(
                        number,
                        len(sequence.token_ids),
                        placement.history,
                        placement.keys,
                        {"role": "assistant", "content": completion.text},
                        key,
                        completion.token_ids,
                        placement.tools,
                    )
                )

    def abandon(self, placement: Placement) -> None:
        """Undo a placement whose request was refused or failed before anything was sampled."""
        with self._lock:
            sequence = self.sequences[placement.sequence]
            sequence.busy = False
            if placement.created:
                sequence.dead = True
            else:
                for column in (sequence.token_ids, sequence.logprobs, sequence.versions, sequence.trainable):
                    del column[placement.length_before :]
            self._requests = [
                r for r in self._requests if not (r.sequence == placement.sequence and r.end == len(placement.context))
            ]

    def rows(self) -> list[TokenSequence]:
        """The sequences that hold sampled tokens, in the order they were made: one training row each."""
        return [s for s in self.sequences if not s.dead and any(s.trainable)]

    def _retry(self, keys: tuple[MessageKey, ...], tools: Sequence[Mapping[str, Any]]) -> Placement | None:
        tools_id = tools_key(tools)
        for request in reversed(self._requests):
            if request.keys == keys and request.tools == tools_id:
                sequence, created = self._at(request.sequence, request.end)
                context = tuple(self.sequences[sequence].token_ids)
                return Placement(
                    sequence, context, request.history, keys, tools_id, "retry", 0, 0, created, len(context)
                )
        return None

    def _extend(
        self,
        messages: Sequence[ChatMessage],
        keys: tuple[MessageKey, ...],
        tools: Sequence[Mapping[str, Any]],
        version: int,
        max_new_tokens: int | None,
    ) -> Placement | None:
        tools_id = tools_key(tools)
        matches = [
            r
            for r in self._replies
            if r.tools == tools_id
            and len(r.history_keys) + 1 < len(keys)
            and keys[: len(r.history_keys)] == r.history_keys
            and keys[len(r.history_keys)] == r.key
        ]
        if not matches:
            return None
        reply = max(reversed(matches), key=lambda r: len(r.history_keys))  # the longest; the latest among equals
        new = messages[len(reply.history_keys) + 1 :]
        asked = tuple(self.renderer.as_template_message(m) for m in new)
        try:
            env_ids, rendered = self._fitted(reply, asked, tools, max_new_tokens)
        except TemplateNotAppendOnly:
            return None  # the template rewrites earlier turns: the request is rendered whole instead
        if env_ids is None:
            raise NewContextTooLong(
                f"even emptied, the request's {len(new)} new message(s) take more than {max_new_tokens} tokens"
            )
        sequence, created = self._at(reply.sequence, reply.end)
        before = len(self.sequences[sequence].token_ids)
        self.sequences[sequence].add_context(env_ids, self._version_at(sequence, version))
        history = (*reply.history, reply.message, *rendered)
        return Placement(
            sequence,
            tuple(self.sequences[sequence].token_ids),
            history,
            keys,
            tools_id,
            "extend",
            len(env_ids),
            self._retokenized(new),
            created,
            before,
            rendered is not asked,
        )

    def _fitted(
        self, reply: _Reply, asked: tuple[Message, ...], tools: Sequence[Mapping[str, Any]], cap: int | None
    ) -> tuple[list[int] | None, tuple[Message, ...]]:
        """The context tokens of ``asked`` after ``reply`` and the messages they render, cut to take at most
        ``cap`` tokens beside the reply's closing (``(None, ...)`` when even emptied contents do not fit)."""

        def render(shown: tuple[Message, ...]) -> list[int]:
            return self.renderer.after_reply(reply.history, reply.message, reply.sampled, shown, tools)

        if cap is None:
            return render(asked), asked
        closing = len(render(()))
        return largest_fit(asked, cap, lambda shown: ids if len(ids := render(shown)) - closing <= cap else None)

    def _root(
        self,
        messages: Sequence[ChatMessage],
        keys: tuple[MessageKey, ...],
        tools: Sequence[Mapping[str, Any]],
        version: int,
    ) -> Placement:
        served = {reply.key: reply.message for reply in self._replies}
        rendered = tuple(
            served.get(k) or self.renderer.as_template_message(m) for m, k in zip(messages, keys, strict=True)
        )
        ids = self.renderer.opening(rendered, tools)
        known = max((_common(ids, s.token_ids) for s in self.sequences if not s.dead), default=0)
        sequence = TokenSequence()
        sequence.add_context(ids, version)
        self.sequences.append(sequence)
        retokenized = self._retokenized([m for m in messages if m.role == "assistant"])
        return Placement(
            len(self.sequences) - 1,
            tuple(ids),
            rendered,
            keys,
            tools_key(tools),
            "root",
            len(ids) - known if self._replies else 0,
            retokenized,
            True,
            0,
        )

    def _at(self, number: int, end: int) -> tuple[int, bool]:
        """The sequence to continue at ``end`` of sequence ``number``: itself when that is its free end, else a
        new copy of its prefix."""
        sequence = self.sequences[number]
        if len(sequence.token_ids) == end and not sequence.busy:
            return number, False
        self.sequences.append(sequence.prefix_copy(end))
        return len(self.sequences) - 1, True

    def _version_at(self, number: int, version: int) -> int:
        versions = self.sequences[number].versions
        return versions[-1] if versions else version

    def _retokenized(self, messages: Sequence[ChatMessage]) -> int:
        """Tokens of the assistant messages among ``messages``: rendered from their text, not matched to ids."""
        return sum(
            self.renderer.count(self.renderer.as_template_message(m)["content"])
            for m in messages
            if m.role == "assistant"
        )


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
