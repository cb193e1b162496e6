"""Run the G episodes of many prompt groups turn by turn on any generator.

Each round asks the generator for the next turn of every unfinished episode in one call (episodes grouped by the
tokens their turn may take), then runs every environment step at once, each on its own thread with a deadline
(:mod:`groupwise.episodes.deadline`): a slow tool delays its round, not one step per episode. A turn's seed is
derived from the group's request seed, the sample index and the turn, so an episode samples the same tokens
whatever batch it runs in.

Failures of the environment (it raises, times out, answers with something that is not a list of messages, or a
chat template that is not append-only) fail the episode's whole group with :class:`EpisodeError`, a reward
failure: async mode retries the prompt and then skips it with its fate, sync mode stops naming the environment.
Failures of a tool call are the model's to read (an error observation, :mod:`groupwise.episodes.tools`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from groupwise.data.scoring import MAX_ABS_REWARD, RewardError
from groupwise.episodes.deadline import PendingCall
from groupwise.episodes.environment import Environment, EnvironmentFactory, StepResult, checked_messages
from groupwise.episodes.episode import Episode, EpisodeLimits
from groupwise.episodes.template import ChatRenderer
from groupwise.seeding import derive_seed
from groupwise.types import Completion, GenerationCost, GenerationRequest, Prompt, SamplingParams, attach_cost

if TYPE_CHECKING:
    from groupwise.generation.base import Generator


class EpisodeError(RewardError):
    """An environment failed one episode of a group (the message names the environment, the prompt and the
    sample); the group is a reward failure of its prompt."""


@dataclass(frozen=True)
class EpisodeSettings:
    """What running episodes needs besides the generator: the ``episode`` section, resolved."""

    name: str
    factory: EnvironmentFactory
    renderer: ChatRenderer
    limits: EpisodeLimits
    step_timeout_s: float
    max_rows_per_call: int = 512


@dataclass
class _Running:
    """One group's episodes and environments while they run (``error`` set = the group failed)."""

    prompt: Prompt
    seed: int
    episodes: list[Episode]
    envs: list[Environment]
    error: EpisodeError | None = None


def run_episode_groups(
    generator: Generator, sampling: SamplingParams, settings: EpisodeSettings, prompts: Sequence[Prompt],
    seeds: Sequence[int], group_size: int,
) -> list[list[Episode] | EpisodeError]:  # fmt: skip
    """Every group's G finished episodes, or the failure of that group (groups never share a failure)."""
    groups = [_open_group(settings, prompt, seed, group_size) for prompt, seed in zip(prompts, seeds, strict=True)]
    while True:
        active = [(g, e) for g in groups if g.error is None for e in g.episodes if not e.finished]
        if not active:
            break
        replies = _sample_turns(generator, sampling, settings, active)
        _step_all(settings, active, replies)
    return [g.episodes if g.error is None else _charged(g.error, g.episodes) for g in groups]


def episode_opening(settings: EpisodeSettings, prompt: Prompt, sample_index: int = 0) -> tuple[int, ...]:
    """The tokens an episode of ``prompt`` opens with (its environment's opening messages, tools offered, the
    generation prompt): what a warm start on first turns trains from."""
    env = settings.factory()
    messages = checked_messages(env.reset(prompt, sample_index), "reset()")
    return tuple(settings.renderer.opening(settings.renderer.offer_tools(messages)))


def turn_seed(group_seed: int, sample_index: int, turn: int) -> int:
    """The seed of one episode turn's request: ``derive_seed("episode-turn", group seed, sample, turn)``."""
    return derive_seed("episode-turn", group_seed, sample_index, turn)


def _open_group(settings: EpisodeSettings, prompt: Prompt, seed: int, group_size: int) -> _Running:
    running = _Running(prompt, seed, [], [])
    try:
        envs = [settings.factory() for _ in range(group_size)]
    except Exception as exc:  # the user's environment constructor: a failure of this group, named
        running.error = _failure(settings, prompt, 0, "could not be created", exc)
        return running
    calls = [PendingCall(_reset(env, prompt, i), f"groupwise-env-reset-{i}") for i, env in enumerate(envs)]
    for index, (env, call) in enumerate(zip(envs, calls, strict=True)):
        try:
            opening = settings.renderer.offer_tools(checked_messages(call.result(settings.step_timeout_s), "reset()"))
            prompt_ids = tuple(settings.renderer.opening(opening))
        except Exception as exc:
            running.error = running.error or _failure(settings, prompt, index, "failed in reset()", exc)
            continue
        running.episodes.append(Episode(index, list(opening), prompt_ids, settings.limits))
        running.envs.append(env)
    return running


def _reset(env: Environment, prompt: Prompt, index: int) -> Callable[[], object]:
    return lambda: env.reset(prompt, index)


def _sample_turns(
    generator: Generator, sampling: SamplingParams, settings: EpisodeSettings, active: list[tuple[_Running, Episode]]
) -> dict[int, Completion]:
    """The next turn of every active episode (keyed by ``id(episode)``); an episode with no room ends here."""
    by_cap: dict[int, list[tuple[_Running, Episode]]] = defaultdict(list)
    for group, episode in active:
        cap = episode.turn_cap()
        if cap <= 0:
            episode.end = "token_budget"
        else:
            by_cap[cap].append((group, episode))
    replies: dict[int, Completion] = {}
    for cap, rows in by_cap.items():
        capped = replace(sampling, max_new_tokens=cap)
        for start in range(0, len(rows), settings.max_rows_per_call):
            batch = rows[start:start + settings.max_rows_per_call]
            requests = [GenerationRequest(e.context(), 1, turn_seed(g.seed, e.sample_index, e.turns)) for g, e in batch]
            for (_, episode), out in zip(batch, generator.generate(requests, capped), strict=True):
                replies[id(episode)] = out[0]
    return replies


def _step_all(
    settings: EpisodeSettings, active: list[tuple[_Running, Episode]], replies: dict[int, Completion]
) -> None:
    """Give every sampled turn to its environment, all at once, and apply the answers."""
    pending = []
    for group, episode in active:
        completion = replies.get(id(episode))
        if completion is None:
            continue
        reply = episode.add_turn(completion)
        env = group.envs[group.episodes.index(episode)]
        call = PendingCall(_step(env, reply), f"groupwise-env-step-{episode.sample_index}")
        pending.append((group, episode, reply, list(completion.token_ids), call))
    for group, episode, reply, sampled, call in pending:
        try:
            result = _checked_result(call.result(settings.step_timeout_s))
            episode.env_seconds += call.seconds
            episode.apply(result, reply, sampled, settings.renderer)
        except Exception as exc:
            episode.env_seconds += call.seconds
            group.error = group.error or _failure(settings, group.prompt, episode.sample_index, "failed in step()", exc)


def _step(env: Environment, reply: dict[str, str]) -> Callable[[], StepResult]:
    return lambda: env.step(dict(reply))


def _checked_result(result: object) -> StepResult:
    if not isinstance(result, StepResult):
        raise TypeError(f"step() returned {type(result).__name__}, not a StepResult")
    reward = result.reward
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not abs(reward) <= MAX_ABS_REWARD:
        raise ValueError(f"step() returned the reward {reward!r}; it must be a finite number")
    return replace(result, messages=checked_messages(result.messages, "step()"))


def _charged(error: EpisodeError, episodes: Sequence[Episode]) -> EpisodeError:
    """``error`` with the tokens its group's episodes had sampled (the attempt's cost, charged to it)."""
    return attach_cost(error, GenerationCost(sum(sum(e.trainable) for e in episodes)))


def _failure(settings: EpisodeSettings, prompt: Prompt, index: int, what: str, exc: BaseException) -> EpisodeError:
    error = EpisodeError(
        f"environment {settings.name!r} {what} (prompt {prompt.uid!r}, sample {index}): {type(exc).__name__}: {exc}",
        prompt.uid, index,
    )  # fmt: skip
    error.__cause__ = exc
    return error
