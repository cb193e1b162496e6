"""Replaying recorded sessions: ``groupwise audit --replay-sessions``.

Each ``train_data`` row of a harness session holds the session's request log: every request as the harness sent
it, where it was placed, and the ids served for it. Replaying the log renders every request again with the run's
chat template, places it in a fresh tree and records the logged ids: each placement must land where it did (kind,
sequence, context length), and the replayed sequences must be exactly the trained rows (token for token, trainable
where sampled). A mismatch says the row does not hold what was served, or that rendering changed since the run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from groupwise.episodes.record import EpisodeRecord
from groupwise.harness.live import completion_prompt_ids
from groupwise.harness.render import RequestRenderer, served_key
from groupwise.harness.tree import Placement, SessionTree, TokenSequence
from groupwise.harness.wire import ChatMessage, canonical_arguments
from groupwise.rows import env_spans
from groupwise.types import Completion


@dataclass
class SessionReplayReport:
    """How many sessions and rows were replayed, and each mismatch (row and reason)."""

    sessions: int = 0
    rows: int = 0
    tokens: int = 0
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def format_lines(self) -> str:
        head = (
            f"sessions: {self.sessions} replayed ({self.rows} rows, {self.tokens} served tokens), every request "
            f"rendered again: {len(self.mismatches)} mismatch(es)\n"
        )
        return head + "".join(f"  {line}\n" for line in self.mismatches[:20])


def replay_log(
    log: Sequence[Mapping[str, Any]], renderer: RequestRenderer, max_new_tokens: int | None = None
) -> tuple[list[TokenSequence], str | None]:
    """The sequences a fresh tree records from ``log`` (new context cut to ``max_new_tokens`` as the run cut it),
    and the first placement that differs from the logged one (None when all agree)."""
    tree = SessionTree(renderer)
    for number, entry in enumerate(log, start=1):
        placement = _place(tree, entry["request"], renderer, max_new_tokens)
        logged = (entry["kind"], entry["sequence"], entry["context_tokens"])
        if (placement.kind, placement.sequence, len(placement.context)) != logged:
            return tree.rows(), (
                f"request {number} was placed as {placement.kind} in sequence {placement.sequence} "
                f"with {len(placement.context)} context tokens; the log says {logged}"
            )
        choices = entry["choices"]
        completions = [
            Completion(tuple(c["token_ids"]), (0.0,) * len(c["token_ids"]), c["text"], "stop", 0) for c in choices
        ]
        keys = [
            served_key(c["content"], [(name, canonical_arguments(args)) for name, args in c["calls"]]) for c in choices
        ]
        tree.record(placement, completions, keys)
    return tree.rows(), None


def _place(
    tree: SessionTree, request: Mapping[str, Any], renderer: RequestRenderer, max_new_tokens: int | None
) -> Placement:
    if "messages" in request:
        messages = [
            ChatMessage(m["role"], m["content"], tuple(tuple(c) for c in m["tool_calls"]), m.get("name"))
            for m in request["messages"]
        ]
        tools = request["tools"] if request.get("tool_choice") != "none" else []
        return tree.place(messages, tools, version=0, max_new_tokens=max_new_tokens)
    prompt = tuple(request["prompt_ids"]) if "prompt_ids" in request else request["prompt"]
    return tree.place_tokens(completion_prompt_ids(prompt, renderer), version=0)


def replay_sessions(
    train_data: Sequence[Path],
    renderer: RequestRenderer,
    decode: Callable[[Sequence[int]], str],
    max_new_tokens: int | None = None,
) -> SessionReplayReport:
    """Replay every harness session of the ``train_data`` step files and compare each with its trained rows;
    ``max_new_tokens``: the run's cap on a request's new context (``episode.max_observation_tokens``), so a request
    whose messages were cut is cut the same way again."""
    report = SessionReplayReport()
    for path in train_data:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        by_sample: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for row in rows:
            by_sample.setdefault((row["group_id"], row["completion_index"]), []).append(row)
        for (_, sample), trained in by_sample.items():
            trained.sort(key=lambda r: r["sequence_index"])
            episode = trained[0].get("episode") or {}
            if not episode.get("harness"):
                continue
            where = f"{path.name} (prompt {trained[0]['prompt_uid']!r}, sample {sample})"
            record = EpisodeRecord.from_dict(episode)
            assert record.harness is not None, "checked above"
            replayed, problem = replay_log(record.harness["log"], renderer, max_new_tokens)
            report.sessions += 1
            problem = problem or _compare(replayed, trained, decode)
            if problem is not None:
                report.mismatches.append(f"{where}: {problem}")
                continue
            report.rows += len(trained)
            report.tokens += sum(sum(s.trainable) for s in replayed)
    return report


def _compare(
    replayed: list[TokenSequence], trained: list[dict[str, Any]], decode: Callable[[Sequence[int]], str]
) -> str | None:
    if len(replayed) != len(trained):
        return f"the log gives {len(replayed)} sequences, {len(trained)} rows were trained"
    for index, (sequence, row) in enumerate(zip(replayed, trained, strict=True)):
        completion = row["completion_ids"]
        start = len(sequence.token_ids) - len(completion)
        if start < 0 or sequence.token_ids[start:] != completion:
            return f"sequence {index}: the trained ids are not the ids the log served and rendered"
        spans = [list(span) for span in env_spans(sequence.trainable[start:])]
        if spans != [list(span) for span in row["env_spans"]]:
            return f"sequence {index}: the trained mask differs from what was sampled (context {spans[:4]} ...)"
        if decode(sequence.token_ids[:start]) != row["prompt_text"]:
            return f"sequence {index}: the row's prompt is not the sequence's opening"
    return None
