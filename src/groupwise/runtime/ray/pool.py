"""The generation workers of a Ray run: starting them, keeping their weights current, replacing lost ones.

:class:`GenerationPool` owns the worker actors and the current weights (one object-store reference and its
version). A replacement worker loads those weights before it serves anything, so versions stay exactly as in
the embedded runtime: a group's ``start_version`` is the version of the worker's engine when it began.

Blocking helpers for the sync loop and evaluation live here too: :class:`RemoteEngine` (the session's
``engine``) and :class:`RaySyncRollouts` (the session's ``rollouts``). A worker lost in sync mode is replaced
and its share of the round generated again with the same seeds, so the round's groups are the same as if
nothing had happened. The async client is :class:`groupwise.runtime.ray.clients.RayRolloutClient`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from groupwise.controller.failures import InfraError
from groupwise.runtime.ray.actors import (
    GenerationWorker,
    WeightRefs,
    generation_concurrency,
    kill_actor,
    start_actor,
)
from groupwise.runtime.ray.cluster import ActorHandle, generation_worker_resources, ray, wait_until_started
from groupwise.trainer.rollout import RolloutWorker
from groupwise.types import Completion, GenerationRequest, Group, LoaderItem, Prompt, SampleOutcome, SamplingParams

if TYPE_CHECKING:
    import torch
    from ray import ObjectRef

    from groupwise.config import RunConfig
    from groupwise.generation.base import Generator

# Sync mode: how many times one call may replace a lost worker before giving up.
MAX_REPLACEMENTS_PER_CALL = 3
SHUTDOWN_TIMEOUT_S = 30.0  # how long the workers get to stop their engines before they are killed


class GenerationWorkerLost(InfraError):
    """A generation worker actor died (or none is alive); the work it held must be dispatched again."""


@dataclass(eq=False)
class WorkerSlot:
    """One generation worker actor, the weight version it holds, and whether a batch is running on it."""

    index: int
    handle: ActorHandle
    version: int = 0
    busy: bool = False
    groups: int = 0  # groups in flight on it (continuous batching: several calls at once)


class GenerationPool:
    """The generation worker actors of a run (see the module docstring)."""

    def __init__(self, cfg: RunConfig, startup_timeout_s: float):
        self.cfg = cfg
        self.startup_timeout_s = startup_timeout_s
        self.workers: list[WorkerSlot] = []
        self.restarts = 0
        self.weights: WeightRefs | None = None  # the current weights
        self.version = 0
        self.on_event: Callable[[str], None] = lambda message: None
        self._next_index = 0
        self._starting: list[WorkerSlot] = []  # replacements not yet in the pool
        self._lock = threading.Lock()  # evaluation threads and the event loop may both replace a worker

    # --- lifecycle -------------------------------------------------------------------------------------------------
    def launch(self, count: int) -> dict[str, Any]:
        """Create ``count`` workers; returns role → ready reference (wait on them with the learner's)."""
        refs = {}
        for _ in range(count):
            slot, ready = self._create(self._allocate_index())
            self.workers.append(slot)
            refs[f"generation worker {slot.index}"] = ready
        return refs

    def _allocate_index(self) -> int:
        with self._lock:
            index, self._next_index = self._next_index, self._next_index + 1
        return index

    def _create(self, index: int) -> tuple[WorkerSlot, ObjectRef[dict[str, Any]]]:
        resources = generation_worker_resources(self.cfg.runtime.ray, index)
        handle = start_actor(GenerationWorker, resources, self.cfg, index, concurrency=generation_concurrency(self.cfg))
        return WorkerSlot(index, handle), handle.ready.remote()

    def create_replacement(self) -> tuple[WorkerSlot, ObjectRef[dict[str, Any]]]:
        """Start a new worker in the background: ``(slot, ready reference)``. It joins the pool only through
        :meth:`add_replacement`, after it has loaded the current weights; until then :meth:`shutdown` still
        stops it."""
        slot, ready = self._create(self._allocate_index())
        with self._lock:
            self._starting.append(slot)
        return slot, ready

    def start_replacement(self) -> WorkerSlot:
        """Blocking: a new worker, started and holding the current weights (not yet in the pool)."""
        slot, ready = self.create_replacement()
        try:
            wait_until_started({f"generation worker {slot.index}": ready}, self.startup_timeout_s)
            weights, version = self.weights, self.version
            if weights is not None:
                ray.get(slot.handle.load_weights.remote(weights[0], version))
                slot.version = version
        except BaseException:
            self.discard_replacement(slot)
            raise
        return slot

    def discard_replacement(self, slot: WorkerSlot) -> None:
        """Stop a replacement that failed to come up."""
        with self._lock:
            if slot in self._starting:
                self._starting.remove(slot)
        kill_actor(slot.handle)

    def remove(self, slot: WorkerSlot) -> bool:
        """Take a lost worker out (and make sure it is stopped, should it only be unreachable); False when someone
        already did (then they also replace it)."""
        with self._lock:
            if slot not in self.workers:
                return False
            self.workers.remove(slot)
        kill_actor(slot.handle)
        return True

    def add_replacement(self, slot: WorkerSlot, replaced: int | None) -> None:
        with self._lock:
            self._starting.remove(slot)
            self.workers.append(slot)
            self.restarts += 1
        was = f" in place of worker {replaced}" if replaced is not None else ""
        self.on_event(f"generation worker {slot.index} started{was} at weight version {slot.version}")

    def replace(self, slot: WorkerSlot) -> None:
        """Blocking (sync mode and evaluation): swap a dead worker for a fresh one with the current weights."""
        if self.remove(slot):
            self.on_event(f"generation worker {slot.index} died; starting a replacement")
            self.add_replacement(self.start_replacement(), slot.index)

    def shutdown(self) -> None:
        with self._lock:
            slots = [*self.workers, *self._starting]
            self.workers.clear()
            self._starting.clear()
        with contextlib.suppress(Exception):  # a worker that is dead or stuck is killed all the same
            ray.get([slot.handle.shutdown.remote() for slot in slots], timeout=SHUTDOWN_TIMEOUT_S)
        for slot in slots:
            kill_actor(slot.handle)

    # --- weights ---------------------------------------------------------------------------------------------------
    def set_weights(self, weights: WeightRefs, version: int) -> None:
        """Record the current weights (``[ObjectRef]``) and version; replacements load these."""
        if version < self.version:
            raise ValueError(f"weight version {version} is older than the pool's {self.version}; versions only grow")
        self.weights, self.version = weights, version

    def publish(self, weights: WeightRefs, version: int) -> None:
        """Blocking: every worker loads ``weights`` (one stored copy); lost workers are replaced."""
        self.set_weights(weights, version)
        loads = [(slot, slot.handle.load_weights.remote(weights[0], version)) for slot in list(self.workers)]
        for slot, ref in loads:
            try:
                ray.get(ref)
                slot.version = version
            except ray.exceptions.RayActorError:
                self.replace(slot)

    def idle_worker(self) -> WorkerSlot | None:
        """The idle worker with the newest weights (the first such one), or None."""
        idle = [slot for slot in self.workers if not slot.busy]
        return max(idle, key=lambda slot: slot.version) if idle else None

    def worker_with_room(self, max_groups: int) -> WorkerSlot | None:
        """Continuous batching: the worker holding the fewest groups (below ``max_groups``; newest weights first
        among equals), or None when every worker is full."""
        open_slots = [slot for slot in self.workers if slot.groups < max_groups]
        return min(open_slots, key=lambda slot: (slot.groups, -slot.version)) if open_slots else None


class RemoteEngine:
    """The session's ``engine`` (a :class:`~groupwise.generation.base.Generator`): generation on a live worker, and
    weights loaded into every worker, blocking. Training runs publish the learner's weights straight from the learner
    actor instead (``RaySession.publish_weights``), so they never pass through the driver."""

    def __init__(self, pool: GenerationPool):
        self.pool = pool

    @property
    def version(self) -> int:
        return self.pool.version

    def load_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Every worker loads ``state`` (put in the object store once) as ``version``."""
        self.pool.publish([ray.put(dict(state))], version)

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        for _ in range(MAX_REPLACEMENTS_PER_CALL + 1):
            if not self.pool.workers:
                break
            slot = self.pool.workers[0]
            try:
                return ray.get(slot.handle.generate.remote(list(requests), sampling))
            except ray.exceptions.RayActorError:
                self.pool.replace(slot)
        raise GenerationWorkerLost("no generation worker is alive to evaluate on, and replacing them failed")


def split_evenly(count: int, parts: int) -> list[range]:
    """``count`` indices in at most ``parts`` contiguous, non-empty ranges whose sizes differ by at most one."""
    parts = max(1, min(parts, count))
    base, extra = divmod(count, parts)
    ranges, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return [r for r in ranges if len(r)]


class RaySyncRollouts:
    """The session's ``rollouts`` on Ray: a round's prompts split over the workers, groups back in order.

    Prompt encoding, sampling settings and the reward function are also available here (driver side), because
    evaluation scores the completions in this process.
    """

    def __init__(self, pool: GenerationPool, local: RolloutWorker):
        self.pool = pool
        self.local = local
        self.sampling = local.sampling
        self.reward_fn = local.reward_fn
        self.reward_kwargs = local.reward_kwargs
        self.group_size = local.group_size

    def encode(self, prompt: Prompt) -> tuple[int, ...]:
        return self.local.encode(prompt)

    def sample_outcomes(
        self, generator: Generator, prompts: Sequence[Prompt], sampling: SamplingParams, k: int, seeds: Sequence[int]
    ) -> list[list[SampleOutcome]]:
        return self.local.sample_outcomes(generator, prompts, sampling, k, seeds)

    def generate_groups(
        self, items: Sequence[LoaderItem], group_ids: Sequence[int], attempts: Sequence[int] | None = None,
        start_versions: Sequence[int] | None = None,
    ) -> list[Group]:  # fmt: skip
        """Like :meth:`groupwise.trainer.rollout.RolloutWorker.generate_groups`, on the worker actors."""
        items, group_ids = list(items), list(group_ids)
        attempts = list(attempts) if attempts is not None else [0] * len(items)
        starts = list(start_versions) if start_versions is not None else [self.pool.version] * len(items)
        if not len(items) == len(group_ids) == len(attempts) == len(starts):
            raise ValueError(f"{len(items)} prompts, {len(group_ids)} group ids, {len(attempts)} attempts and "
                             f"{len(starts)} start versions")  # fmt: skip
        shards = split_evenly(len(items), len(self.pool.workers))
        results: dict[int, list[Group]] = {}
        for _ in range(MAX_REPLACEMENTS_PER_CALL + 1):
            todo = [i for i in range(len(shards)) if i not in results]
            if not todo or not self.pool.workers:
                break
            workers = list(self.pool.workers)
            calls = []
            for n, i in enumerate(todo):
                slot, shard = workers[n % len(workers)], shards[i]
                pick = ([items[k] for k in shard], [group_ids[k] for k in shard], [attempts[k] for k in shard],
                        [starts[k] for k in shard])  # fmt: skip
                calls.append((i, slot, slot.handle.generate_groups.remote(*pick)))
            self._collect(calls, results)
        missing = [i for i in range(len(shards)) if i not in results]
        if missing:
            raise GenerationWorkerLost(
                f"generation workers kept dying: {len(missing)} of {len(shards)} shards of the round could not be "
                f"generated after {MAX_REPLACEMENTS_PER_CALL} replacements"
            )
        return [group for i in range(len(shards)) for group in results[i]]

    def _collect(
        self, calls: list[tuple[int, WorkerSlot, ObjectRef[list[Group]]]], results: dict[int, list[Group]]
    ) -> None:
        dead: list[WorkerSlot] = []
        for i, slot, ref in calls:
            try:
                results[i] = ray.get(ref)
            except ray.exceptions.RayActorError:
                if slot not in dead:
                    dead.append(slot)
        for slot in dead:
            self.pool.replace(slot)
