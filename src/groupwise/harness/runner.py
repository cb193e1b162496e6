"""Running the G sessions of prompt groups against the endpoint, and what each group's sessions come to.

Each session gets its own key and a fresh :class:`~groupwise.harness.live.LiveSession`; its harness starts at once
(:mod:`groupwise.harness.launch`). On a generator driven in batches (:meth:`HarnessRunner.run_groups`: the sync
loop, evaluation, vLLM, Ray) the calling thread samples the sessions' requests until every harness has ended or
passed its deadline; on a generation stream (:meth:`HarnessRunner.run_group`) each request goes to the stream as it
comes and the group's coroutine only waits.

A session fails when its harness fails (raises, times out, exits non-zero, answers something else than a number
or ``None``), never called the endpoint, or was served no tokens. With ``episode.retry_failed_episodes`` N > 0 it
starts again at once with a fresh session (a new key, the same seed) up to N times; past them its group fails, as a
reward failure of the prompt (:class:`HarnessError`: async retries and then skips it with its fate, sync stops
naming the harness). A failed session is never scored 0. Every failed session counts in the run's
:class:`~groupwise.episodes.failure_streak.FailureStreak` (a finished one ends it), which stops the run after
``episode.max_consecutive_failures`` in a row.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from groupwise.data.scoring import RewardError
from groupwise.episodes.failure_streak import FailureStreak
from groupwise.generation.base import Generator
from groupwise.harness.batched_turns import BatchedTurns
from groupwise.harness.endpoint import Endpoint, EndpointSettings, TurnSampler
from groupwise.harness.launch import HarnessSpec, RunningHarness, SessionFailure
from groupwise.harness.live import LiveSession, SessionLimits
from groupwise.harness.render import RequestRenderer
from groupwise.harness.session import HarnessSession
from groupwise.harness.wire import WireError
from groupwise.seeding import derive_seed
from groupwise.types import GenerationCost, Prompt, SamplingParams, attach_cost


class HarnessError(RewardError):
    """A harness failed one session of a group (the message names the harness, the prompt, the sample and what
    happened); the group is a reward failure of its prompt."""


@dataclass(frozen=True)
class HarnessSettings:
    """What running harness sessions needs besides the generator: the ``episode`` section, resolved (``retries``:
    ``episode.retry_failed_episodes``; ``streak``: the run's count of failed sessions in a row)."""

    spec: HarnessSpec
    renderer: RequestRenderer
    limits: SessionLimits
    timeout_s: float
    endpoint: EndpointSettings
    batch_window_s: float = 0.05
    retries: int = 0
    streak: FailureStreak = field(default_factory=lambda: FailureStreak(0, "harness"))


@dataclass(frozen=True)
class SessionResult:
    """A session whose harness finished: its recorded tree and counts, and its reward (None: score its last
    reply with ``reward.function``); ``retries`` failed sessions of its sample came before it, served
    ``retried_tokens``."""

    sample_index: int
    session: LiveSession
    reward: float | None
    seconds: float
    retries: int = 0
    retried_tokens: int = 0


@dataclass
class OpenGroup:
    """A group's sessions while their harnesses run: the current session of each sample, its harness, its retries
    so far, and the sessions of the attempts that failed and were started again (``retired``); ``settled``: the
    samples whose session ended for good (finished, or failed with no retry left: ``errors``)."""

    prompt: Prompt
    seed: int
    sampler: TurnSampler
    sessions: list[LiveSession]
    runs: list[RunningHarness]
    on_done: Callable[[], None] | None = None
    retries: list[int] = field(default_factory=list)
    retired: list[LiveSession] = field(default_factory=list)
    settled: set[int] = field(default_factory=set)
    errors: dict[int, HarnessError] = field(default_factory=dict)


class HarnessRunner:
    """Runs sessions for a run's rollouts and evaluations; owns the endpoint (started on first use)."""

    def __init__(self, settings: HarnessSettings) -> None:
        self.settings = settings
        self.endpoint = Endpoint(settings.endpoint, settings.renderer.format)
        self._started = False
        self._lock = threading.Lock()

    def run_groups(
        self,
        generator: Generator,
        sampling: SamplingParams,
        prompts: Sequence[Prompt],
        seeds: Sequence[int],
        group_size: int,
    ) -> list[list[SessionResult] | HarnessError]:
        """Every group's G finished sessions, or that group's failure; the calling thread samples their requests
        on ``generator`` (a generator failure is raised once every harness was stopped), and between batches
        settles the sessions that ended (a failed one starts again while it has retries)."""
        sampler = BatchedTurns(generator, sampling, self.settings.batch_window_s)
        sampler.pressure = lambda: self.endpoint.registry.in_flight(sampler)
        groups = [self.open_group(sampler, p, s, group_size) for p, s in zip(prompts, seeds, strict=True)]
        try:
            sampler.serve_until(lambda: all([self.settle(group) for group in groups]))
        except BaseException:
            for group in groups:
                self._stop(group, "the run's generator failed")
            raise
        finally:  # a harness stopped past its deadline may have left a request queued
            sampler.drain(WireError("the session ended before this request was served", status=409))
        return [self.close_group(group) for group in groups]

    async def run_group(
        self, sampler: TurnSampler, prompt: Prompt, seed: int, group_size: int
    ) -> list[SessionResult] | HarnessError:
        """One group's sessions, their requests sampled by ``sampler`` (a stream's) as they come, settled as they
        end; cancelled (or the run's streak of failures past its limit), every harness is stopped."""
        loop = asyncio.get_running_loop()
        ended = asyncio.Event()
        group = self.open_group(sampler, prompt, seed, group_size, _signal(loop, ended))
        try:
            while True:
                ended.clear()
                if self.settle(group):
                    break
                left = min(group.runs[i].deadline for i in range(group_size) if i not in group.settled)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ended.wait(), max(0.0, left - time.monotonic()) + 0.01)
        except BaseException:
            self._stop(group, "its group was cancelled")
            raise
        return self.close_group(group)

    def open_group(
        self,
        sampler: TurnSampler,
        prompt: Prompt,
        seed: int,
        group_size: int,
        on_done: Callable[[], None] | None = None,
    ) -> OpenGroup:
        """Start the group's G harnesses, each with a session of its own registered with ``sampler``;
        ``on_done`` is called (on a harness's thread) whenever one of them ends."""
        self._start()
        group = OpenGroup(prompt, seed, sampler, [], [], on_done, [0] * group_size)
        for index in range(group_size):
            live, run = self._session(group, index)
            group.sessions.append(live)
            group.runs.append(run)
        return group

    def _session(self, group: OpenGroup, index: int) -> tuple[LiveSession, RunningHarness]:
        """A fresh session for sample ``index`` of ``group`` (a new key, the sample's seed), its harness started."""
        live = LiveSession(
            f"gw-{secrets.token_urlsafe(24)}",
            index,
            derive_seed("harness-session", group.seed, index),
            self.settings.renderer,
            self.settings.limits,
        )
        self.endpoint.registry.add(live, group.sampler)
        visible = HarnessSession(
            self.endpoint.base_url, live.key, self.settings.endpoint.model_name, group.prompt, index, live.seed
        )
        return live, RunningHarness(self.settings.spec, visible, self.settings.timeout_s, group.on_done)

    def settle(self, group: OpenGroup) -> bool:
        """Settle every session of ``group`` that ended or passed its deadline (stopped): a finished one ends the
        run's streak of failures; a failed one counts in it and starts again with a fresh session while its sample
        has retries, else it is the sample's failure. Whether every sample is settled."""
        for index, (live, run) in enumerate(zip(group.sessions, group.runs, strict=True)):
            if index in group.settled or not (run.done or time.monotonic() > run.deadline):
                continue
            why = _failure(live, run.outcome())
            if why is None:
                self.settings.streak.finished()
                group.settled.add(index)
                continue
            error = HarnessError(
                f"harness {self.settings.spec.name!r} failed (prompt {group.prompt.uid!r}, sample {index}): {why}",
                group.prompt.uid,
                index,
            )
            self.settings.streak.failed(error)
            if group.retries[index] < self.settings.retries:
                group.retries[index] += 1
                self.endpoint.registry.remove(live.key)
                group.retired.append(live)
                group.sessions[index], group.runs[index] = self._session(group, index)
                continue
            if group.retries[index]:
                error = HarnessError(
                    f"{error} (after {group.retries[index]} retries with a fresh session)", group.prompt.uid, index
                )
            group.errors[index] = error
            group.settled.add(index)
        return len(group.settled) == len(group.runs)

    def close_group(self, group: OpenGroup) -> list[SessionResult] | HarnessError:
        """The group's sessions ended (settled; a harness still running past its deadline is stopped first):
        their results, or the group's failure (its first failed sample's) charged with the tokens every session
        of the group, retired ones included, was served."""
        self.settle(group)
        for live in group.sessions:
            self.endpoint.registry.remove(live.key)
        if group.errors:
            served = sum(live.counts.served_tokens for live in [*group.sessions, *group.retired])
            return attach_cost(group.errors[min(group.errors)], GenerationCost(served))
        retried = {index: 0 for index in range(len(group.sessions))}
        for live in group.retired:
            retried[live.sample_index] += live.counts.served_tokens
        return [
            SessionResult(
                live.sample_index,
                live,
                _reward(run.outcome()),
                time.monotonic() - run.started,
                group.retries[live.sample_index],
                retried[live.sample_index],
            )
            for live, run in zip(group.sessions, group.runs, strict=True)
        ]

    def _stop(self, group: OpenGroup, why: str) -> None:
        for live, run in zip(group.sessions, group.runs, strict=True):
            self.endpoint.registry.remove(live.key)
            run.stop(why)

    def _start(self) -> None:
        with self._lock:
            if not self._started:
                self.endpoint.start()
                self._started = True

    def close(self) -> None:
        """Stop the endpoint (the run ended)."""
        with self._lock:
            if self._started:
                self.endpoint.close()
                self._started = False


def _reward(outcome: float | None | SessionFailure) -> float | None:
    assert not isinstance(outcome, SessionFailure), "a settled session that did not fail"
    return outcome


def _failure(live: LiveSession, outcome: float | None | SessionFailure) -> str | None:
    if isinstance(outcome, SessionFailure):
        return str(outcome)
    if live.counts.requests == 0:
        return "it never called the endpoint"
    if not live.tree.rows():
        return "it was served no tokens (every request it made was refused or past a limit)"
    return None


def _signal(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> Callable[[], None]:
    """``event`` set on ``loop`` from any thread."""

    def signal() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(event.set)

    return signal
