"""The rollout and trainer clients as the runtimes drive them: the controller's interfaces plus what a runtime reads
of them (progress for the stall watchdog, the ``perf/*`` and ``rollout/*`` counters, shutdown).

Every runtime client implements these: the embedded ones (:mod:`groupwise.runtime.embedded`,
:mod:`groupwise.runtime.streamed`), the sync loop's (:mod:`groupwise.runtime.sync_run`) and Ray's
(:mod:`groupwise.runtime.ray.clients`, :mod:`groupwise.runtime.ray.stream_client`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from groupwise.controller.interfaces import RolloutClient, TrainerClient
from groupwise.generation.base import RequestStream


class RuntimeRollouts(RolloutClient, Protocol):
    """A rollout client a runtime runs: ``calls_returned`` changes whenever generation makes progress (the stall
    watchdog's marker); ``generated_tokens`` and ``busy_seconds`` feed ``perf/*``; ``worker_restarts`` counts
    replacement generation workers (0 for an in-process engine); ``engine_lock`` is held around evaluation and
    checkpoints when no stream runs."""

    engine_lock: asyncio.Lock

    @property
    def generated_tokens(self) -> int: ...

    @property
    def busy_seconds(self) -> float: ...

    @property
    def calls_returned(self) -> int: ...

    @property
    def worker_restarts(self) -> int: ...

    async def close(self, grace_s: float = 60.0) -> None: ...


@runtime_checkable
class WatchedRollouts(Protocol):
    """A rollout client that can name the answers it awaits from a generator with nothing to do (answers that will
    never come): the runtime's liveness watch stops the run within seconds instead of at ``stall_timeout_s``."""

    def idle_waits(self) -> list[int]: ...


class RuntimeTrainer(TrainerClient, Protocol):
    """A trainer client a runtime runs: ``busy_seconds`` feeds ``perf/trainer_idle_fraction``."""

    @property
    def busy_seconds(self) -> float: ...

    def close(self, grace_s: float = 60.0) -> None: ...


@dataclass
class AsyncClients:
    """What the async runtime drives: the two clients, and the request stream the rollout client feeds when
    generation runs on one (evaluation then parks it instead of taking ``engine_lock``)."""

    rollouts: RuntimeRollouts
    trainer: RuntimeTrainer
    stream: RequestStream | None = None  # an in-process stream the rollout client feeds
    streamed: bool = False  # generation runs on streams (here or in the workers): no engine_lock around evaluation
