"""Run a session in sync mode: the sync loop (:mod:`groupwise.trainer.sync_loop`) on the session's engine and learner.

The loop's clients here are thin: :class:`RoundRollouts` turns the prompts of one round, requested together, into
one ``generate_groups`` call of the session's ``rollouts`` (the in-process rollout worker, or the Ray workers
that split a round among themselves), and the trainer client hands each step's single chunk to the learner.
Nothing overlaps in sync mode, so the trainer runs inline; the generation call runs on a daemon worker thread so
that the stall watchdog (:mod:`groupwise.runtime.watchdog`) can stop a round that never returns
(``runtime.stall_timeout_s``: no generation call returning and no optimizer step for that long). Weight sync is
the session's ``publish_weights``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from groupwise.algo.accumulator import DynamicSamplingExhausted
from groupwise.algo.waste import describe_totals
from groupwise.controller.interfaces import LoaderItem
from groupwise.runtime.daemon_worker import DaemonWorker
from groupwise.runtime.embedded import EmbeddedTrainer
from groupwise.runtime.rollout_queue import RolloutQueue, fail_all, resolve_all
from groupwise.runtime.watchdog import RunStalled, run_watched, watch_progress
from groupwise.trainer.session import Session
from groupwise.trainer.sync_loop import SyncLoop, SyncStep, TrainerState, record_carried_at_end
from groupwise.types import Group

if TYPE_CHECKING:
    from groupwise.runtime.ray.clients import RayTrainer
    from groupwise.trainer.parts import GroupRollouts


class RoundRollouts:
    """``RolloutClient`` over a session's ``rollouts``: the requests waiting together become one
    ``generate_groups`` call, in request order (the sync loop requests a whole round at once)."""

    def __init__(self, worker: GroupRollouts, publish_weights: Callable[[int], None]) -> None:
        self.worker = worker
        self._publish_weights = publish_weights
        self._queue = RolloutQueue(self._serve, "sync-generation")
        self._thread = DaemonWorker("groupwise-sync-generation")  # a stuck round never blocks the run's exit
        self.calls_returned = 0  # generation calls that returned or raised: progress for the stall watchdog
        self.in_progress: list[str] = []  # the prompts of the round being generated, for the watchdog's report

    async def rollout(self, prompt: LoaderItem, group_id: int, attempt: int, start_version: int) -> Group:
        return await self._queue.submit(prompt, group_id, attempt, start_version)

    async def _serve(self) -> None:
        while True:
            await self._queue.wake.wait()
            self._queue.wake.clear()
            batch = self._queue.take(len(self._queue.items))
            self.in_progress = [p.item.prompt.uid for p in batch]
            try:
                groups = await self._thread.run(
                    self.worker.generate_groups,
                    [p.item for p in batch], [p.group_id for p in batch], [p.attempt for p in batch],
                    [p.start_version for p in batch],
                )  # fmt: skip
            except Exception as err:  # noqa: BLE001 — every waiting rollout gets the generator's error
                fail_all(batch, err)
                continue
            finally:
                self.calls_returned += 1
            self.in_progress = []
            resolve_all(batch, groups)

    async def sync_weights(self, version: int) -> None:
        """The learner's weights to the generator; they must be ``version`` (the sync loop's step)."""
        self._publish_weights(version)

    async def close(self, grace_s: float = 60.0) -> None:
        """Stop serving; wait up to ``grace_s`` for a round in progress (0 after a stall: it is stuck)."""
        if self._queue.task is not None:
            self._queue.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._queue.task
        await asyncio.to_thread(self._thread.close, grace_s)

    def describe(self, state: TrainerState) -> str:
        """Where the sync run stands: the step, and the prompts of the round being generated."""
        shown = ", ".join(self.in_progress[:8]) + (f" and {len(self.in_progress) - 8} more"
                                                   if len(self.in_progress) > 8 else "")  # fmt: skip
        round_text = f"a round of {len(self.in_progress)} prompt(s) being generated ({shown})" if shown else "no round"
        return f"sync step {state.step} (next group id {state.next_group_id}): {round_text}"


def sync_clients(session: Session) -> tuple[RoundRollouts, EmbeddedTrainer | RayTrainer]:
    """The sync loop's rollout and trainer clients on the configured ``runtime.backend``."""
    rollouts = RoundRollouts(session.rollouts, session.publish_weights)
    trainer: EmbeddedTrainer | RayTrainer
    if session.cfg.runtime.backend == "ray":
        from groupwise.runtime.ray.clients import RayLearner, RayTrainer  # Ray is imported only when chosen

        assert isinstance(session.learner, RayLearner), "runtime.backend: ray runs on the Ray session's learner"
        trainer = RayTrainer(session.learner)
    else:
        trainer = EmbeddedTrainer(session.learner, in_thread=False)
    return rollouts, trainer


def train_steps(session: Session, max_steps: int, on_step: Callable[[], None] | None = None) -> str:
    """Train ``session`` from ``session.state.step`` to ``max_steps`` (no evaluation at start, no finish).

    Returns ``"max_steps"`` or ``"exhausted"`` (the data ran out first). ``on_step`` runs after each step's edges.
    """
    rollouts, trainer = sync_clients(session)

    def end_step(done: SyncStep) -> None:
        metrics = done.metrics
        clock = asyncio.get_running_loop().time
        metrics.update({
            "perf/step_seconds": clock() - done.started,
            "perf/gen_seconds": done.gen_seconds,
            "perf/gen_tokens_per_s": done.gen_tokens / done.gen_seconds if done.gen_seconds > 0 else 0.0,
        })  # fmt: skip
        session.end_step(done.step, metrics, [done.chunk])
        if on_step is not None:
            on_step()

    loop = SyncLoop(
        session.cfg.grpo, session.loader, rollouts, trainer, session.state, on_step_end=end_step, fates=session.fates
    )

    def progress_marker() -> tuple[int, int]:
        return (session.state.step, rollouts.calls_returned)

    def describe() -> str:
        return rollouts.describe(session.state)

    async def main() -> str:
        watchdog = watch_progress(progress_marker, session.cfg.runtime.stall_timeout_s, describe, session.events.event)
        grace_s = 60.0
        try:
            return await run_watched(loop.run(max_steps), watchdog)
        except RunStalled:
            grace_s = 0.0  # the round is stuck: leave it to its thread
            raise
        finally:
            await rollouts.close(grace_s)

    try:
        stop_reason = asyncio.run(main())
    except DynamicSamplingExhausted as err:
        session.fail(session.state.step, err)
        raise
    if stop_reason == "exhausted":
        session.events.event(
            f"step {session.state.step}: the data ran out (max_epochs reached) before the step filled; stopping"
        )
    if stop_reason == "no_signal":
        session.events.event(
            f"step {session.state.step + 1} not trained: {loop.no_signal} Stopping here "
            f"(grpo.dynamic_sampling.stop_when_exhausted): the run ends after step {session.state.step}"
        )
    return stop_reason


def run_sync(session: Session) -> str:
    """Train from ``session.state.step`` to ``run.max_steps`` (or until the data runs out, or dynamic sampling does
    under ``stop_when_exhausted``); returns why it stopped, as :meth:`SyncLoop.run` says."""
    session.fates.create()  # a run that fails before its first decision (in evaluation, say) still has the file
    if session.state.step == 0 and session.cfg.eval.at_start:
        session.evaluate(step=0)
    try:
        with session.progress() as progress:
            on_step = lambda: progress.update(session.state.step, session.last_metrics)  # noqa: E731
            stop_reason = train_steps(session, session.cfg.run.max_steps, on_step)
        session.finish()
    except BaseException:
        session.events.event(describe_totals(session.state.generation.totals()))  # what the failed run spent
        raise
    # After the last checkpoint (a resume rolls these lines back and trains the carried groups after all).
    record_carried_at_end(session.fates, session.state)
    session.events.event(describe_totals(session.state.generation.totals()))
    return stop_reason
