"""Run the G episodes of many prompt groups turn by turn on any generator.

Each round asks the generator for the next turn of every unfinished episode (one call per distinct number of
tokens a turn may take), then runs every environment step at once, each on its own thread with a deadline
(:mod:`groupwise.episodes.deadline`): a slow tool delays its round, not one step per episode. An episode whose
environment failed starts over with a fresh one before the next round, while it has retries. The pieces a round
is made of, and what a failure does, are in :mod:`groupwise.episodes.group`; on a generation stream the episodes
run without rounds (:mod:`groupwise.episodes.streamed`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

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
from groupwise.generation.factory import checked_outputs
from groupwise.generation.request_limits import generate_by_limit
from groupwise.types import Completion, GenerationRequest, Prompt, SamplingParams

if TYPE_CHECKING:
    from groupwise.generation.base import Generator


def run_episode_groups(
    generator: Generator, sampling: SamplingParams, settings: EpisodeSettings, prompts: Sequence[Prompt],
    seeds: Sequence[int], group_size: int,
) -> list[list[Episode] | EpisodeError]:  # fmt: skip
    """Every group's G finished episodes, or the failure of that group (groups never share a failure)."""
    groups = [open_group(settings, prompt, seed, group_size) for prompt, seed in zip(prompts, seeds, strict=True)]
    while True:
        active = [(g, e) for g in groups if g.error is None for e in g.episodes if not e.finished]
        if not active:
            break
        replies = _sample_turns(generator, sampling, settings, active)
        steps = [start_step(settings, g, e, replies[id(e)]) for g, e in active if id(e) in replies]
        for step in steps:
            error = finish_step(settings, step)
            if error is not None:  # a fresh environment while it has retries (made here: the next round waits)
                start_over(settings, step.group, step.episode, error)
    return [group.outcome() for group in groups]


def _sample_turns(
    generator: Generator, sampling: SamplingParams, settings: EpisodeSettings,
    active: list[tuple[RunningGroup, Episode]],
) -> dict[int, Completion]:  # fmt: skip
    """The next turn of every active episode (keyed by ``id(episode)``); an episode with no room ends here."""
    asked: list[tuple[Episode, GenerationRequest]] = []
    for group, episode in active:
        request = turn_request(group, episode)
        if request is not None:
            asked.append((episode, request))
    replies: dict[int, Completion] = {}
    for start in range(0, len(asked), settings.max_rows_per_call):
        batch = asked[start : start + settings.max_rows_per_call]
        outputs = generate_by_limit([r for _, r in batch], sampling, _checked(generator))  # one call per turn cap
        for (episode, _), out in zip(batch, outputs, strict=True):
            replies[id(episode)] = out[0]
    return replies


def _checked(generator: Generator) -> Callable[[Sequence[GenerationRequest], SamplingParams], list[list[Completion]]]:
    """``generator.generate`` with its answers checked against the Generator contract (a plug-in backend's broken
    answer is named, not trained on)."""
    return lambda requests, sampling: checked_outputs(generator, requests, generator.generate(requests, sampling))
