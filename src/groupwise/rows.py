"""From a step's chunk (whole groups and their advantages, :mod:`groupwise.chunks`) to row-aligned training rows.

One row per completion, and one more per branch of a completion (a harness session that branched trains each of its
sequences; :class:`~groupwise.types.Branch`). Every column is built from the same group list in the same order,
inside one :class:`~groupwise.batch.RowBatch`, so a reward can never be paired with another row's completion
(the misaligned-rewards bug of docs/design.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from groupwise.batch import RowBatch
from groupwise.types import Branch, Completion, Group


def version_spans(token_versions: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """A completion's per-token weight versions, run-length encoded: ``((v₁, n₁), (v₂, n₂), ...)`` means the first
    n₁ tokens were sampled under version v₁, the next n₂ under v₂, and so on (``Σ nᵢ`` = the token count; ``()``
    for no tokens). One span without partial rollouts; one more per weight sync the completion lived through."""
    spans: list[tuple[int, int]] = []
    for version in token_versions:
        if spans and spans[-1][0] == version:
            spans[-1] = (version, spans[-1][1] + 1)
        else:
            spans.append((version, 1))
    return tuple(spans)


def env_spans(trainable: Sequence[bool]) -> tuple[tuple[int, int], ...]:
    """Where a completion's environment tokens lie, as ``((start, length), ...)`` runs of ``trainable[i]`` False
    (``()`` for a single-turn completion, whose every token was sampled)."""
    spans: list[tuple[int, int]] = []
    for index, sampled in enumerate(trainable):
        if sampled:
            continue
        if spans and spans[-1][0] + spans[-1][1] == index:
            spans[-1] = (spans[-1][0], spans[-1][1] + 1)
        else:
            spans.append((index, 1))
    return tuple(spans)


def trainable_mask(rows: Sequence[Sequence[tuple[int, int]]], width: int) -> torch.Tensor:
    """``[R, width]`` bool: False on the tokens of each row's :func:`env_spans` (cut at ``width``), True elsewhere."""
    out = torch.ones((len(rows), width), dtype=torch.bool)
    for i, spans in enumerate(rows):
        for start, length in spans:
            out[i, start : min(start + length, width)] = False
    return out


ROW_COLUMNS = (
    "group_id", "prompt_uid", "completion_index", "sequence_index", "prompt_ids", "completion_ids",
    "generation_logprobs", "completion_text", "finish_reason", "raw_reward", "reward", "advantage", "start_version",
    "version_spans", "env_spans", "episode",
)  # fmt: skip


def build_rows(groups: Sequence[Group], advantages: Sequence[Sequence[float]]) -> RowBatch:
    """One row per completion and per branch, groups in the given order, completions in sampling order (a
    completion's branches right after it).

    Columns: ``group_id``, ``prompt_uid``, ``completion_index``, ``sequence_index`` (0 for the completion, k for its
    k-th branch), ``prompt_ids``, ``completion_ids``, ``generation_logprobs``, ``completion_text``,
    ``finish_reason``, ``raw_reward`` (the verifier's, as the zero-variance filter saw it), ``reward`` (scaled and
    shaped), ``advantage`` (a float32 tensor, a separate column: a reward is never overwritten by its advantage),
    ``start_version``, ``version_spans`` (the weight versions of the completion's tokens, :func:`version_spans`; the
    learner finds its on-policy tokens by them), ``env_spans`` (an episode's environment tokens, :func:`env_spans`:
    no gradient, not counted), ``episode`` (the episode's record on its completion's own row; None on its branches'
    rows and for single-turn completions).
    Id and logprob rows are the groups' own tuples (no copy; the batch is immutable).
    """
    if len(advantages) != len(groups):
        raise ValueError(f"{len(groups)} groups but advantages for {len(advantages)}")
    cols: dict[str, list] = {name: [] for name in ROW_COLUMNS}
    for group, group_adv in zip(groups, advantages, strict=True):
        if len(group_adv) != group.size:
            raise ValueError(f"group {group.group_id}: {group.size} completions but {len(group_adv)} advantages")
        for i, completion in enumerate(group.completions):
            sequences: tuple[Completion | Branch, ...] = (completion, *completion.branches)
            for sequence_index, sequence in enumerate(sequences):
                row = {
                    "group_id": group.group_id, "prompt_uid": group.prompt.uid, "completion_index": i,
                    "sequence_index": sequence_index, "prompt_ids": tuple(group.prompt_token_ids),
                    "raw_reward": group.raw_rewards[i], "reward": group.rewards[i], "advantage": group_adv[i],
                    "start_version": group.start_version,
                    "episode": completion.episode if sequence_index == 0 else None,
                    **_sequence_columns(sequence),
                }  # fmt: skip
                for name in ROW_COLUMNS:
                    cols[name].append(row[name])
    return RowBatch({**cols, "advantage": torch.tensor(cols["advantage"], dtype=torch.float32)})


def _sequence_columns(sequence: Completion | Branch) -> dict[str, object]:
    return {
        "completion_ids": tuple(sequence.token_ids), "generation_logprobs": tuple(sequence.logprobs),
        "completion_text": sequence.text, "finish_reason": sequence.finish_reason,
        "version_spans": version_spans(sequence.token_versions or ()), "env_spans": env_spans(sequence.trainable),
    }  # fmt: skip


def pad_right(rows: Sequence[Sequence[float]], width: int, value: float = 0.0) -> torch.Tensor:
    """Stack ragged rows into ``[R, width]``, right-padded with ``value``."""
    out = torch.full((len(rows), width), value, dtype=torch.float32)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


def span_versions(rows: Sequence[Sequence[tuple[int, int]]], width: int, pad: int = -1) -> torch.Tensor:
    """The per-token weight versions of ``rows`` of :func:`version_spans` as an ``[R, width]`` int64 tensor,
    right-padded (and cut) at ``width`` with ``pad``."""
    out = torch.full((len(rows), width), pad, dtype=torch.int64)
    for i, spans in enumerate(rows):
        start = 0
        for version, count in spans:
            out[i, start : min(start + count, width)] = version
            start += count
    return out
