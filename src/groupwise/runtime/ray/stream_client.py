"""The async controller's rollout client on Ray with continuous batching: one actor call per group, many at once.

Each generation worker is a threaded actor whose calls feed one generation stream
(:mod:`groupwise.runtime.ray.stream_worker`), so the driver does not batch: :class:`RayStreamedRollouts` sends every
waiting group as a call of its own to the worker holding the fewest groups, up to
:func:`~groupwise.runtime.ray.actors.groups_per_streamed_worker` per worker (a full batch of slots and as many
waiting in the worker's stream). Each call returns as soon as its group's G completions are done and scored, so
a group is handed to the controller without waiting for its batch mates. ``load_weights`` reaches a worker while its
calls run (another thread of the actor) and is applied at the stream's next token boundary
(``async.partial_rollouts: continue``) or after its running rows finish (``off``).

Why a threaded actor rather than, say, an async actor or a second actor per worker: the engine decodes in a
thread of its own and every call only waits on an event, so threads cost nothing while idle, and the weights and
the decode loop stay in one process (a second actor would need a second model copy or shared memory). Ray
runs a threaded actor's calls in its own thread pool of ``max_concurrency`` threads, sized to the groups a worker
may hold plus the control calls, so a weight load is never queued behind generation calls.

A cancelled rollout (the controller aborted a stale attempt, or the run stops) cancels its group on the worker,
whose rows then leave their slots. For checkpoints, :meth:`RayStreamedRollouts.fetch_progress` asks every worker
what its running attempts generated so far; a resumed attempt is continued (``resume``) on whichever worker takes
it. Worker loss and replacement are :class:`~groupwise.runtime.ray.clients.RayRolloutClient`'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from groupwise.controller.interfaces import LoaderItem
from groupwise.runtime.inflight import continuation, prefix_tokens
from groupwise.runtime.ray.actors import WeightRefs
from groupwise.runtime.ray.clients import Outcomes, RayRolloutClient
from groupwise.runtime.ray.pool import GenerationPool, WorkerSlot
from groupwise.runtime.rollout_queue import PendingRollout, charge_reported
from groupwise.types import Group

if TYPE_CHECKING:
    from ray import ObjectRef

    from groupwise.trainer.rollout import RolloutWorker

# How long a checkpoint waits for the workers' progress; past it, their attempts are saved to start over.
PROGRESS_TIMEOUT_S = 30.0


class RayStreamedRollouts(RayRolloutClient):
    """``RolloutClient`` over streamed generation workers (see the module docstring)."""

    def __init__(
        self, pool: GenerationPool, groups_per_worker: int, publish: Callable[[], tuple[WeightRefs, int]],
        local: RolloutWorker, on_event: Callable[[str], None] = lambda message: None,
    ) -> None:  # fmt: skip
        super().__init__(pool, 1, publish)
        self.groups_per_worker = max(1, groups_per_worker)
        self.local = local  # the driver's RolloutWorker: encodes prompts and seeds as the workers do
        self.on_event = on_event
        self.resumed_tokens = 0  # tokens of resumed attempts that were continued, not generated again
        self._holding_since: dict[int, float] = {}  # worker index -> when it last went from no group to some

    async def resume(
        self, prompt: LoaderItem, group_id: int, attempt: int, start_version: int, progress: dict[str, Any]
    ) -> Group:
        """Continue a checkpointed attempt: its samples so far go to the worker as prefixes."""
        prefixes = continuation(self.local, prompt, group_id, attempt, progress, self.on_event)
        self.resumed_tokens += prefix_tokens(prefixes)
        return await self._queue.submit(prompt, group_id, attempt, start_version, prefixes)

    def _fill_workers(self) -> None:
        """Every waiting group goes, as a call of its own, to the worker holding the fewest groups."""
        while self._queue.items and (slot := self.pool.worker_with_room(self.groups_per_worker)) is not None:
            pending = self._queue.take(1)
            if not slot.groups:
                self._holding_since[slot.index] = time.perf_counter()
            slot.groups += 1
            future = pending[0].future
            future.add_done_callback(partial(self._cancelled, slot=slot, group_id=pending[0].group_id))
            self._spawn(self._run_batch(slot, pending), f"ray-group-{pending[0].group_id}-worker-{slot.index}")

    @staticmethod
    def _cancelled(future: asyncio.Future[Group], *, slot: WorkerSlot, group_id: int) -> None:
        """The requester gave up on ``group_id``: free its rows on the worker (a dead worker ignores it)."""
        if future.cancelled():
            slot.handle.cancel_groups.remote([group_id])

    def _call(self, slot: WorkerSlot, batch: list[PendingRollout]) -> ObjectRef[list[Group | Exception]]:
        return slot.handle.generate_group_outcomes.remote(
            [p.item for p in batch], [p.group_id for p in batch], [p.attempt for p in batch],
            [p.start_version for p in batch], [p.prefixes for p in batch],
        )  # fmt: skip

    def _charge(self, batch: list[PendingRollout], outcomes: Outcomes, seconds: float) -> None:
        """A group's cost is what its worker's stream attributed to it (calls overlap: their wall time is not)."""
        charge_reported(batch, outcomes)

    def _release(self, slot: WorkerSlot, batch: list[PendingRollout], seconds: float) -> None:
        """Busy time is the time a worker held at least one group (its stream decodes them all at once)."""
        slot.groups -= len(batch)
        if not slot.groups:
            since = self._holding_since.pop(slot.index, time.perf_counter() - seconds)
            self.busy_seconds += (time.perf_counter() - since) / max(1, len(self.pool.workers))

    async def fetch_progress(self) -> dict[int, dict[str, Any] | None]:
        """What every running attempt generated so far, by group id, from every worker holding groups (a worker
        that does not answer within ``PROGRESS_TIMEOUT_S``, or died, contributes nothing: its attempts start
        over on resume)."""
        slots = [slot for slot in self.pool.workers if slot.groups]
        replies = await asyncio.gather(
            *(asyncio.wait_for(slot.handle.progress.remote(), PROGRESS_TIMEOUT_S) for slot in slots),
            return_exceptions=True,
        )
        progress: dict[int, dict[str, Any] | None] = {}
        for slot, reply in zip(slots, replies, strict=True):
            if isinstance(reply, BaseException):
                self.on_event(f"checkpoint: generation worker {slot.index} gave no progress ({reply!r}); its "
                              "running attempts will start over if the run resumes from this checkpoint")  # fmt: skip
            else:
                progress.update(reply)
        return progress
