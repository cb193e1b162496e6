"""One prompt group's G episodes while they run, whatever drives them: opening, one turn's step, failure.

Both drivers use these pieces: the lockstep rounds (:mod:`groupwise.episodes.lockstep`, on any generator) and the
streamed episodes (:mod:`groupwise.episodes.streamed`, on a generation stream). A turn's seed is derived from the
group's request seed, the sample index and the turn, so an episode samples the same tokens whatever batch or
driver it runs in.

Failures of the environment (it raises, times out, answers with something that is not a list of messages, or a
chat template that is not append-only) fail the episode. With ``episode.retry_failed_episodes`` N > 0 the episode
starts over from its opening with a fresh environment, up to N times (same seeds: on unchanged weights it samples
what it sampled before, so a retry never swaps a sample that broke the environment for another); past them its whole
group fails with :class:`EpisodeError`, a reward failure: async mode retries the prompt and then skips it with its
fate, sync mode stops naming the environment. Every failed episode counts in the run's
:class:`~groupwise.episodes.failure_streak.FailureStreak`, which stops the run after
``episode.max_consecutive_failures`` in a row. Failures of a tool call are the model's to read (an error
observation, :mod:`groupwise.episodes.tools`), unless the tool says they are its own machinery's.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from groupwise.data.scoring import MAX_ABS_REWARD, RewardError
from groupwise.episodes.deadline import PendingCall
from groupwise.episodes.environment import Environment, EnvironmentFactory, Message, StepResult, checked_messages
from groupwise.episodes.episode import Answer, Episode, EpisodeLimits
from groupwise.episodes.failure_streak import FailureStreak
from groupwise.episodes.template import ChatRenderer
from groupwise.seeding import derive_seed
from groupwise.types import Completion, GenerationCost, GenerationRequest, Prompt, attach_cost


class EpisodeError(RewardError):
    """An environment failed one episode of a group (the message names the environment, the prompt and the
    sample); the group is a reward failure of its prompt."""


@dataclass(frozen=True)
class EpisodeSettings:
    """What running episodes needs besides the generator: the ``episode`` section, resolved (``retries``:
    ``episode.retry_failed_episodes``; ``streak``: the run's count of failed episodes in a row)."""

    name: str
    factory: EnvironmentFactory
    renderer: ChatRenderer
    limits: EpisodeLimits
    step_timeout_s: float
    max_rows_per_call: int = 512
    retries: int = 0
    streak: FailureStreak = field(default_factory=lambda: FailureStreak(0, "environment"))


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
        sampled = sum(sum(e.trainable) + e.retried_tokens for e in self.episodes)
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
    ``step_timeout_s``, a hung one fails its episode and is abandoned (nothing ever waits for it, at exit neither).
    A failed opening is tried again with a fresh environment while the episode has retries left."""
    running = RunningGroup(prompt, seed, [], [])
    made = [PendingCall(settings.factory, f"groupwise-env-make-{i}") for i in range(group_size)]
    envs = [_made(call, settings.step_timeout_s) for call in made]
    resets = [
        PendingCall(_reset(env, prompt, i), f"groupwise-env-reset-{i}") if not isinstance(env, Exception) else None
        for i, env in enumerate(envs)
    ]
    for index, (env, reset) in enumerate(zip(envs, resets, strict=True)):
        try:
            opened = _first_opening(settings, index, env, reset)
        except _OpeningFailed as failed:
            error = failure(settings, prompt, index, failed.what, failed.cause)
            again = _opened_after_failure(settings, running, index, error, retries=0, tokens=0)
            if again is None:
                return running
            opened = again
        running.envs.append(opened[0])
        running.episodes.append(opened[1])
    return running


class _OpeningFailed(Exception):
    """An environment could not be made (``what``) or reset, because of ``cause``."""

    def __init__(self, what: str, cause: Exception) -> None:
        super().__init__(what)
        self.what, self.cause = what, cause


def _made(call: PendingCall[Environment], timeout_s: float) -> Environment | Exception:
    try:  # the user's environment constructor: a failure (or a hang) of this episode, named
        return call.result(timeout_s)
    except Exception as exc:
        return exc


def _first_opening(
    settings: EpisodeSettings, index: int, env: Environment | Exception, reset: PendingCall[object] | None
) -> tuple[Environment, Episode]:
    if isinstance(env, Exception):
        raise _OpeningFailed("could not be created", env)
    assert reset is not None, "an environment that was made is being reset"
    try:
        return env, _opened(settings, index, reset)
    except Exception as exc:
        raise _OpeningFailed("failed in reset()", exc) from exc


def _fresh_opening(settings: EpisodeSettings, prompt: Prompt, index: int) -> tuple[Environment, Episode]:
    """A new environment made and reset for sample ``index``, each call under the step deadline."""
    try:
        env = made_environment(settings)
    except Exception as exc:
        raise _OpeningFailed("could not be created", exc) from exc
    return _first_opening(settings, index, env, PendingCall(_reset(env, prompt, index), f"groupwise-env-reset-{index}"))


def _opened_after_failure(
    settings: EpisodeSettings, group: RunningGroup, index: int, error: EpisodeError, retries: int, tokens: int
) -> tuple[Environment, Episode] | None:
    """Count ``error`` in the run's streak, then open sample ``index`` again with a fresh environment while it has
    retries left (``retries`` used so far, ``tokens`` sampled by its failed attempts); every failed opening counts
    too. None: no retry left, the group failed with the last error (saying how many retries came before it)."""
    while True:
        settings.streak.failed(error)
        if retries >= settings.retries:
            group.error = group.error or _after_retries(error, retries)
            return None
        retries += 1
        try:
            env, episode = _fresh_opening(settings, group.prompt, index)
        except _OpeningFailed as failed:
            error = failure(settings, group.prompt, index, failed.what, failed.cause)
            continue
        episode.retries, episode.retried_tokens = retries, tokens
        return env, episode


def start_over(settings: EpisodeSettings, group: RunningGroup, episode: Episode, error: EpisodeError) -> Episode:
    """``episode`` failed with ``error`` (:func:`finish_step`'s): the episode that goes on in its place, a fresh one
    that starts from its opening with a fresh environment while it has retries left (its sampled tokens counted in
    the fresh one's ``retried_tokens``); else ``episode`` itself, its group failed. Makes and resets environments
    under the step deadline: the streamed driver calls it off its event loop."""
    if group.error is not None:  # another episode failed the group meanwhile
        settings.streak.failed(error)
        return episode
    position = group.episodes.index(episode)
    tokens = episode.retried_tokens + sum(episode.trainable)
    opened = _opened_after_failure(settings, group, episode.sample_index, error, episode.retries, tokens)
    if opened is None:
        return episode
    group.envs[position], group.episodes[position] = opened
    return opened[1]


def reopen_episode(settings: EpisodeSettings, group: RunningGroup, position: int) -> Episode:
    """Replace the episode at ``position`` of ``group`` by a fresh one: a new environment, reset (an episode that
    starts over after a resume); a failure of either call fails the group."""
    index = group.episodes[position].sample_index
    try:
        env, episode = _fresh_opening(settings, group.prompt, index)
    except _OpeningFailed as failed:
        group.error = group.error or failure(settings, group.prompt, index, failed.what, failed.cause)
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


def finish_step(settings: EpisodeSettings, step: TurnStep) -> EpisodeError | None:
    """Apply the environment's answer (waiting for it up to the step deadline). Its failure is returned, named: the
    caller hands it to :func:`start_over` (a fresh environment, or the group fails). An episode that finished ends
    the run's streak of failures."""
    episode, group = step.episode, step.group
    try:
        answer = step.call.result(settings.step_timeout_s)
        episode.env_seconds += step.call.seconds
        episode.apply(answer, step.reply)
    except Exception as exc:
        episode.env_seconds += step.call.seconds
        return failure(settings, group.prompt, episode.sample_index, "failed in step()", exc)
    if episode.finished:
        settings.streak.finished()
    return None


def _after_retries(error: EpisodeError, retries: int) -> EpisodeError:
    if not retries:
        return error
    again = EpisodeError(f"{error} (after {retries} retries with a fresh environment)", error.prompt_uid,
                         error.completion_index)  # fmt: skip
    again.__cause__ = error.__cause__
    return again


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
