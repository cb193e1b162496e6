"""`RecordingTrainer`: a TrainerClient that records every chunk and optimizer step, with optional hooks."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from groupwise.chunks import TrainChunk
from groupwise.types import Group


@dataclass
class Chunk:
    step: int
    group_ids: list[int]
    uids: list[str]
    first_chunk: bool
    groups: list[Group]


@dataclass
class RecordingTrainer:
    """Records chunks and steps; checks ``first_chunk`` flags and one ``finish_step`` per step.

    ``before_chunk(step, chunk_index)`` may await anything (e.g. until some rollouts have failed).
    """

    chunk_latency: float = 0.0
    finish_latency: float = 0.0
    before_chunk: Callable[[int, int], Awaitable[None]] | None = None
    chunks: list[Chunk] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)

    async def train_chunk(self, step: int, chunk: TrainChunk, first_chunk: bool) -> None:
        groups = chunk.groups
        if step in self.finished:
            raise AssertionError(f"train_chunk for step {step} after its finish_step")
        index = sum(1 for c in self.chunks if c.step == step)
        if first_chunk != (index == 0):
            raise AssertionError(f"step {step} chunk {index}: first_chunk={first_chunk}")
        self.chunks.append(
            Chunk(step, [g.group_id for g in groups], [g.prompt.uid for g in groups], first_chunk, list(groups))
        )
        if self.before_chunk is not None:
            await self.before_chunk(step, index)
        if self.chunk_latency:
            await asyncio.sleep(self.chunk_latency)

    async def finish_step(self, step: int) -> dict[str, float]:
        if step in self.finished:
            raise AssertionError(f"finish_step({step}) called twice")
        if not any(c.step == step for c in self.chunks):
            raise AssertionError(f"finish_step({step}) without any chunk")
        self.finished.append(step)
        if self.finish_latency:
            await asyncio.sleep(self.finish_latency)
        return {"loss/fake": float(step)}

    def groups_per_step(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for c in self.chunks:
            out[c.step] = out.get(c.step, 0) + len(c.group_ids)
        return out

    def uids_per_step(self) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for c in self.chunks:
            out.setdefault(c.step, []).extend(c.uids)
        return out

    def chunk_sizes(self, step: int) -> list[int]:
        return [len(c.group_ids) for c in self.chunks if c.step == step]
