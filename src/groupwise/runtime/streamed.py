"""The embedded runtime's rollout client with continuous batching: requests join the engine's running decode loop.

:class:`StreamedRollouts` feeds every rollout request to a :class:`~groupwise.generation.stream.GenerationStream`
as it arrives (the stream decodes on its own daemon thread), and settles each request as soon as its own G
completions are done; scoring runs on a worker thread of its own, so a slow verifier never stalls decoding. With
multi-turn episodes each turn is a request of its own and each environment step runs off the serving thread
(:mod:`groupwise.runtime.streamed_episodes`).
Weight syncs are posted to the stream and applied at a token boundary (``async.partial_rollouts: continue``) or
after the running rows finish (``off``); the sync returns once the engine decodes under the new version.
Evaluation uses the stream's own evaluation generator (``RequestStream.generator_for_evaluation``).

For checkpoints, :meth:`StreamedRollouts.fetch_progress` reads what every running attempt has generated
(at a token boundary, under the stream's lock) as plain data (:mod:`groupwise.runtime.inflight`), and
:meth:`StreamedRollouts.resume` continues such an attempt.

Liveness: :meth:`StreamedRollouts.idle_waits` names the answers the client awaits from the stream while the
stream has nothing to do — answers that will never come — for the runtime's liveness watch
(:func:`groupwise.runtime.watchdog.watch_liveness`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from groupwise.controller.interfaces import LoaderItem
from groupwise.episodes.group import EpisodeSettings
from groupwise.generation.base import RequestStream, VersionedWeights
from groupwise.runtime.daemon_worker import DaemonWorker
from groupwise.runtime.inflight import continuation, encode_progress, prefix_tokens
from groupwise.runtime.streamed_episodes import GroupTurns, SavedGroup, run_streamed_group
from groupwise.runtime.streamed_harness import StreamTurns, harness_progress
from groupwise.runtime.thread_answers import answer_from_thread
from groupwise.trainer.rollout import RolloutWorker
from groupwise.types import (
    NO_COST,
    Completion,
    GenerationCost,
    GenerationRequest,
    Group,
    RowPrefix,
    charge_seconds,
)

T = TypeVar("T")


@dataclass
class _Running:
    handle: int
    request: GenerationRequest


async def load_weights_through(stream: RequestStream, load: Callable[[], None]) -> None:
    """Post ``load`` to ``stream`` and wait until the serving thread ran it at a token boundary."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    stream.post_weights(load, answer_from_thread(loop, done))
    error = await done
    if error is not None:
        raise error


class StreamedRollouts:
    """``RolloutClient`` over a generation stream on the embedded engine (see the module docstring)."""

    def __init__(
        self, worker: RolloutWorker, weights: Callable[[], VersionedWeights], stream: RequestStream,
        on_event: Callable[[str], None] = lambda message: None,
    ) -> None:  # fmt: skip
        self.worker = worker
        self.weights = weights  # the learner's weights for the generator (the session's generator_weights)
        self.stream = stream
        self.on_event = on_event
        self.engine_lock = asyncio.Lock()  # the runtime's interface; the stream is paused for evaluation instead
        self.generated_tokens = 0  # completion tokens of the groups handed back
        self.worker_restarts = 0  # the in-process engine is never restarted
        self.resumed_tokens = 0  # tokens of resumed attempts that were continued, not generated again
        self._returned = 0
        self._running: dict[int, _Running] = {}
        self._episode_groups: dict[int, GroupTurns] = {}  # running episode groups, by group id
        self._harness_groups: dict[int, StreamTurns] = {}  # running harness groups, by group id
        self._spent: dict[int, asyncio.Future] = {}  # cancelled rollouts' costs, until the controller asks
        self._awaited: dict[int, asyncio.Future] = {}  # answers awaited from the stream, by a number of their own
        self._next_wait = 0
        self._scorer = DaemonWorker("groupwise-scoring")
        stream.start("groupwise-generation")

    @property
    def busy_seconds(self) -> float:
        return self.stream.busy_seconds

    @property
    def calls_returned(self) -> int:
        """Progress for the stall watchdog: decode steps, weight loads and groups handed back."""
        return self.stream.steps + self.stream.weight_loads + self._returned

    async def rollout(self, prompt: LoaderItem, group_id: int, attempt: int, start_version: int) -> Group:
        if self.worker.episodes is not None:
            return await self._run_episodes(self.worker.episodes, prompt, group_id, attempt, start_version)
        if self.worker.harness is not None:
            return await self._run_sessions(prompt, group_id, attempt, start_version)
        return await self._generate(prompt, group_id, attempt, start_version, ())

    async def resume(
        self, prompt: LoaderItem, group_id: int, attempt: int, start_version: int, progress: dict[str, Any]
    ) -> Group:
        """Continue a checkpointed attempt: its samples so far are fed back as prefixes, not generated again (an
        episode group's episodes continue at their turns, :mod:`groupwise.episodes.progress`)."""
        if self.worker.episodes is not None:
            saved = SavedGroup(progress, self.worker.sampling, self.on_event)
            return await self._run_episodes(self.worker.episodes, prompt, group_id, attempt, start_version, saved)
        if self.worker.harness is not None:  # a harness cannot be replayed: its sessions start again
            return await self._run_sessions(prompt, group_id, attempt, start_version, restarted=True)
        prefixes = continuation(self.worker, prompt, group_id, attempt, progress, self.on_event)
        self.resumed_tokens += prefix_tokens(prefixes)
        return await self._generate(prompt, group_id, attempt, start_version, prefixes)

    async def _generate(
        self, prompt: LoaderItem, group_id: int, attempt: int, start_version: int,
        prefixes: tuple[RowPrefix | None, ...],
    ) -> Group:  # fmt: skip
        request = self.worker.request_for(prompt, attempt, prefixes)
        loop = asyncio.get_running_loop()
        generated: asyncio.Future[list[Completion]] = loop.create_future()
        self._await(generated)
        handle = self.stream.submit(request, answer_from_thread(loop, generated))
        self._running[group_id] = _Running(handle, request)
        try:
            completions = await generated
            _, seconds = self.stream.cost(handle)
            outcome = await self._scorer.run(
                self.worker.score_group, prompt, group_id, attempt, request, completions, start_version,
                self.worker.generator.version,
            )  # fmt: skip
        except asyncio.CancelledError:
            spent: asyncio.Future[tuple[int, float]] = loop.create_future()
            self._await(spent)
            self._spent[group_id] = spent
            self.stream.cancel(handle, answer_from_thread(loop, spent, unpack=True))
            raise
        finally:
            self._running.pop(group_id, None)
            self.stream.forget(handle)
        self._returned += 1
        outcome = charge_seconds(outcome, seconds)  # a reward failure keeps its completions' tokens
        if isinstance(outcome, BaseException):
            raise outcome
        self.generated_tokens += outcome.num_completion_tokens
        return outcome

    async def _run_episodes(
        self, settings: EpisodeSettings, prompt: LoaderItem, group_id: int, attempt: int, start_version: int,
        saved: SavedGroup | None = None,
    ) -> Group:  # fmt: skip
        """The group's G episodes, each turn a request on the stream (:mod:`groupwise.runtime.streamed_episodes`)."""
        turns = GroupTurns()
        seed = self.worker.seed_for(prompt, attempt)
        self._episode_groups[group_id] = turns
        try:
            result = await run_streamed_group(
                self.stream, settings, prompt.prompt, seed, self.worker.group_size, turns, saved
            )  # fmt: skip
        except asyncio.CancelledError:
            self._spent[group_id] = asyncio.ensure_future(turns.cost())
            raise
        finally:
            self._episode_groups.pop(group_id, None)
            self.resumed_tokens += turns.kept_tokens
        outcome = self.worker.episode_group(
            prompt, group_id, attempt, start_version, self.worker.generator.version, result
        )  # fmt: skip
        self._returned += 1
        outcome = charge_seconds(outcome, turns.seconds)  # an environment failure keeps its sampled tokens
        if isinstance(outcome, BaseException):
            raise outcome
        self.generated_tokens += outcome.num_completion_tokens
        return outcome

    async def _run_sessions(
        self, prompt: LoaderItem, group_id: int, attempt: int, start_version: int, restarted: bool = False
    ) -> Group:
        """The group's G harness sessions, each request a request on the stream
        (:mod:`groupwise.runtime.streamed_harness`)."""
        assert self.worker.harness is not None, "a harness run"
        generator = self.worker.generator
        turns = StreamTurns(self.stream, self.worker.sampling, lambda: generator.version)
        self._harness_groups[group_id] = turns
        seed = self.worker.seed_for(prompt, attempt)
        try:
            result = await self.worker.harness.run_group(turns, prompt.prompt, seed, self.worker.group_size)
        except asyncio.CancelledError:
            turns.cancel()
            self._spent[group_id] = _settled((turns.sampled_tokens, turns.seconds))
            raise
        finally:
            self._harness_groups.pop(group_id, None)
        outcome = self.worker.harness_group(prompt, group_id, attempt, start_version, self.worker.generator.version,
                                            result)  # fmt: skip
        self._returned += 1
        outcome = charge_seconds(outcome, turns.seconds)
        if isinstance(outcome, BaseException):
            raise outcome
        if restarted:
            outcome.completions = [_restarted(c) for c in outcome.completions]
        self.generated_tokens += outcome.num_completion_tokens
        return outcome

    def _await(self, future: asyncio.Future) -> None:
        """Count ``future`` as an answer awaited from the stream until it is settled."""
        number, self._next_wait = self._next_wait, self._next_wait + 1
        self._awaited[number] = future
        future.add_done_callback(lambda _: self._awaited.pop(number, None))

    def idle_waits(self) -> list[int]:
        """The answers (by number) awaited from the stream while it has nothing to do — none while it works. Only
        for the moment between the serving thread's answer and this loop taking it in may a wait be named
        legitimately; a wait named for seconds was lost (the liveness watch stops the run)."""
        if not self._awaited or not self.stream.idle():
            return []
        return [number for number, future in list(self._awaited.items()) if not future.done()]

    async def spent(self, group_id: int) -> GenerationCost:
        """What a rollout the controller cancelled cost: its tokens and the stream's time until its rows left their
        slots (nothing for a group this client never ran)."""
        spent = self._spent.pop(group_id, None)
        if spent is None:
            return NO_COST
        tokens, seconds = await spent
        return GenerationCost(tokens, seconds)

    async def fetch_progress(self) -> dict[int, dict[str, Any] | None]:
        """What every running attempt generated so far, by group id, as checkpoint data (None: nothing yet); read
        without yielding to the event loop, so at the same instant as a snapshot taken just before."""
        progress = self.stream.progress()
        sampling = self.worker.sampling
        saved = {
            group_id: encode_progress(running.request, sampling, progress[running.handle])
            for group_id, running in list(self._running.items())
            if running.handle in progress
        }
        for group_id, turns in list(self._episode_groups.items()):
            saved[group_id] = turns.progress(self.stream, sampling)
        for group_id, session_turns in list(self._harness_groups.items()):
            saved[group_id] = harness_progress(session_turns)
        return saved

    async def sync_weights(self, version: int) -> None:
        """Copy the learner's parameters into the engine's model at a token boundary of the stream."""
        await load_weights_through(self.stream, lambda: self._load_weights(version))

    def _load_weights(self, version: int) -> None:
        """(On the serving thread.) The learner's parameters, adapters merged with LoRA, into the engine's model."""
        weights = self.weights().checked(version)
        self.worker.generator.load_weights(weights.state, weights.version)

    async def close(self, grace_s: float = 60.0) -> None:
        """Stop the stream (waiting up to ``grace_s`` for a step in progress) and the scoring thread."""
        await asyncio.to_thread(self.stream.close, grace_s)
        await asyncio.to_thread(self._scorer.close, grace_s)


def _settled(value: T) -> asyncio.Future[T]:
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


def _restarted(completion: Completion) -> Completion:
    """A session of a resumed group that started again: its record says so."""
    if completion.episode is None:
        return completion
    return dataclasses.replace(completion, episode=dataclasses.replace(completion.episode, resume="restarted"))
