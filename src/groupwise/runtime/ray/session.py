"""A training session on Ray (``runtime.backend: ray``): the learner and the generation engines are actors.

:func:`build_ray_session` returns a :class:`RaySession`: the same :class:`~groupwise.trainer.session.Session` the sync
loop and the async runtime drive, with Ray-backed parts that have the methods they call — ``learner``
(:class:`~groupwise.runtime.ray.clients.RayLearner`), ``rollouts``
(:class:`~groupwise.runtime.ray.pool.RaySyncRollouts`), ``engine``
(:class:`~groupwise.runtime.ray.pool.RemoteEngine`) and ``policy`` (a
:class:`~groupwise.trainer.remote_policy.RemotePolicy`, whose model state
lives in the learner actor). Only ``publish_weights`` differs: the learner puts its weights in the object
store itself and the workers load them, so the weights never pass through the driver. Checkpoints fetch the
model and optimizer state from the learner actor; resuming sends them back.

The driver keeps the tokenizer, the task, the reward function (evaluation scores here), the prompt loader, the
run directory and one CPU copy of the policy, which it refreshes from the learner only to write ``final/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from groupwise.config import ConfigError, ConfigIssue
from groupwise.data.skipping_loader import build_training_loader
from groupwise.generation.base import StreamSupport
from groupwise.model.lora import lora_config
from groupwise.run.metrics import MetricsWriter
from groupwise.run.rundir import RunDir
from groupwise.run.trackers import config_trackers
from groupwise.runtime.clients import AsyncClients
from groupwise.runtime.ray.actors import (
    LearnerRankWorker,
    LearnerWorker,
    groups_per_streamed_worker,
    kill_actor,
    start_actor,
)
from groupwise.runtime.ray.clients import LearnerModel, RayLearner, RayRolloutClient, RayTrainer
from groupwise.runtime.ray.cluster import (
    ActorHandle,
    RayCluster,
    check_schedulable,
    connect_cluster,
    learner_resources,
    run_resources,
    wait_until_started,
)
from groupwise.runtime.ray.pool import GenerationPool, RaySyncRollouts, RemoteEngine
from groupwise.trainer.builder import Components, build_components
from groupwise.trainer.preflight import Inputs, check_train_start
from groupwise.trainer.remote_policy import RemotePolicy
from groupwise.trainer.session import Session

if TYPE_CHECKING:
    from peft import LoraConfig

    from groupwise.config import RunConfig

DEFAULT_STARTUP_TIMEOUT_S = 300.0


@dataclass
class RaySession(Session):
    """A :class:`~groupwise.trainer.session.Session` whose learner and generators are Ray actors. Call :meth:`close`
    when done (it stops the actors, and the cluster if this session started it)."""

    learner: RayLearner  # narrowed: the learner actor's driver-side handle
    rollouts: RaySyncRollouts  # narrowed: the workers, with the driver's own rollout worker for encoding
    cluster: RayCluster = field(kw_only=True)
    pool: GenerationPool = field(kw_only=True)
    learner_peers: list[ActorHandle] = field(default_factory=list)  # learner ranks 1.. (rank 0 is the learner's)
    _closed: bool = field(default=False, repr=False)

    def publish_weights(self, version: int | None = None) -> None:
        """The learner stores its weights once; every generation worker loads them (``version``: the one the
        caller expects them to be)."""
        weights, published = self.learner.publish_weights()
        if version is not None and published != version:
            raise RuntimeError(f"a weight sync asked for version {version}, but the learner published {published}")
        self.pool.publish(weights, published)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.pool.shutdown()
        for handle in (self.learner.handle, *self.learner_peers):
            kill_actor(handle)
        self.cluster.shutdown()


def check_device_resources(cfg: RunConfig) -> None:
    """A CUDA ``model.device`` needs GPUs reserved: Ray hides every GPU from an actor that reserves none."""
    if not cfg.model.device.startswith("cuda"):
        return
    r = cfg.runtime.ray
    issues = [
        ConfigIssue(key, value, f"model.device={cfg.model.device!r} needs a GPU in every actor, and Ray shows an "
                    "actor only the GPUs it reserves", f"set {key} to 1 (or a fraction to share a GPU), or "
                    "model.device: auto to run actors without GPUs on CPU")
        for key, value in (("runtime.ray.gpus_per_generation_worker", r.gpus_per_generation_worker),
                           ("runtime.ray.learner_gpus", r.learner_gpus))
        if value == 0
    ]  # fmt: skip
    if issues:
        raise ConfigError(issues)


def build_ray_session(
    cfg: RunConfig,
    *,
    resume: bool = False,
    resume_from: Path | None = None,
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    inputs: Inputs | None = None,
) -> RaySession:
    """Join the cluster, start the learner and the generation workers, and wire a :class:`RaySession`.

    The input and run-directory checks run first (``inputs``: already made by the caller), before any actor starts.
    """
    if cfg.runtime.backend != "ray":
        raise ValueError(f"build_ray_session needs runtime.backend: ray, got {cfg.runtime.backend!r}")
    inputs = inputs or check_train_start(cfg, resume=resume, resume_from=resume_from)
    check_device_resources(cfg)
    cluster = connect_cluster(cfg.runtime.ray.address)
    learners: list[ActorHandle] = []
    pool: GenerationPool | None = None
    try:
        check_schedulable(run_resources(cfg.runtime.ray, cfg.learner.num_ranks))
        # Start every actor first: it overlaps their model loading with the driver's own set-up.
        learners, learner_ready = _start_learners(cfg, startup_timeout_s)
        learner_handle = learners[0]
        pool = GenerationPool(cfg, startup_timeout_s)
        ready = {**learner_ready, **pool.launch(cfg.runtime.ray.num_generation_workers)}
        torch.manual_seed(cfg.run.seed)
        parts = build_components(driver_config(cfg), inputs=inputs)
        started = wait_until_started(ready, startup_timeout_s)
        parts.streaming = worker_streaming(started)  # the workers' generators say whether they stream
        session = _assemble(cfg, cluster, pool, RayLearner(learner_handle), parts, resume, resume_from)
        session.learner_peers = learners[1:]
        session.events.event(f"learner logprobs: {started[next(iter(learner_ready))]['logprob_path']}")
        return session
    except BaseException:
        if pool is not None:
            pool.shutdown()
        for handle in learners:
            kill_actor(handle)
        cluster.shutdown()
        raise


def driver_config(cfg: RunConfig) -> RunConfig:
    """The config the driver builds its own components from: the policy on its CPU (it encodes prompts and holds
    the tokenizer; it never samples: the workers do). Under another backend than the built-in engine the driver
    still builds the built-in one (a CPU engine nothing calls, without a stream to probe), not a second copy of
    the workers' engine."""
    update: dict[str, Any] = {"model": cfg.model.model_copy(update={"device": "cpu"})}
    if cfg.generation.backend != "builtin":
        update["generation"] = type(cfg.generation)(
            **{**cfg.generation.model_dump(exclude={"backend", "vllm"}), "continuous_batching": False}
        )
    return cfg.model_copy(update=update)


def worker_streaming(started: dict[str, Any]) -> StreamSupport:
    """Whether the generation workers' generators run a stream (every worker builds the same one: the first says)."""
    worker = next(info for role, info in started.items() if role.startswith("generation worker"))
    return StreamSupport(bool(worker["streaming"]), str(worker["stream_reason"]))


def _start_learners(cfg: RunConfig, timeout_s: float) -> tuple[list[ActorHandle], dict[str, Any]]:
    """The learner actor, or ``learner.num_ranks`` rank actors in one process group (rank 0 first, the one the
    driver calls); role → the reference their start-up returns."""
    ray_cfg, num_ranks = cfg.runtime.ray, cfg.learner.num_ranks
    if num_ranks == 1:
        handle = start_actor(LearnerWorker, learner_resources(ray_cfg), cfg)
        return [handle], {"learner": handle.ready.remote()}
    handles = [start_actor(LearnerRankWorker, learner_resources(ray_cfg, r), cfg, r, num_ranks)
               for r in range(num_ranks)]  # fmt: skip
    host, port = wait_until_started({"learner rank 0": handles[0].address.remote()}, timeout_s)["learner rank 0"]
    ready = {f"learner rank {r}": h.join.remote(host, port, handles[1:] if r == 0 else []) for r, h in
             enumerate(handles)}  # fmt: skip
    return handles, ready


def _assemble(
    cfg: RunConfig, cluster: RayCluster, pool: GenerationPool, learner: RayLearner, parts: Components, resume: bool,
    resume_from: Path | None,
) -> RaySession:
    run_dir = RunDir.create(cfg.run.output_dir, cfg.run.name, cfg.to_yaml(), resume=resume or resume_from is not None)
    writer = MetricsWriter(run_dir, trackers=config_trackers(cfg, run_dir.root))
    pool.on_event = writer.event
    rollouts = RaySyncRollouts(pool, parts.rollouts)
    loader = build_training_loader(cfg, parts.task.train_prompts())
    session = RaySession(
        cfg=cfg,
        run_dir=run_dir,
        policy=RemotePolicy(
            LearnerModel(learner), parts.policy.tokenizer, parts.policy,
            lambda: learner.call("merging weights", learner.handle.generator_state.remote()), _lora_config(cfg),
        ),
        engine=RemoteEngine(pool),
        streaming=parts.streaming,  # what the workers' generators said
        learner=learner,
        rollouts=rollouts,
        loader=loader,
        task=parts.task,
        reward_fn=parts.reward_fn,
        events=writer,
        cluster=cluster,
        pool=pool,
    )
    where = f"Ray cluster {cluster.address}: learner + {len(pool.workers)} generation worker(s)"
    try:
        restored = session.begin(resume_from, notes=parts.notes)
    except BaseException:
        run_dir.discard_if_new()
        raise
    if not restored:
        # Workers built their own copy from the same config and seed; loading the learner's makes it certain.
        session.publish_weights()
    writer.event(where)
    return session


def _lora_config(cfg: RunConfig) -> LoraConfig | None:
    lora = cfg.model.lora
    return lora_config(lora.rank, lora.alpha, lora.dropout, lora.target_modules) if lora.enabled else None


def ray_clients(session: RaySession) -> AsyncClients:
    """The async controller's rollout and trainer clients for a :class:`RaySession`: with
    ``generation.continuous_batching`` (and a model the stream takes: the workers build the same one) a call per
    group on streamed workers, otherwise batches of ``generation.micro_batch_groups``."""
    cfg, learner, local = session.cfg, session.learner, session.rollouts.local
    if session.streaming.available:
        from groupwise.runtime.ray.stream_client import RayStreamedRollouts

        streamed = RayStreamedRollouts(
            session.pool, groups_per_streamed_worker(cfg), learner.publish_weights, local, session.events.event
        )
        return AsyncClients(streamed, RayTrainer(learner), streamed=True)
    rollouts = RayRolloutClient(session.pool, cfg.generation.micro_batch_groups, learner.publish_weights)
    return AsyncClients(rollouts, RayTrainer(learner))
