"""A group's G episodes on a generation stream: no rounds, so a slow environment delays only its own episode.

Each episode is a coroutine of its own. It submits its next turn to the stream as a one-row request (the turn
joins whatever the stream decodes: other episodes' turns, other groups, single-turn rows), hands the sampled turn
to its environment on a thread of the step's own, and awaits the answer without holding a thread, with the step
deadline; meanwhile the stream goes on decoding every other row. With a tool that answers in half a second and
enough episodes in flight, the stream never waits for a tool (``bench/episodes.py`` measures it).

What an episode is made of (its seed per turn, its limits, what an environment failure does) is shared with the
lockstep driver (:mod:`groupwise.episodes.group`), so an episode samples the same tokens on either driver.
A weight load can come between two turns of an episode (and inside one with ``async.partial_rollouts: continue``):
every token keeps the version that sampled it (``Completion.token_versions``), and the group's ``start_version``
stays the version at dispatch, the oldest any of its tokens can have.

Checkpoints (``async.partial_rollouts: continue``): :meth:`GroupTurns.progress` saves every episode so far and
the tokens of its turn on the stream; a resumed run continues each at its turn and token where a fresh
environment, given the saved turns again, answers as before (:mod:`groupwise.episodes.progress`).

Cancelled (the controller dropped the group), every turn still on the stream is cancelled there and
:meth:`GroupTurns.cost` gives what the group had spent: its sampled tokens and the stream's seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from groupwise.episodes.episode import Episode
from groupwise.episodes.group import (
    EpisodeError,
    EpisodeSettings,
    RunningGroup,
    finish_step,
    open_group,
    start_over,
    start_step,
    turn_request,
)
from groupwise.episodes.progress import encode_group, take_back
from groupwise.generation.base import RequestStream
from groupwise.runtime.thread_answers import answer_from_thread, on_daemon_thread, signal_from_thread
from groupwise.types import Completion, GenerationRequest, Prompt, RowPrefix, SamplingParams


@dataclass
class GroupTurns:
    """A running group as the client sees it: its episodes (once opened), the turn each has on the stream (its
    handle, by sample), the seconds of its answered turns, and the cost of each turn cancelled on the stream
    (settled once its row left its slot)."""

    group: RunningGroup | None = None
    on_stream: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0
    sampled_tokens: int = 0
    kept_tokens: int = 0  # sampled tokens a resumed group's episodes continued with, not sampled again
    dropped: list[asyncio.Future[tuple[int, float]]] = field(default_factory=list)

    def progress(self, stream: RequestStream, sampling: SamplingParams) -> dict[str, Any] | None:
        """The group's episodes and their turns on the stream as checkpoint data (None: nothing to keep). Read on
        the event loop without yielding, so the episodes and the stream's rows are read at one token boundary."""
        if self.group is None:
            return None
        rows = stream.progress()
        turns = {sample: rows[handle][0] for sample, handle in self.on_stream.items() if rows.get(handle)}
        return encode_group(self.group, sampling, turns)

    async def cost(self) -> tuple[int, float]:
        """Tokens sampled and stream seconds spent, cancelled turns included (waits for their rows to stop)."""
        tokens, seconds = self.sampled_tokens, self.seconds
        for dropped_tokens, dropped_seconds in await asyncio.gather(*self.dropped):
            tokens, seconds = tokens + dropped_tokens, seconds + dropped_seconds
        return tokens, seconds


@dataclass(frozen=True)
class SavedGroup:
    """A checkpointed group to continue (:mod:`groupwise.episodes.progress`) and the sampling it must match."""

    data: dict[str, Any]
    sampling: SamplingParams
    on_event: Callable[[str], None]


async def run_streamed_group(
    stream: RequestStream, settings: EpisodeSettings, prompt: Prompt, seed: int, group_size: int, turns: GroupTurns,
    saved: SavedGroup | None = None,
) -> list[Episode] | EpisodeError:  # fmt: skip
    """The group's G finished episodes, or its failure; ``turns`` collects what its turns cost. ``saved``: the
    group as a checkpoint left it, whose episodes continue at their turns where their environments agree."""
    group = await on_daemon_thread(lambda: open_group(settings, prompt, seed, group_size), "groupwise-env-open")
    continued: dict[int, RowPrefix] = {}
    if saved is not None and group.error is None:
        continued, why = await on_daemon_thread(
            lambda: take_back(settings, group, saved.data, saved.sampling), "groupwise-env-take-back"
        )
        if why is not None:
            saved.on_event(f"resume: the episodes of {prompt.uid!r} start over instead of continuing: {why}")
        turns.kept_tokens = sum(sum(e.trainable) for e in group.episodes if e.resume == "continued")
        turns.kept_tokens += sum(len(turn.token_ids) for turn in continued.values())
    turns.group = group
    if group.error is None:
        tasks = [
            asyncio.create_task(_run_episode(stream, settings, group, e, turns, continued.get(e.sample_index)))
            for e in group.episodes
        ]
        try:
            await _all_or_first_error(tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return group.outcome()


async def _all_or_first_error(tasks: list[asyncio.Task[None]]) -> None:
    """Wait for every task; the first one to raise raises here (the caller cancels the others)."""
    pending = set(tasks)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]  # checked just above


async def _run_episode(
    stream: RequestStream, settings: EpisodeSettings, group: RunningGroup, episode: Episode, turns: GroupTurns,
    continued: RowPrefix | None,
) -> None:  # fmt: skip
    """Turn after turn until the episode ends or its group failed (another episode's environment); ``continued``:
    the saved tokens its first turn continues."""
    loop = asyncio.get_running_loop()
    while not episode.finished and group.error is None:
        request = turn_request(group, episode)
        if request is None:
            return
        if continued is not None:
            request, continued = replace(request, prefixes=(continued,)), None
        completion = await _sample_turn(stream, request, turns, episode.sample_index)
        turns.sampled_tokens += len(completion.token_ids)
        answered: asyncio.Future[None] = loop.create_future()
        step = start_step(settings, group, episode, completion, signal_from_thread(loop, answered))
        left = step.call.started + settings.step_timeout_s - time.perf_counter()
        await asyncio.wait({answered}, timeout=max(0.0, left))
        error = finish_step(settings, step)  # answered, or past its deadline: either way it does not block
        if error is not None:  # a fresh environment, made off the loop, while the episode has retries
            episode = await on_daemon_thread(_restart(settings, group, episode, error), "groupwise-env-retry")


def _restart(
    settings: EpisodeSettings, group: RunningGroup, episode: Episode, error: EpisodeError
) -> Callable[[], Episode]:
    return lambda: start_over(settings, group, episode, error)


async def _sample_turn(stream: RequestStream, request: GenerationRequest, turns: GroupTurns, sample: int) -> Completion:
    """One turn through the stream; a turn cancelled while on the stream is cancelled there too."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[list[Completion]] = loop.create_future()
    handle = stream.submit(request, answer_from_thread(loop, answer))
    turns.on_stream[sample] = handle
    try:
        completions = await answer
    except asyncio.CancelledError:
        dropped: asyncio.Future[tuple[int, float]] = loop.create_future()
        turns.dropped.append(dropped)
        stream.cancel(handle, answer_from_thread(loop, dropped, unpack=True))
        stream.forget(handle)
        raise
    except BaseException:
        stream.forget(handle)
        raise
    finally:
        turns.on_stream.pop(sample, None)
    turns.seconds += stream.cost(handle)[1]
    stream.forget(handle)
    return completions[0]
