"""Run a session in async mode on the embedded runtime: the real controller, engine and learner in-process."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from typing import Any, NoReturn

import torch

from groupwise.algo.waste import describe_totals
from groupwise.chunks import TrainChunk
from groupwise.controller.controller import Controller, ControllerSummary, build_controller
from groupwise.controller.failures import FailureBudgets
from groupwise.controller.interfaces import ResumableRollouts
from groupwise.controller.settings import ControllerSettings
from groupwise.generation.factory import open_stream
from groupwise.run.async_checkpoint import CONTROLLER_PIECE, ItemDecoder, boundary_snapshot, controller_state
from groupwise.run.progress import RunProgress
from groupwise.runtime.clients import AsyncClients, RuntimeRollouts, RuntimeTrainer, WatchedRollouts
from groupwise.runtime.daemon_worker import DaemonWorker
from groupwise.runtime.embedded import EmbeddedRollouts, EmbeddedTrainer
from groupwise.runtime.inflight import attach_progress, kept_tokens
from groupwise.runtime.streamed import StreamedRollouts
from groupwise.runtime.watchdog import (
    IDLE_STALL_S,
    RunStalled,
    first_to_fail,
    run_watched,
    watch_liveness,
    watch_progress,
)
from groupwise.trainer.rollout import RolloutWorker
from groupwise.trainer.session import Session
from groupwise.types import Group


def run_async(session: Session) -> ControllerSummary:
    """Train ``session`` with the async single controller until ``run.max_steps`` or the end of data."""
    cfg = session.cfg
    session.fates.create()  # a run that fails before its first decision (in evaluation, say) still has the file
    if session.state.step == 0 and cfg.eval.at_start:
        session.evaluate(step=0)
    # Generation and training run at the same time in two threads; each gets half of the intra-op threads,
    # otherwise their OpenMP teams oversubscribe the cores and both crawl.
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads // 2))
    try:
        with session.progress() as progress:
            summary = asyncio.run(_run(session, progress))
    finally:
        torch.set_num_threads(threads)
    session.events.event(
        f"async run stopped ({summary.stop_reason}) after {summary.steps_trained} steps; fates: {summary.fates}"
    )
    session.events.event(describe_totals(summary.fates.generation.totals()))
    session.finish()
    return summary


async def _run(session: Session, progress: RunProgress) -> ControllerSummary:
    clients = _runtime_clients(session)
    engine = session.engine
    if clients.stream is not None:  # evaluation shares the engine with the running stream: it parks the stream
        session.engine = clients.stream.generator_for_evaluation()
    try:
        return await _run_controller(session, progress, clients)
    finally:
        session.engine = engine


async def _run_controller(session: Session, progress: RunProgress, clients: AsyncClients) -> ControllerSummary:
    cfg = session.cfg
    rollouts, trainer = clients.rollouts, clients.trainer
    meter = _StepMeter(rollouts, trainer)
    resumable = rollouts if isinstance(rollouts, ResumableRollouts) else None

    async def on_step_end(step: int, metrics: dict[str, float], chunks: list[TrainChunk]) -> None:
        groups = [group for chunk in chunks for group in chunk.groups]
        metrics.update(meter.step_metrics())
        metrics.update(faults.step_metrics())
        if cfg.async_.partial_rollouts == "continue":
            metrics["staleness/token_mean"] = token_staleness_mean(step, groups)
        session.state.step = step + 1
        # The rollout pump keeps running while end_step writes a checkpoint in a thread: capture what the
        # checkpoint needs of the controller, loader and fates now, in one synchronous block.
        snapshot = boundary_snapshot(step + 1, controller, session.loader, session.fates)
        if resumable is not None:  # what each running attempt generated so far is saved with it: a resume continues
            attach_progress(snapshot["extra"][CONTROLLER_PIECE], await resumable.fetch_progress())
        session.boundary_snapshot = snapshot
        # Evaluation uses the engine: hold it so no rollout batch runs on it meanwhile (a stream is paused instead,
        # by its evaluation generator or the streamed worker, only while evaluation generates).
        async with contextlib.nullcontext() if clients.streamed else rollouts.engine_lock:
            await step_end.run(session.end_step, step, metrics, chunks)
        progress.update(step + 1, session.last_metrics)

    settings = ControllerSettings.from_config(cfg, start_step=session.state.step)
    controller = build_controller(
        settings,
        session.loader,
        rollouts,
        trainer,
        on_step_end=on_step_end,
        on_fate=session.fates.write_controller_record,
        state=_resume_state(session),
        decode=ItemDecoder(session.task.train_prompts()),
    )
    _log_resume(session, controller)
    faults = _FaultMeter(controller.ctx.budgets, rollouts)
    step_end = DaemonWorker("groupwise-step-end")  # metrics, evaluation, checkpoints

    watchdog = _watchdog(session, controller, rollouts)
    grace_s = 60.0  # a run that ends lets the calls in progress finish; a stalled one leaves them to their threads
    try:
        return await run_watched(controller.run(), watchdog)
    except BaseException as error:
        if isinstance(error, RunStalled):
            grace_s = 0.0
        # A failed run accounts its generation too (the controller's shutdown recorded every unsettled attempt).
        session.events.event(describe_totals(controller.fates.generation.totals()))
        raise
    finally:
        await rollouts.close(grace_s)
        await asyncio.to_thread(trainer.close, grace_s)
        await asyncio.to_thread(step_end.close, grace_s)


def _log_resume(session: Session, controller: Controller) -> None:
    """What a resume took over from the checkpoint, in ``events.log``: the controller's notes and the running
    attempts that continue with their tokens so far."""
    for note in controller.resume_notes:
        session.events.event(note)
    continued = controller.continued_attempts()
    if continued:
        session.events.event(
            f"resume: {len(continued)} in-flight attempt(s) continue from the checkpoint with "
            f"{sum(kept_tokens(data) for data in continued)} generated token(s) kept, not generated again"
        )


def _watchdog(
    session: Session, controller: Controller, rollouts: RuntimeRollouts
) -> Coroutine[Any, Any, NoReturn]:
    """What stops a run that makes no progress: nothing committed, trained or returned for
    ``runtime.stall_timeout_s``; on a stream that can lose an answer, also an idle wait past ``IDLE_STALL_S``."""

    def progress_marker() -> tuple[int, ...]:
        return (*controller.progress_marker(), rollouts.calls_returned)

    describe, log = controller.describe_state, session.events.event
    watchdog = watch_progress(progress_marker, session.cfg.runtime.stall_timeout_s, describe, log)
    if isinstance(rollouts, WatchedRollouts):  # a lost answer of the stream: stop within seconds, not stall_s
        watchdog = first_to_fail(watchdog, watch_liveness(rollouts.idle_waits, IDLE_STALL_S, describe, log))
    return watchdog


def token_staleness_mean(version: int, groups: list[Group]) -> float:
    """``Σ (version − v_token) / tokens`` over every completion token of ``groups``: staleness weighted by tokens
    (a partial rollout's later tokens are fresher than its first); 0 when there are no tokens."""
    versions = [v for group in groups for completion in group.completions for v in completion.token_versions]
    return sum(version - v for v in versions) / len(versions) if versions else 0.0


def _resume_state(session: Session) -> dict[str, Any] | None:
    """The controller state of the checkpoint this session resumed from (None for a fresh start)."""
    state = controller_state(session.restored_extra)
    if state is None and session.state.step > 0:
        session.events.event(
            f"resume at step {session.state.step}: the checkpoint holds no async controller state (written by a sync "
            "run?); the controller starts with an empty buffer and spare pool"
        )
        if session.state.carried:
            session.fates.write_groups(
                session.state.carried, "pending", session.state.step, detail="carried by a sync run; unused in async"
            )
    return state


def _runtime_clients(session: Session) -> AsyncClients:
    """The controller's rollout and trainer clients on the configured ``runtime.backend``."""
    cfg = session.cfg
    if cfg.runtime.backend == "ray":
        from groupwise.runtime.ray.session import RaySession, ray_clients  # Ray is imported only when chosen

        assert isinstance(session, RaySession), "runtime.backend: ray runs on the session build_ray_session makes"
        return ray_clients(session)
    trainer = EmbeddedTrainer(session.learner)
    if not isinstance(session.rollouts, RolloutWorker):
        raise TypeError(f"the embedded runtime runs an in-process RolloutWorker, not {type(session.rollouts).__name__}")
    if session.streaming.available:
        stream = open_stream(
            session.engine,
            session.rollouts.sampling,
            max_rows=cfg.generation.micro_batch_groups * cfg.grpo.num_generations_per_prompt,
            partial=cfg.async_.partial_rollouts,
            kv=cfg.async_.partial_rollout_kv,
            reuse_prefixes=cfg.episode.enabled,  # an episode's next turn extends its last: a single-turn row never
        )
        rollouts = StreamedRollouts(session.rollouts, session.generator_weights, stream, session.events.event)
        return AsyncClients(rollouts, trainer, stream, streamed=True)
    embedded = EmbeddedRollouts(session.rollouts, session.generator_weights, cfg.generation.micro_batch_groups)
    return AsyncClients(embedded, trainer)


class _FaultMeter:
    """``rollout/redispatches`` (infra retries the controller made), ``rollout/worker_restarts`` (replacement
    generation workers) and, with a client that continues resumed attempts, ``rollout/resumed_tokens`` (tokens of
    resumed attempts continued rather than generated again) since the previous step closed."""

    def __init__(self, budgets: FailureBudgets, rollouts: RuntimeRollouts):
        self.budgets, self.rollouts = budgets, rollouts
        self.redispatches, self.restarts = budgets.infra_retries, rollouts.worker_restarts
        self.resumed = 0

    def step_metrics(self) -> dict[str, float]:
        redispatches, restarts = self.budgets.infra_retries, self.rollouts.worker_restarts
        metrics = {
            "rollout/redispatches": float(redispatches - self.redispatches),
            "rollout/worker_restarts": float(restarts - self.restarts),
        }
        self.redispatches, self.restarts = redispatches, restarts
        if isinstance(self.rollouts, ResumableRollouts):
            resumed = self.rollouts.resumed_tokens
            metrics["rollout/resumed_tokens"] = float(resumed - self.resumed)
            self.resumed = resumed
        return metrics


class _StepMeter:
    """Wall time per step and how busy generation and training were in it (``perf/*`` metrics)."""

    def __init__(self, rollouts: RuntimeRollouts, trainer: RuntimeTrainer):
        self.rollouts, self.trainer = rollouts, trainer
        self.last = time.perf_counter()
        self.tokens = self.gen_busy = self.train_busy = 0.0

    def step_metrics(self) -> dict[str, float]:
        now = time.perf_counter()
        wall, self.last = now - self.last, now
        tokens = self.rollouts.generated_tokens - self.tokens
        gen = self.rollouts.busy_seconds - self.gen_busy
        train = self.trainer.busy_seconds - self.train_busy
        self.tokens, self.gen_busy, self.train_busy = (
            self.rollouts.generated_tokens, self.rollouts.busy_seconds, self.trainer.busy_seconds
        )
        return {
            "perf/step_seconds": wall,
            "perf/gen_seconds": gen,
            "perf/gen_tokens_per_s": tokens / gen if gen > 0 else 0.0,
            "perf/rollout_idle_fraction": max(0.0, 1.0 - gen / wall) if wall > 0 else 0.0,
            "perf/trainer_idle_fraction": max(0.0, 1.0 - train / wall) if wall > 0 else 0.0,
        }
