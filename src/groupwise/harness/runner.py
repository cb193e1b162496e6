"""Running the G sessions of prompt groups against the endpoint, and what each group's sessions come to.

Each session gets its own key and a fresh :class:`~groupwise.harness.live.LiveSession`; its harness starts at once
(:mod:`groupwise.harness.launch`). On a generator driven in batches (:meth:`HarnessRunner.run_groups`: the sync
loop, evaluation, vLLM, Ray) the calling thread samples the sessions' requests until every harness has ended or
passed its deadline; on a generation stream (:meth:`HarnessRunner.run_group`) each request goes to the stream as it
comes and the group's coroutine only waits.

A session fails — and with it its group, as a reward failure of the prompt (:class:`HarnessError`: async retries
and then skips it with its fate, sync stops naming the harness) — when its harness fails (raises, times out, exits
non-zero, answers something else than a number or ``None``), never called the endpoint, or was served no tokens.
A failed session is never scored 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from groupwise.data.scoring import RewardError
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
    """What running harness sessions needs besides the generator: the ``episode`` section, resolved."""

    spec: HarnessSpec
    renderer: RequestRenderer
    limits: SessionLimits
    timeout_s: float
    endpoint: EndpointSettings
    batch_window_s: float = 0.05


@dataclass(frozen=True)
class SessionResult:
    """A session whose harness finished: its recorded tree and counts, and its reward (None: score its last
    reply with ``reward.function``)."""

    sample_index: int
    session: LiveSession
    reward: float | None
    seconds: float


@dataclass
class OpenGroup:
    prompt: Prompt
    sessions: list[LiveSession]
    runs: list[RunningHarness]


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
        on ``generator`` (a generator failure is raised once every harness was stopped)."""
        sampler = BatchedTurns(generator, sampling, self.settings.batch_window_s)
        sampler.pressure = lambda: self.endpoint.registry.in_flight(sampler)
        groups = [self.open_group(sampler, p, s, group_size) for p, s in zip(prompts, seeds, strict=True)]
        runs = [run for group in groups for run in group.runs]
        try:
            sampler.serve_until(lambda: all(r.done or time.monotonic() > r.deadline for r in runs))
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
        """One group's sessions, their requests sampled by ``sampler`` (a stream's) as they come; cancelled, every
        harness is stopped."""
        loop = asyncio.get_running_loop()
        ended = [loop.create_future() for _ in range(group_size)]
        group = self.open_group(sampler, prompt, seed, group_size, [_signal(loop, f) for f in ended])
        try:
            await asyncio.wait(ended, timeout=self.settings.timeout_s + 1.0)
        except asyncio.CancelledError:
            self._stop(group, "its group was cancelled")
            raise
        return self.close_group(group)

    def open_group(
        self,
        sampler: TurnSampler,
        prompt: Prompt,
        seed: int,
        group_size: int,
        on_done: Sequence[Callable[[], None]] | None = None,
    ) -> OpenGroup:
        """Start the group's G harnesses, each with a session of its own registered with ``sampler``."""
        self._start()
        group = OpenGroup(prompt, [], [])
        for index in range(group_size):
            live = LiveSession(
                f"gw-{secrets.token_urlsafe(24)}",
                index,
                derive_seed("harness-session", seed, index),
                self.settings.renderer,
                self.settings.limits,
            )
            self.endpoint.registry.add(live, sampler)
            visible = HarnessSession(
                self.endpoint.base_url, live.key, self.settings.endpoint.model_name, prompt, index, live.seed
            )
            group.sessions.append(live)
            group.runs.append(
                RunningHarness(
                    self.settings.spec,
                    visible,
                    self.settings.timeout_s,
                    on_done[index] if on_done is not None else None,
                )
            )
        return group

    def close_group(self, group: OpenGroup) -> list[SessionResult] | HarnessError:
        """The group's sessions ended (a harness still running past its deadline is stopped): their results, or
        the group's failure charged with the tokens its sessions were served."""
        results: list[SessionResult] = []
        failure: HarnessError | None = None
        for live, run in zip(group.sessions, group.runs, strict=True):
            outcome = run.outcome()
            self.endpoint.registry.remove(live.key)
            why = _failure(live, outcome)
            if why is not None and failure is None:
                failure = HarnessError(
                    f"harness {self.settings.spec.name!r} failed (prompt {group.prompt.uid!r}, "
                    f"sample {live.sample_index}): {why}",
                    group.prompt.uid,
                    live.sample_index,
                )
            elif why is None and not isinstance(outcome, SessionFailure):
                results.append(SessionResult(live.sample_index, live, outcome, time.monotonic() - run.started))
        if failure is not None:
            served = sum(live.counts.served_tokens for live in group.sessions)
            return attach_cost(failure, GenerationCost(served))
        return results

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


def _failure(live: LiveSession, outcome: float | None | SessionFailure) -> str | None:
    if isinstance(outcome, SessionFailure):
        return str(outcome)
    if live.counts.requests == 0:
        return "it never called the endpoint"
    if not live.tree.rows():
        return "it was served no tokens (every request it made was refused or past a limit)"
    return None


def _signal(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> Callable[[], None]:
    def settle() -> None:
        if not future.done():
            future.set_result(None)

    def signal() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(settle)

    return signal
