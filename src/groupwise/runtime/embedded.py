"""The embedded runtime: the async controller's clients, in this process, on the real engine and learner (the
sync loop uses its trainer client inline: ``EmbeddedTrainer(in_thread=False)``).

Generation runs concurrently with training: the engine has its own model copy and runs in a worker thread
(PyTorch releases the GIL inside its kernels), the learner runs chunks in another. Rollout requests that
arrive while the engine is busy are batched into its next call, so many groups share one decode loop; they share
an engine failure, never a reward failure (that fails only the prompt whose completion raised it), and the call's
wall time is split among them pro rata by completion tokens (:func:`~groupwise.runtime.rollout_queue.charge_call`).
Weight sync copies the learner's parameters into the engine's model between engine calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from groupwise.chunks import TrainChunk
from groupwise.controller.interfaces import LoaderItem
from groupwise.generation.base import VersionedWeights
from groupwise.runtime.daemon_worker import DaemonWorker
from groupwise.runtime.rollout_queue import (
    PendingRollout,
    RolloutQueue,
    charge_call,
    drop_cancelled,
    fail_all,
    settle_outcomes,
)
from groupwise.trainer.parts import StepLearner
from groupwise.trainer.rollout import RolloutWorker
from groupwise.types import GenerationCost, Group

if TYPE_CHECKING:
    pass

T = TypeVar("T")


class EmbeddedRollouts:
    """``RolloutClient`` over an in-process :class:`~groupwise.trainer.rollout.RolloutWorker`."""

    def __init__(
        self, worker: RolloutWorker, weights: Callable[[], VersionedWeights] | None, max_batch_groups: int
    ) -> None:
        self.worker = worker
        self.weights = weights  # the learner's weights for the generator (the session's generator_weights)
        self.max_batch_groups = max(1, max_batch_groups)
        self._queue = RolloutQueue(self._run_batches, "embedded-generation")
        self._engine = DaemonWorker("groupwise-generation")  # a stuck engine call never blocks the run's exit
        self.engine_lock = asyncio.Lock()
        self.generated_tokens = 0
        self.busy_seconds = 0.0
        self.calls_returned = 0  # engine calls that returned or raised: progress for the stall watchdog
        self.worker_restarts = 0  # the in-process engine is never restarted

    async def rollout(self, prompt: LoaderItem, group_id: int, attempt: int, start_version: int) -> Group:
        return await self._queue.submit(prompt, group_id, attempt, start_version)

    async def spent(self, group_id: int) -> GenerationCost:
        """What a rollout the controller cancelled cost (waits for the engine call it is in)."""
        return await self._queue.spent(group_id)

    async def _run_batches(self) -> None:
        while True:
            await self._queue.wake.wait()
            self._queue.wake.clear()
            while self._queue.items:
                batch = drop_cancelled(self._queue.take(self.max_batch_groups))
                if batch:
                    await self._generate(batch)

    async def _generate(self, batch: list[PendingRollout]) -> None:
        async with self.engine_lock:
            start = time.perf_counter()
            try:
                outcomes = await self._engine.run(
                    self.worker.generate_group_outcomes,
                    [p.item for p in batch],
                    [p.group_id for p in batch],
                    [p.attempt for p in batch],
                    [p.start_version for p in batch],
                )
            except Exception as err:  # noqa: BLE001 — the engine call failed: every waiting rollout gets its error
                self.calls_returned += 1
                charge_call(batch, err, time.perf_counter() - start)
                fail_all(batch, err)
                return
            finally:
                seconds = time.perf_counter() - start
                self.busy_seconds += seconds
        self.calls_returned += 1
        charge_call(batch, outcomes, seconds)
        self.generated_tokens += settle_outcomes(batch, outcomes)

    async def sync_weights(self, version: int) -> None:
        """Copy the learner's parameters (adapters merged, with LoRA) into the engine's model, between engine calls."""
        if self.weights is None:
            raise RuntimeError("these rollouts were built without a weights source (weights=None): they cannot sync")
        async with self.engine_lock:
            weights = self.weights().checked(version)
            self.worker.generator.load_weights(weights.state, weights.version)

    async def close(self, grace_s: float = 60.0) -> None:
        """Stop serving; wait up to ``grace_s`` for an engine call in progress (0 after a stall: it is stuck)."""
        if self._queue.task is not None:
            self._queue.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._queue.task
        await asyncio.to_thread(self._engine.close, grace_s)


@dataclass
class EmbeddedTrainer:
    """``TrainerClient`` over an in-process :class:`~groupwise.trainer.learner.Learner`: each chunk's rows (built
    by the loop that assembled the step, advantages included) go to the learner."""

    learner: StepLearner
    in_thread: bool = True  # async: train in a worker thread while generation goes on; sync: inline
    busy_seconds: float = 0.0
    _thread: DaemonWorker = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._thread = DaemonWorker("groupwise-learner")

    async def train_chunk(self, step: int, chunk: TrainChunk, first_chunk: bool) -> None:
        await self._call(self.learner.train_chunk, chunk.rows)

    async def finish_step(self, step: int) -> dict[str, float]:
        return await self._call(self.learner.finish_step)

    async def _call(self, method: Callable[..., T], *args: Any) -> T:  # Any: method's own arguments
        start = time.perf_counter()
        try:
            return await self._thread.run(method, *args) if self.in_thread else method(*args)
        finally:
            self.busy_seconds += time.perf_counter() - start

    def close(self, grace_s: float = 60.0) -> None:
        self._thread.close(grace_s)
