"""``episode/*`` step metrics: what a step's trained episodes did (docs/metrics.md, "Episodes")."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from groupwise.data.scoring import CORRECT_REWARD
from groupwise.episodes.record import EpisodeRecord


def episode_metrics(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    """Means and totals over ``records`` (one per trained episode); ``{}`` for a single-turn step.

    Means are per episode; ``tool_errors``, ``truncated_observations`` and ``env_seconds`` are the step's totals
    (``env_seconds``: the environment calls' own durations summed, not wall time: calls run concurrently)."""
    if not records:
        return {}
    n = len(records)
    metrics = {
        "episode/turns_mean": math.fsum(r.turns for r in records) / n,
        "episode/turns_max": float(max(r.turns for r in records)),
        "episode/tool_calls_mean": math.fsum(r.tool_calls for r in records) / n,
        "episode/tool_errors": float(sum(r.tool_errors for r in records)),
        "episode/truncated_observations": float(sum(r.truncated_observations for r in records)),
        "episode/env_seconds": math.fsum(r.env_seconds for r in records),
        "episode/model_tokens_mean": math.fsum(r.model_tokens for r in records) / n,
        "episode/env_tokens_mean": math.fsum(r.env_tokens for r in records) / n,
    }
    solved = [r for r in records if r.reward >= CORRECT_REWARD]
    metrics["episode/solved_fraction"] = len(solved) / n
    if solved:  # how quickly the solved ones got there: falls as a policy learns to use the feedback
        metrics["episode/solved_turns_mean"] = math.fsum(r.turns for r in solved) / len(solved)
    for how in ("continued", "restarted"):  # episodes a resumed run took back mid-way
        metrics[f"episode/resumed_{how}"] = float(sum(r.resume == how for r in records))
    metrics["episode/retries"] = float(sum(r.retries for r in records))  # failed attempts started over
    metrics["episode/retried_tokens"] = float(sum(r.retried_tokens for r in records))
    for end in ("done", "max_turns", "token_budget"):
        metrics[f"episode/end_{end}_fraction"] = sum(r.end == end for r in records) / n
    return metrics | harness_metrics([r.harness for r in records if r.harness is not None])


def harness_metrics(sessions: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """``harness/*``: per-session means of sequences, requests, served and context tokens, and the step's totals of
    what could not be served as asked (``{}`` without harness sessions)."""
    if not sessions:
        return {}
    n = len(sessions)
    metrics = {f"harness/{key}_mean": math.fsum(s[key] for s in sessions) / n
               for key in ("sequences", "requests", "served_tokens", "env_tokens")}  # fmt: skip
    for total in ("retokenized_tokens", "limited_requests", "refused_requests", "unreadable_tool_calls"):
        metrics[f"harness/{total}"] = float(sum(s[total] for s in sessions))
    return metrics
