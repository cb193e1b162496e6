"""The async controller's clients on Ray, and the driver's handle on the learner actor.

* :class:`RayRolloutClient` (``RolloutClient``): rollout requests wait in a queue; each idle generation worker
  takes up to ``generation.micro_batch_groups`` of them as one actor call, and the controller's pumps await
  the call's object reference. A worker that dies mid-batch fails every group of the batch with
  :class:`~groupwise.runtime.ray.pool.GenerationWorkerLost`, an infra error, so the controller retries each
  group (on another worker, under the infra budget) while a replacement worker starts with the current weights.
  A reward failure fails only the prompt whose completion raised it: the worker returns it in that group's place.
  Each call's wall time, as the driver waits for it, is split among its groups pro rata by completion tokens
  (:func:`~groupwise.runtime.rollout_queue.charge_call`).
* :class:`RayTrainer` (``TrainerClient``): each chunk's rows (advantages computed by the loop that assembled the
  step) go to the learner actor.
* :class:`RayLearner`: what the session calls ``learner`` (and, through :class:`LearnerModel`, the policy's
  ``model``): blocking calls to the learner actor. A lost learner raises :class:`LearnerFailed`: the run stops,
  and the newest complete checkpoint stays the place to resume from.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from groupwise.batch import RowBatch
from groupwise.chunks import TrainChunk
from groupwise.controller.interfaces import LoaderItem
from groupwise.runtime.ray.actors import WeightRefs
from groupwise.runtime.ray.cluster import ActorHandle, ray
from groupwise.runtime.ray.errors import UnschedulableError
from groupwise.runtime.ray.pool import GenerationPool, GenerationWorkerLost, WorkerSlot
from groupwise.runtime.rollout_queue import PendingRollout, RolloutQueue, charge_call, fail_all, settle_outcomes
from groupwise.types import GenerationCost, Group

if TYPE_CHECKING:
    from ray import ObjectRef

T = TypeVar("T")
# What a generation call gave back: each group or the error that failed only it, or the error that failed the call.
Outcomes = Sequence[Group | BaseException] | BaseException


class LearnerFailed(RuntimeError):
    """The learner actor died: its policy and optimizer state are gone, so the run cannot go on."""


def _learner_failed(what: str, err: BaseException) -> LearnerFailed:
    return LearnerFailed(
        f"the learner actor died while {what} ({type(err).__name__}); its policy and optimizer state are lost, so "
        f"the run stops here. The newest complete checkpoint is kept: continue with `groupwise train ... --resume`"
    )


class RayLearner:
    """The session's ``learner``: the learner actor, called synchronously. ``version`` mirrors the actor's."""

    def __init__(self, handle: ActorHandle, version: int = 0):
        self.handle = handle
        self.version = version

    def call(self, what: str, ref: ObjectRef[T]) -> T:
        """``ray.get(ref)``, with a lost learner reported as :class:`LearnerFailed` (``what`` it was doing)."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as err:
            raise _learner_failed(what, err) from err

    def train_chunk(self, rows: RowBatch) -> None:
        self.call("training a chunk", self.handle.train_chunk.remote(rows))

    def finish_step(self) -> dict[str, float]:
        metrics, self.version = self.call("finishing a step", self.handle.finish_step.remote())
        return metrics

    def publish_weights(self) -> tuple[WeightRefs, int]:
        """Put the weights in the object store (once): ``([reference], version)``."""
        return self.call("publishing weights", self.handle.publish_weights.remote())

    def state_dict(self) -> dict[str, Any]:
        return self.call("saving the optimizer state", self.handle.optimizer_state.remote())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.version = self.call("loading the optimizer state", self.handle.load_optimizer_state.remote(state))


@dataclass
class LearnerModel:
    """The policy's ``model`` as the session sees it on Ray: its state lives in the learner actor."""

    learner: RayLearner

    def state_dict(self) -> dict[str, Any]:
        return self.learner.call("saving the model", self.learner.handle.model_state.remote())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.learner.call("loading the model", self.learner.handle.load_model_state.remote(dict(state)))


@dataclass
class RayTrainer:
    """``TrainerClient`` over the learner actor: each chunk's rows go to it."""

    learner: RayLearner
    busy_seconds: float = 0.0

    async def train_chunk(self, step: int, chunk: TrainChunk, first_chunk: bool) -> None:
        rows = chunk.rows
        await self._call(f"training a chunk of step {step}", self.learner.handle.train_chunk.remote(rows))

    async def finish_step(self, step: int) -> dict[str, float]:
        metrics, self.learner.version = await self._call(
            f"finishing step {step}", self.learner.handle.finish_step.remote()
        )
        return metrics

    async def _call(self, what: str, ref: ObjectRef[T]) -> T:
        start = time.perf_counter()
        try:
            return await ref
        except ray.exceptions.RayActorError as err:
            raise _learner_failed(what, err) from err
        finally:
            self.busy_seconds += time.perf_counter() - start

    def close(self, grace_s: float = 60.0) -> None:
        """Nothing to stop here: the learner actor runs the steps (the session stops it)."""


class RayRolloutClient:
    """``RolloutClient`` over the generation worker actors (see the module docstring).

    ``busy_seconds`` is worker-seconds of generation divided by the number of workers (so ``perf/gen_seconds``
    is the mean worker's busy time); ``worker_restarts`` counts replacement workers started.
    """

    def __init__(self, pool: GenerationPool, max_batch_groups: int, publish: Callable[[], tuple[WeightRefs, int]]):
        self.pool = pool
        self.max_batch_groups = max(1, max_batch_groups)
        self.publish = publish
        self.engine_lock = asyncio.Lock()  # held by the runtime around evaluation and checkpoints
        self.generated_tokens = 0
        self.busy_seconds = 0.0
        self.calls_returned = 0  # worker calls that returned or raised: progress for the stall watchdog
        self.replacement_error: BaseException | None = None
        self._queue = RolloutQueue(self._dispatch, "ray-generation")
        self._tasks: set[asyncio.Task] = set()
        self._replacing = 0

    @property
    def worker_restarts(self) -> int:
        return self.pool.restarts

    async def rollout(self, prompt: LoaderItem, group_id: int, attempt: int, start_version: int) -> Group:
        return await self._queue.submit(prompt, group_id, attempt, start_version)

    async def spent(self, group_id: int) -> GenerationCost:
        """What a rollout the controller cancelled cost (waits for the worker call it is in)."""
        return await self._queue.spent(group_id)

    async def _dispatch(self) -> None:
        while True:
            await self._queue.wake.wait()
            self._queue.wake.clear()
            self._queue.items = [p for p in self._queue.items if not p.future.done()]
            if self._queue.items and not self.pool.workers and self._replacing == 0:
                self._no_worker_alive()
            self._fill_workers()

    def _fill_workers(self) -> None:
        """Each idle worker takes up to ``max_batch_groups`` waiting groups as one call."""
        while self._queue.items and (slot := self.pool.idle_worker()) is not None:
            batch = self._queue.take(self.max_batch_groups)
            slot.busy = True
            self._spawn(self._run_batch(slot, batch), f"ray-batch-worker-{slot.index}")

    def _no_worker_alive(self) -> None:
        """Every worker is gone and no replacement is starting: fail the waiting groups (infra: the controller
        retries them with backoff) and try to start a worker again."""
        cause = self.replacement_error
        error = GenerationWorkerLost(f"no generation worker is alive (last replacement failure: {cause!r})")
        for p in self._queue.items:
            p.future.set_exception(error)
        self._queue.items = []
        self._start_replacement(None)

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_batch(self, slot: WorkerSlot, batch: list[PendingRollout]) -> None:
        start = time.perf_counter()
        ids = [p.group_id for p in batch]
        try:
            outcomes = await self._call(slot, batch)
        except ray.exceptions.RayActorError as err:
            lost = GenerationWorkerLost(f"generation worker {slot.index} died while generating groups {ids}: {err}")
            lost.__cause__ = err
            self._charge(batch, lost, time.perf_counter() - start)
            fail_all(batch, lost)
            self._start_replacement(slot)
            return
        except Exception as err:  # noqa: BLE001 — the worker's engine call failed: every group of the batch gets it
            self._charge(batch, err, time.perf_counter() - start)
            fail_all(batch, err)
            return
        finally:
            seconds = time.perf_counter() - start
            self.calls_returned += 1
            self._release(slot, batch, seconds)
            self._queue.wake.set()
        self._charge(batch, outcomes, seconds)
        self.generated_tokens += settle_outcomes(batch, outcomes)

    def _call(self, slot: WorkerSlot, batch: list[PendingRollout]) -> ObjectRef[list[Group | Exception]]:
        return slot.handle.generate_group_outcomes.remote([p.item for p in batch], [p.group_id for p in batch],
                                                          [p.attempt for p in batch],
                                                          [p.start_version for p in batch])  # fmt: skip

    def _charge(self, batch: list[PendingRollout], outcomes: Outcomes, seconds: float) -> None:
        """Record what each group of a call that took ``seconds`` cost (split pro rata by tokens)."""
        charge_call(batch, outcomes, seconds)

    def _release(self, slot: WorkerSlot, batch: list[PendingRollout], seconds: float) -> None:
        """The call of ``batch`` on ``slot`` ended after ``seconds``: count its time, free the worker."""
        self.busy_seconds += seconds / max(1, len(self.pool.workers))
        slot.busy = False

    def _start_replacement(self, dead: WorkerSlot | None) -> None:
        if dead is not None and not self.pool.remove(dead):
            return  # someone else is already replacing it
        self._replacing += 1
        self._spawn(self._replace(dead), "ray-replace-worker")

    async def _replace(self, dead: WorkerSlot | None) -> None:
        if dead is not None:
            self.pool.on_event(f"generation worker {dead.index} died; starting a replacement")
        slot, ready = self.pool.create_replacement()
        try:
            await self._bring_up(slot, ready)
            self.pool.add_replacement(slot, dead.index if dead is not None else None)
            self.replacement_error = None
        except Exception as err:  # noqa: BLE001 — kept for the next rollout's error; the run goes on retrying
            self.pool.discard_replacement(slot)
            self.replacement_error = err
            self.pool.on_event(f"starting replacement generation worker {slot.index} failed: {err!r}")
        finally:
            self._replacing -= 1
            self._queue.wake.set()

    async def _bring_up(self, slot: WorkerSlot, ready: ObjectRef[dict[str, Any]]) -> None:
        """Wait (cancellably) for a new worker to start, then load the newest weights into it."""
        timeout = self.pool.startup_timeout_s
        try:
            await asyncio.wait_for(ready, timeout)
        except TimeoutError as err:
            raise UnschedulableError(
                f"replacement generation worker {slot.index} did not start within {timeout:g} s (see `ray status`: "
                "the cluster may have lost the node or the resources it needs)"
            ) from err
        while slot.version < self.pool.version:  # also the versions synced while it started
            version, weights = self.pool.version, self.pool.weights
            assert weights is not None, "a version above 0 was published with its weights"
            await slot.handle.load_weights.remote(weights[0], version)
            slot.version = version

    async def sync_weights(self, version: int) -> None:
        """The learner puts its weights in the object store once; every worker loads them (queued after the batch
        it is running, so each batch runs under one version)."""
        weights, learner_version = await asyncio.to_thread(self.publish)
        if learner_version != version:
            raise RuntimeError(f"weight sync for version {version} but the learner is at version {learner_version}")
        self.pool.set_weights(weights, version)
        slots = list(self.pool.workers)
        results = await asyncio.gather(
            *(slot.handle.load_weights.remote(weights[0], version) for slot in slots), return_exceptions=True
        )
        for slot, result in zip(slots, results, strict=True):
            if isinstance(result, ray.exceptions.RayActorError):
                self._start_replacement(slot)
            elif isinstance(result, BaseException):
                raise result
            else:
                slot.version = version

    async def close(self, grace_s: float = 60.0) -> None:
        tasks = [t for t in (self._queue.task, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for p in self._queue.items:
            p.future.cancel()
        self._queue.items = []
