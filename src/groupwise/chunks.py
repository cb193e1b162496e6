"""A chunk of one RL step as the loops hand it to the trainer: whole groups and their advantages.

The sync loop and the async train pump assemble each step, so they build its chunks (:func:`step_chunk`): the
advantages are computed where the groups are chosen, per group, on exactly the groups that train (a group baseline
needs only its own group, so a chunk of whole groups gets the advantages the whole step would). The chunk's
training rows (a row-aligned :class:`~groupwise.batch.RowBatch`, :func:`groupwise.rows.build_rows`) are made once,
when the learner or the step's ``train_data`` file first asks for them; the simulator's learner needs only token
counts, so a simulated run never makes them (and never loads torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from groupwise.algo.advantages import batch_normalized_advantages, clip_advantages, group_advantages
from groupwise.types import Group

if TYPE_CHECKING:
    from groupwise.batch import RowBatch
    from groupwise.config import GrpoSection


@dataclass(frozen=True, eq=False)
class TrainChunk:
    """Whole groups of one step, in training order, and one advantage per completion of each."""

    groups: tuple[Group, ...]
    advantages: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        if len(self.advantages) != len(self.groups):
            raise ValueError(f"{len(self.groups)} groups but advantages for {len(self.advantages)}")

    @cached_property
    def rows(self) -> RowBatch:
        """One row per completion (:func:`groupwise.rows.build_rows`), made on first use."""
        from groupwise.rows import build_rows  # torch: only a real learner or the train-data file gets here

        return build_rows(self.groups, self.advantages)

    @property
    def num_completion_tokens(self) -> int:
        return sum(group.num_completion_tokens for group in self.groups)


def group_row_advantages(groups: Sequence[Group], grpo: GrpoSection) -> tuple[tuple[float, ...], ...]:
    """Advantages on the (scaled, shaped) rewards with the section's baseline and normalisation, then its optional
    clipping (``grpo.advantage_clip_low`` / ``_high``). Per group, or with ``grpo.advantage_std: batch`` scaled by
    the std over every group given (a sync step is one chunk, so that is the step's batch)."""
    if grpo.normalize_advantages and grpo.advantage_std == "batch":
        raw = batch_normalized_advantages([group.rewards for group in groups], grpo.baseline)
    else:
        raw = [group_advantages(group.rewards, baseline=grpo.baseline, normalize=grpo.normalize_advantages)
               for group in groups]
    return tuple(tuple(clip_advantages(a, grpo.advantage_clip_low, grpo.advantage_clip_high)) for a in raw)


def step_chunk(groups: Sequence[Group], grpo: GrpoSection) -> TrainChunk:
    """The chunk of ``groups`` (whole groups, in training order) with their advantages."""
    return TrainChunk(tuple(groups), group_row_advantages(groups, grpo))


def step_rows(chunks: Sequence[TrainChunk]) -> RowBatch:
    """Every row of a step's chunks, in training order (what the step's ``train_data`` file holds)."""
    from groupwise.batch import RowBatch

    return chunks[0].rows if len(chunks) == 1 else RowBatch.concat([chunk.rows for chunk in chunks])
