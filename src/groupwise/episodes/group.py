"""One prompt group's G episodes while they run, whatever drives them: opening, one turn's step, failure.

Both drivers use these pieces: the lockstep rounds (:mod:`groupwise.episodes.lockstep`, on any generator) and the
streamed episodes (:mod:`groupwise.episodes.streamed`, on a generation stream). A turn's seed is derived from the
group's request seed, the sample index and the turn, so an episode samples the same tokens whatever batch or
driver it runs in.

Failures of the environment (it raises, times out, answers with something that is not a list of messages, or a
chat template that is not append-only) fail the episode's whole group with :class:`EpisodeError`, a reward
failure: async mode retries the prompt and then skips it with its fate, sync mode stops naming the environment.
Failures of a tool call are the model's to read (an error observation, :mod:`groupwise.episodes.tools`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, replace

from groupwise.data.scoring import MAX_ABS_REWARD, RewardError
from groupwise.episodes.deadline import PendingCall
from groupwise.episodes.environment import Environment, EnvironmentFactory, Message, StepResult, checked_messages
from groupwise.episodes.episode import Answer, Episode, EpisodeLimits
from groupwise.episodes.template import ChatRenderer
from groupwise.seeding import derive_seed
from groupwise.types import Completion, GenerationCost, GenerationRequest, Prompt, attach_cost


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
class RunningGroup:
    """One group's episodes and environments while they run (``error`` set = the group failed)."""

    prompt: Prompt
    seed: int
    episodes: list[Episode]
    envs: list[Environment]
    error: EpisodeError | None = None

    def outcome(self) -> list[Episode] | EpisodeError:
        """The G finished episodes, or the group's failure charged with the tokens its episodes sampled."""
        if self.error is None:
            return self.episodes
        sampled = sum(sum(e.trainable) for e in self.episodes)
        return attach_cost(self.error, GenerationCost(sampled))


def turn_seed(group_seed: int, sample_index: int, turn: int) -> int:
    """The seed of one episode turn's request: ``derive_seed("episode-turn", group seed, sample, turn)``."""
    return derive_seed("episode-turn", group_seed, sample_index, turn)


def turn_request(group: RunningGroup, episode: Episode) -> GenerationRequest | None:
    """The request for ``episode``'s next turn (one sample, at most what the episode has room for); None when it
    has no room left, which ends it (``token_budget``)."""
    cap = episode.turn_cap()
    if cap <= 0:
        episode.end = "token_budget"
        return None
    seed = turn_seed(group.seed, episode.sample_index, episode.turns)
    return GenerationRequest(episode.context(), 1, seed, max_new_tokens=cap)


def open_group(settings: EpisodeSettings, prompt: Prompt, seed: int, group_size: int) -> RunningGroup:
    """The group's G environments made and reset. Each constructor and each ``reset`` runs on a daemon thread of
    its own with the step deadline, the G of them at once: a slow constructor delays its group by at most
    ``step_timeout_s``, a hung one fails the group and is abandoned (nothing ever waits for it, at exit neither)."""
    running = RunningGroup(prompt, seed, [], [])
    made = [PendingCall(settings.factory, f"groupwise-env-make-{i}") for i in range(group_size)]
    envs: list[Environment] = []
    for index, call in enumerate(made):
        try:  # the user's environment constructor: a failure (or a hang) of this group, named
            envs.append(call.result(settings.step_timeout_s))
        except Exception as exc:
            running.error = running.error or failure(settings, prompt, index, "could not be created", exc)
    if running.error is not None:
        return running
    resets = [PendingCall(_reset(env, prompt, i), f"groupwise-env-reset-{i}") for i, env in enumerate(envs)]
    for index, (env, reset) in enumerate(zip(envs, resets, strict=True)):
        try:
            running.episodes.append(_opened(settings, index, reset))
            running.envs.append(env)
        except Exception as exc:
            running.error = running.error or failure(settings, prompt, index, "failed in reset()", exc)
    return running


def reopen_episode(settings: EpisodeSettings, group: RunningGroup, position: int) -> Episode:
    """Replace the episode at ``position`` of ``group`` by a fresh one: a new environment, reset (an episode that
    starts over); each call under the step deadline."""
    index = group.episodes[position].sample_index
    try:
        env = made_environment(settings)
    except Exception as exc:
        group.error = group.error or failure(settings, group.prompt, index, "could not be created", exc)
        return group.episodes[position]
    try:
        episode = _opened(
            settings, index, PendingCall(_reset(env, group.prompt, index), f"groupwise-env-reset-{index}")
        )
    except Exception as exc:
        group.error = group.error or failure(settings, group.prompt, index, "failed in reset()", exc)
        return group.episodes[position]
    group.episodes[position], group.envs[position] = episode, env
    return episode


def made_environment(settings: EpisodeSettings) -> Environment:
    """One environment from the factory, on a daemon thread with the step deadline (:class:`StepTimeout` past it)."""
    return PendingCall(settings.factory, "groupwise-env-make").result(settings.step_timeout_s)


def _opened(settings: EpisodeSettings, index: int, reset: PendingCall[object]) -> Episode:
    opening = settings.renderer.offer_tools(checked_messages(reset.result(settings.step_timeout_s), "reset()"))
    return Episode(index, list(opening), tuple(settings.renderer.opening(opening)), settings.limits)


def episode_opening(settings: EpisodeSettings, prompt: Prompt, sample_index: int = 0) -> tuple[int, ...]:
    """The tokens an episode of ``prompt`` opens with (its environment's opening messages, tools offered, the
    generation prompt): what a warm start on first turns trains from. Made and reset under the step deadline."""
    env = made_environment(settings)
    reset = PendingCall(_reset(env, prompt, sample_index), "groupwise-env-reset")
    messages = checked_messages(reset.result(settings.step_timeout_s), "reset()")
    return tuple(settings.renderer.opening(settings.renderer.offer_tools(messages)))


@dataclass
class TurnStep:
    """One sampled turn handed to its environment: the ``call`` runs ``step()`` on its own thread and prepares its
    answer there (:meth:`~groupwise.episodes.episode.Episode.prepare`: cut and rendered off the caller's thread)."""

    group: RunningGroup
    episode: Episode
    reply: Message
    call: PendingCall[Answer]


def start_step(
    settings: EpisodeSettings, group: RunningGroup, episode: Episode, completion: Completion,
    on_done: Callable[[], None] | None = None,
) -> TurnStep:  # fmt: skip
    """Append the sampled turn to ``episode`` and start its environment's ``step()`` (``on_done`` is called on the
    step's thread when it returns)."""
    reply = episode.add_turn(completion)
    env = group.envs[group.episodes.index(episode)]
    name = f"groupwise-env-step-{episode.sample_index}"
    work = _answered(env, episode, reply, list(completion.token_ids), settings.renderer)
    return TurnStep(group, episode, reply, PendingCall(work, name, on_done))


def finish_step(settings: EpisodeSettings, step: TurnStep) -> None:
    """Apply the environment's answer (waiting for it up to the step deadline); a failure fails the group."""
    episode, group = step.episode, step.group
    try:
        answer = step.call.result(settings.step_timeout_s)
        episode.env_seconds += step.call.seconds
        episode.apply(answer, step.reply)
    except Exception as exc:
        episode.env_seconds += step.call.seconds
        group.error = group.error or failure(settings, group.prompt, episode.sample_index, "failed in step()", exc)


def failure(settings: EpisodeSettings, prompt: Prompt, index: int, what: str, exc: BaseException) -> EpisodeError:
    error = EpisodeError(
        f"environment {settings.name!r} {what} (prompt {prompt.uid!r}, sample {index}): {type(exc).__name__}: {exc}",
        prompt.uid, index,
    )  # fmt: skip
    error.__cause__ = exc
    return error


def _reset(env: Environment, prompt: Prompt, index: int) -> Callable[[], object]:
    return lambda: env.reset(prompt, index)


def _answered(
    env: Environment, episode: Episode, reply: Message, sampled: list[int], renderer: ChatRenderer
) -> Callable[[], Answer]:
    return lambda: episode.prepare(checked_result(env.step(dict(reply))), reply, sampled, renderer)


def checked_result(result: object) -> StepResult:
    """``result`` as a :class:`StepResult` whose reward is a ``float`` (any real number: ``numpy.float32``,
    ``numpy.int64`` too, as single-turn rewards) and whose messages are checked; ValueError or TypeError naming
    the fault."""
    if not isinstance(result, StepResult):
        raise TypeError(f"step() returned {type(result).__name__}, not a StepResult")
    reward = result.reward
    if not isinstance(reward, numbers.Real):
        raise ValueError(f"step() returned the reward {reward!r} of type {type(reward).__name__}; it must be a "
                         "finite real number")  # fmt: skip
    try:
        value = float(reward)
    except OverflowError:  # an int too large for a float
        value = math.inf
    if not abs(value) <= MAX_ABS_REWARD:
        raise ValueError(f"step() returned the reward {reward!r}; it must be a finite number within "
                         f"±{MAX_ABS_REWARD:g}")  # fmt: skip
    return replace(result, reward=value, messages=checked_messages(result.messages, "step()"))
