"""A group's finished sessions as its training samples: the group's prompt ids and one completion per session.

Every sequence a session recorded with sampled tokens is one row. The group's prompt is the longest token prefix
every row of the group shares, up to the first sampled token of any of them (what the G sessions' harnesses sent
first is usually the same system prompt and question: it is scored once per group, as a single-turn prompt is);
the rest of each sequence is its completion, its context tokens (the harness's messages, the template's framing)
with no gradient and its sampled tokens exactly as they were sampled. A session's first sequence is its
completion; its other sequences are the completion's branches (:class:`~groupwise.types.Branch`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from groupwise.episodes.record import EpisodeRecord
from groupwise.harness.runner import SessionResult
from groupwise.harness.tree import TokenSequence
from groupwise.types import Branch, Completion


def shared_prompt(results: Sequence[SessionResult]) -> tuple[int, ...]:
    """The token prefix every row of the group shares, ending before any row's first sampled token."""
    rows = [row for result in results for row in result.session.tree.rows()]
    first = rows[0].token_ids
    length = min(row.trainable.index(True) for row in rows)
    for row in rows:
        length = next(
            (i for i in range(min(length, len(row.token_ids))) if row.token_ids[i] != first[i]),
            min(length, len(row.token_ids)),
        )
    return tuple(first[:length])


def session_completion(
    result: SessionResult, reward: float, prompt_length: int, decode: Callable[[Sequence[int]], str]
) -> Completion:
    """One session as its group's completion (its first row) with a branch per further row, and its record."""
    main, *others = result.session.tree.rows()
    return Completion(
        token_ids=tuple(main.token_ids[prompt_length:]),
        logprobs=tuple(main.logprobs[prompt_length:]),
        text=decode(main.token_ids[prompt_length:]),
        finish_reason=main.last_finish,
        weight_version=main.versions[-1],
        token_versions=tuple(main.versions[prompt_length:]),
        trainable=tuple(main.trainable[prompt_length:]),
        episode=session_record(result, reward),
        branches=tuple(_branch(row, prompt_length, decode) for row in others),
    )


def session_record(result: SessionResult, reward: float) -> EpisodeRecord:
    """The session's record: requests as turns, its tokens, its counts and its request log."""
    live = result.session
    rows = live.tree.rows()
    served = [choice["text"] for entry in live.log for choice in entry["choices"]]
    counts = asdict(live.counts)
    model_tokens = sum(sum(row.trainable) for row in rows)
    harness: dict[str, Any] = {"sequences": len(rows), **counts, "seconds": result.seconds, "log": list(live.log)}
    return EpisodeRecord(
        turns=len(served),
        end="done",
        reward=reward,
        step_rewards=(reward,),
        tool_calls=counts["tool_calls"],
        tool_errors=counts["unreadable_tool_calls"],
        truncated_observations=counts["truncated_messages"],
        env_seconds=result.seconds,
        model_tokens=model_tokens,
        env_tokens=sum(len(row.trainable) for row in rows) - model_tokens,
        assistant=tuple(served),
        retries=result.retries,
        retried_tokens=result.retried_tokens,
        harness=harness,
    )


def _branch(row: TokenSequence, prompt_length: int, decode: Callable[[Sequence[int]], str]) -> Branch:
    ids = tuple(row.token_ids[prompt_length:])
    return Branch(
        ids,
        tuple(row.logprobs[prompt_length:]),
        tuple(row.versions[prompt_length:]),
        tuple(row.trainable[prompt_length:]),
        decode(ids),
        row.last_finish,
    )
