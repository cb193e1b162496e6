"""The embedded runtime: the async controller's clients, in this process, on the real engine and learner.

Generation runs concurrently with training: the engine has its own model copy and runs in a worker thread
(PyTorch releases the GIL inside its kernels), the learner runs chunks in another. Rollout requests that
arrive while the engine is busy are batched into its next call, so many groups share one decode loop.
Weight sync copies the learner's parameters into the engine's model between engine calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from groupwise.batch import RowBatch
from groupwise.model.lora import generator_state_dict
from groupwise.rows import StepRows
from groupwise.runtime.rollout_queue import PendingRollout, RolloutQueue
from groupwise.trainer.rollout import RolloutWorker
from groupwise.types import Group


class EmbeddedRollouts:
    """``RolloutClient`` over an in-process :class:`~groupwise.trainer.rollout.RolloutWorker`."""

    def __init__(self, worker: RolloutWorker, source_model: torch.nn.Module, max_batch_groups: int):
        self.worker = worker
        self.source_model = source_model
        self.max_batch_groups = max(1, max_batch_groups)
        self._queue = RolloutQueue(self._run_batches, "embedded-generation")
        self.engine_lock = asyncio.Lock()
        self.generated_tokens = 0
        self.busy_seconds = 0.0

    async def rollout(self, prompt: Any, group_id: int, attempt: int, start_version: int) -> Group:
        return await self._queue.submit(prompt, group_id, attempt)

    async def _run_batches(self) -> None:
        while True:
            await self._queue.wake.wait()
            self._queue.wake.clear()
            while self._queue.items:
                batch = self._queue.take(self.max_batch_groups)
                batch = [p for p in batch if not p.future.cancelled()]
                if batch:
                    await self._generate(batch)

    async def _generate(self, batch: list[PendingRollout]) -> None:
        async with self.engine_lock:
            start = time.perf_counter()
            try:
                groups = await asyncio.to_thread(
                    self.worker.generate_groups,
                    [p.item for p in batch],
                    [p.group_id for p in batch],
                    [p.attempt for p in batch],
                )
            except Exception as err:  # noqa: BLE001 — every waiting rollout gets the engine's error
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(err)
                return
            finally:
                self.busy_seconds += time.perf_counter() - start
        self.generated_tokens += sum(g.num_completion_tokens for g in groups)
        for p, group in zip(batch, groups, strict=True):
            if not p.future.done():
                p.future.set_result(group)

    async def sync_weights(self, version: int) -> None:
        """Copy the learner's parameters (adapters merged, with LoRA) into the engine's model, between engine calls."""
        async with self.engine_lock:
            self.worker.generator.load_weights(generator_state_dict(self.source_model), version)

    async def close(self) -> None:
        if self._queue.task is not None:
            self._queue.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._queue.task


@dataclass
class EmbeddedTrainer:
    """``TrainerClient`` over an in-process :class:`~groupwise.trainer.learner.Learner`.

    Advantages are computed per chunk: chunks hold whole groups, so group baselines are exact. The rows of
    every chunk are kept until the step closes so the runtime can write the step's ``train_data`` file.
    """

    learner: Any
    grpo: Any
    step_rows: StepRows = field(init=False)
    busy_seconds: float = 0.0

    def __post_init__(self) -> None:
        self.step_rows = StepRows(self.grpo)

    async def train_chunk(self, step: int, groups: list[Group], first_chunk: bool) -> None:
        rows = self.step_rows.add_chunk(groups, first_chunk)
        start = time.perf_counter()
        await asyncio.to_thread(self.learner.train_chunk, rows)
        self.busy_seconds += time.perf_counter() - start

    async def finish_step(self, step: int) -> dict[str, float]:
        start = time.perf_counter()
        metrics = await asyncio.to_thread(self.learner.finish_step)
        self.busy_seconds += time.perf_counter() - start
        return metrics

    def take_step_rows(self) -> RowBatch:
        return self.step_rows.take()
