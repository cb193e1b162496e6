"""The two Ray actors of a run: a generation worker (engine + its own model copy + scoring) and the learner
(policy + optimizer).

Both build their parts from the run config exactly as the embedded runtime does (same seed, same loaders), so
the same config gives the same models, samples and updates wherever they run. Plain classes: the runtime turns
them into actors with :func:`start_actor`, which sets each one's CPU and GPU reservation.

The learner publishes its weights with one ``ray.put`` per version and returns the reference wrapped in a list
(a bare returned reference would be resolved); every generation worker then loads that single stored copy.

With ``generation.continuous_batching`` a generation worker is a *threaded* actor (:func:`generation_concurrency`
calls at once) around a generation stream on its own thread: every ``generate_group_outcomes`` call joins the
running decode loop and returns as soon as its own groups are done, ``load_weights`` is accepted while calls run
(applied at a token boundary with ``async.partial_rollouts: continue``, after the running rows otherwise), and
``progress`` reports what the running attempts generated so far, for the driver's checkpoints.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import torch

from groupwise.batch import RowBatch
from groupwise.generation.factory import shutdown_generator
from groupwise.model.lora import generator_state_dict, load_trained_state_dict, trained_state_dict
from groupwise.runtime.learner_ranks import LearnerRankDied, RankCommands, build_rank_learner, free_port
from groupwise.runtime.ray.cluster import ActorHandle, ActorResources, ray
from groupwise.runtime.ray.stream_worker import StreamedWorker
from groupwise.trainer.builder import (
    build_components,
    build_learner,
    load_policy_from_config,
    weights_shared_with_engine,
)
from groupwise.types import Completion, GenerationRequest, Group, LoaderItem, SamplingParams

if TYPE_CHECKING:
    from ray import ObjectRef

    from groupwise.config import RunConfig

# The generator's weights in the object store: one reference, in a list so Ray passes the reference as is.
WeightRefs: TypeAlias = "list[ObjectRef[dict[str, torch.Tensor]]]"


def _where() -> dict[str, Any]:
    return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}


def _cpu_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().cpu() for name, tensor in state.items()}


def groups_per_streamed_worker(cfg: RunConfig) -> int:
    """Continuous batching: groups the driver keeps on one worker at once — a full batch of slots
    (``generation.micro_batch_groups``) and as many waiting in its stream, so a freed slot is refilled at the next
    token boundary rather than after a round trip to the driver."""
    return 2 * cfg.generation.micro_batch_groups


def generation_concurrency(cfg: RunConfig) -> int:
    """Calls a generation worker takes at once: 1, or with continuous batching one per group it may hold plus
    a weight load, a progress read, a cancel and evaluation."""
    return groups_per_streamed_worker(cfg) + 4 if cfg.generation.continuous_batching else 1


class GenerationWorker:
    """An engine with its own model copy, and the reward function: turns prompts into scored groups."""

    def __init__(self, cfg: RunConfig, index: int):
        torch.manual_seed(cfg.run.seed)
        parts = build_components(cfg)
        if cfg.model.lora.enabled:  # freeze what an embedded engine's copy shares with the policy LoRA freezes: on
            # CPU frozen weights take another prefill kernel, and the worker must sample as the embedded engine does
            for parameter in weights_shared_with_engine(cfg, parts.policy.model):
                parameter.requires_grad_(False)
        self.index = index
        self.engine = parts.engine
        self.rollouts = parts.rollouts
        self.stream: StreamedWorker | None = StreamedWorker(parts, cfg) if parts.streaming.available else None
        self.stream_reason = parts.streaming.reason
        # A threaded actor without a stream (a model without the fast step) runs one engine call at a time.
        self._engine_lock = threading.Lock()

    def ready(self) -> dict[str, Any]:
        return {"index": self.index, "version": self.engine.version, "streaming": self.stream is not None,
                "stream_reason": self.stream_reason, **_where()}  # fmt: skip

    def generate_groups(
        self, items: Sequence[LoaderItem], group_ids: Sequence[int], attempts: Sequence[int] | None = None,
        start_versions: Sequence[int] | None = None,
    ) -> list[Group]:  # fmt: skip
        return self.rollouts.generate_groups(items, group_ids, attempts, start_versions)

    def generate_group_outcomes(
        self, items: Sequence[LoaderItem], group_ids: Sequence[int], attempts: Sequence[int],
        start_versions: Sequence[int] | None = None, prefixes: Sequence[tuple] | None = None,
    ) -> list[Group | Exception]:  # fmt: skip
        """Groups, with each prompt's own reward failure in its place (the async client fails only that prompt);
        ``start_versions[i]``: the version the attempt was dispatched at (the engine's current one when omitted);
        with a stream, ``prefixes[i]`` continues the samples of a resumed attempt."""
        if start_versions is None:
            start_versions = [self.engine.version] * len(items)
        if self.stream is not None:
            return self.stream.outcomes(items, group_ids, attempts, start_versions, prefixes)
        if prefixes and any(prefixes):
            raise ValueError("this worker has no generation stream, so it cannot continue a resumed attempt")
        with self._engine_lock:
            return list(self.rollouts.generate_group_outcomes(items, group_ids, attempts, start_versions))

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingParams) -> list[list[Completion]]:
        if self.stream is not None:  # evaluation beside the running stream (the built-in engine parks it meanwhile)
            return self.stream.stream.generator_for_evaluation().generate(requests, sampling)
        with self._engine_lock:
            return self.engine.generate(requests, sampling)

    def load_weights(self, state: Mapping[str, torch.Tensor], version: int) -> int:
        if self.stream is not None:
            self.stream.load_weights(lambda: self.engine.load_weights(state, version))
        else:
            with self._engine_lock:
                self.engine.load_weights(state, version)
        return version

    def cancel_groups(self, group_ids: Sequence[int]) -> None:
        """Stop generating groups whose requester gave up (continuous batching; otherwise nothing to stop)."""
        if self.stream is not None:
            self.stream.cancel(group_ids)

    def progress(self) -> dict[int, dict[str, Any] | None]:
        """What each running attempt generated so far, by group id (checkpoint data; empty without a stream)."""
        return self.stream.progress_by_group() if self.stream is not None else {}

    def shutdown(self) -> None:
        """Stop the engine's own processes (vLLM's) before the actor is killed; nothing for the built-in engine."""
        shutdown_generator(self.engine)


class LearnerWorker:
    """The policy being trained, its optimizer and LR schedule (a :class:`~groupwise.trainer.learner.Learner`)."""

    def __init__(self, cfg: RunConfig):
        torch.manual_seed(cfg.run.seed)
        policy = load_policy_from_config(cfg)
        self.learner = build_learner(cfg, policy.model)

    def ready(self) -> dict[str, Any]:
        return {"version": self.learner.version, "logprob_path": self.learner.logprob_path, **_where()}

    def train_chunk(self, rows: RowBatch) -> None:
        self.learner.train_chunk(rows)

    def finish_step(self) -> tuple[dict[str, float], int]:
        metrics = self.learner.finish_step()
        return metrics, self.learner.version

    def publish_weights(self) -> tuple[WeightRefs, int]:
        """Put the generator's weights (adapters merged) in the object store once: ``([reference], version)``."""
        return [ray.put(self.generator_state())], self.learner.version

    def generator_state(self) -> dict[str, torch.Tensor]:
        return _cpu_state(generator_state_dict(self.learner.model))

    def model_state(self) -> dict[str, torch.Tensor]:
        """What a checkpoint stores: every weight, or the LoRA adapter only."""
        return _cpu_state(trained_state_dict(self.learner.model))

    def load_model_state(self, state: Mapping[str, torch.Tensor]) -> None:
        load_trained_state_dict(self.learner.model, state)

    def optimizer_state(self) -> dict[str, Any]:
        return self.learner.state_dict()

    def load_optimizer_state(self, state: Mapping[str, Any]) -> int:
        self.learner.load_state_dict(state)
        return self.learner.version


class LearnerRankWorker(LearnerWorker):
    """One rank of a data-parallel learner (``learner.num_ranks`` > 1; docs/distributed.md).

    Built in two calls: the constructor only records its place, :meth:`join` builds the rank's learner in the
    process group that meets at rank 0's address (every rank's ``join`` runs at once: joining blocks until all
    have). Rank 0 is the actor the driver calls, with the single learner's methods: each runs the same command
    on every peer (``run``) and on itself, so the driver's learner handle does not change. A peer that dies
    fails rank 0's call with :class:`~groupwise.runtime.learner_ranks.LearnerRankDied` naming it.
    """

    def __init__(self, cfg: RunConfig, rank: int, world_size: int):  # not super(): join() builds the learner
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.peers: list[ActorHandle] = []  # the other ranks

    def address(self) -> tuple[str, int]:
        """Where the group meets (called on rank 0): this node's address and a free port on it."""
        return ray.util.get_node_ip_address(), free_port()

    def join(self, host: str, port: int, peers: Sequence[ActorHandle]) -> dict[str, Any]:
        torch.manual_seed(self.cfg.run.seed)
        self.learner = build_rank_learner(self.cfg, self.rank, self.world_size, host, port, cuda_index=0,
                                          share_cpus=False)  # Ray shows each actor only its own GPU
        self.commands = RankCommands(self.learner)
        self.peers = list(peers)
        return {"version": self.learner.version, "logprob_path": self.learner.warm_up(), **_where()}

    def run(self, command: str, *args: Any) -> Any:  # Any: the arguments and result of any RankCommands method
        """A peer's part of a command."""
        return getattr(self.commands, command)(*args)

    def _everywhere(self, command: str, *args: Any) -> Any:  # Any: as in run
        refs = [peer.run.remote(command, *args) for peer in self.peers]
        try:
            result = getattr(self.commands, command)(*args)
        except BaseException:
            self._raise_lost_peer(command, refs, wait_s=self.cfg.learner.collective_timeout_s)
            raise
        self._raise_lost_peer(command, refs, wait_s=None)
        return result

    # Any: the peers' parts of any command (only their errors are read).
    def _raise_lost_peer(self, command: str, refs: list[ObjectRef[Any]], wait_s: float | None) -> None:
        """Wait for the peers' parts; a peer that died raises LearnerRankDied naming it."""
        for rank, ref in enumerate(refs, start=1):
            try:
                ray.get(ref, timeout=wait_s)
            except ray.exceptions.RayActorError as err:
                raise LearnerRankDied(
                    f"learner rank {rank} of {self.world_size} (a Ray actor) died while running {command}; the "
                    "run stops here and keeps its newest complete checkpoint (continue with --resume)"
                ) from err
            except Exception:  # noqa: BLE001 — the peer's own error or a timeout: rank 0's error says enough
                if wait_s is None:
                    raise

    def train_chunk(self, rows: RowBatch) -> None:
        self._everywhere("train_chunk", rows)

    def finish_step(self) -> tuple[dict[str, float], int]:
        return self._everywhere("finish_step")

    def generator_state(self) -> dict[str, torch.Tensor]:
        return self._everywhere("generator_state")

    def model_state(self) -> dict[str, torch.Tensor]:
        return self._everywhere("model_state")

    def load_model_state(self, state: Mapping[str, torch.Tensor]) -> None:
        self._everywhere("load_model_state", dict(state))

    def optimizer_state(self) -> dict[str, Any]:
        return self._everywhere("state_dict")

    def load_optimizer_state(self, state: Mapping[str, Any]) -> int:
        return self._everywhere("load_state_dict", state)


# Any: cls's own arguments, passed through.
def start_actor(cls: type, resources: ActorResources, *args: Any, concurrency: int = 1) -> ActorHandle:
    """Create ``cls(*args)`` as a Ray actor reserving ``resources``, taking ``concurrency`` calls at once (a threaded
    actor when above 1); returns its handle (it starts in the background: wait on its ``ready`` call)."""
    # No restarts by Ray: a lost generation worker is replaced by the runtime (which counts it and reloads the
    # current weights), and a lost learner ends the run (its optimizer state is gone).
    options = {**resources.options(), **({"max_concurrency": concurrency} if concurrency > 1 else {})}
    return _remote_class(cls).options(**options).remote(*args)


@functools.cache
def _remote_class(cls: type) -> Any:  # Any: a Ray actor class (its .options(...).remote(...) gives a handle)
    return ray.remote(max_restarts=0, max_task_retries=0)(cls)


def kill_actor(handle: ActorHandle) -> None:
    """Stop an actor; one that is already dead (or a cluster already gone) is fine."""
    with contextlib.suppress(Exception):
        ray.kill(handle)
