"""A group's G episodes on a generation stream: no rounds, so a slow environment delays only its own episode.

Each episode is a coroutine of its own. It submits its next turn to the stream as a one-row request (the turn
joins whatever the stream decodes: other episodes' turns, other groups, single-turn rows), hands the sampled turn
to its environment on a thread of the step's own, and awaits the answer without holding a thread, with the step
deadline; meanwhile the stream goes on decoding every other row. With a tool that answers in half a second and
enough episodes in flight, the stream never waits for a tool (``bench/episodes.py`` measures it).

What an episode is made of (its seed per turn, its limits, what an environment failure does) is shared with the
lockstep driver (:mod:`groupwise.episodes.group`), so an episode samples the same tokens on either driver.
A weight load can come between two turns of an episode, never inside one: every token keeps the version that
sampled it (``Completion.token_versions``), and the group's ``start_version`` stays the version at dispatch, the
oldest any of its tokens can have.

Cancelled (the controller dropped the group), every turn still on the stream is cancelled there and
:meth:`GroupTurns.cost` gives what the group had spent: its sampled tokens and the stream's seconds.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from groupwise.episodes.episode import Episode
from groupwise.episodes.group import (
    EpisodeError,
    EpisodeSettings,
    RunningGroup,
    finish_step,
    open_group,
    start_step,
    turn_request,
)
from groupwise.generation.base import RequestStream
from groupwise.runtime.thread_answers import answer_from_thread, signal_from_thread
from groupwise.types import Completion, GenerationRequest, Prompt


@dataclass
class GroupTurns:
    """What a group's turns cost on the stream: the seconds of its answered turns, and the cost of each turn
    cancelled on the stream (settled once its row left its slot)."""

    seconds: float = 0.0
    sampled_tokens: int = 0
    dropped: list[asyncio.Future[tuple[int, float]]] = field(default_factory=list)

    async def cost(self) -> tuple[int, float]:
        """Tokens sampled and stream seconds spent, cancelled turns included (waits for their rows to stop)."""
        tokens, seconds = self.sampled_tokens, self.seconds
        for dropped_tokens, dropped_seconds in await asyncio.gather(*self.dropped):
            tokens, seconds = tokens + dropped_tokens, seconds + dropped_seconds
        return tokens, seconds


async def run_streamed_group(
    stream: RequestStream, settings: EpisodeSettings, prompt: Prompt, seed: int, group_size: int, turns: GroupTurns
) -> list[Episode] | EpisodeError:
    """The group's G finished episodes, or its failure; ``turns`` collects what its turns cost."""
    group = await asyncio.to_thread(open_group, settings, prompt, seed, group_size)
    if group.error is None:
        tasks = [asyncio.create_task(_run_episode(stream, settings, group, e, turns)) for e in group.episodes]
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
    stream: RequestStream, settings: EpisodeSettings, group: RunningGroup, episode: Episode, turns: GroupTurns
) -> None:
    """Turn after turn until the episode ends or its group failed (another episode's environment)."""
    loop = asyncio.get_running_loop()
    while not episode.finished and group.error is None:
        request = turn_request(group, episode)
        if request is None:
            return
        completion = await _sample_turn(stream, request, turns)
        turns.sampled_tokens += len(completion.token_ids)
        answered: asyncio.Future[None] = loop.create_future()
        step = start_step(group, episode, completion, signal_from_thread(loop, answered))
        left = step.call.started + settings.step_timeout_s - time.perf_counter()
        await asyncio.wait({answered}, timeout=max(0.0, left))
        finish_step(settings, step)  # answered, or past its deadline: either way it does not block


async def _sample_turn(stream: RequestStream, request: GenerationRequest, turns: GroupTurns) -> Completion:
    """One turn through the stream; a turn cancelled while on the stream is cancelled there too."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[list[Completion]] = loop.create_future()
    handle = stream.submit(request, answer_from_thread(loop, answer))
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
    turns.seconds += stream.cost(handle)[1]
    stream.forget(handle)
    return completions[0]
