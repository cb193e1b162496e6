"""One episode as a state machine over tokens: the model's turns kept as sampled, the environment's rendered.

The episode's completion is every token after its opening prompt: sampled tokens (trainable, with the logprob
and weight version they were sampled with) and environment tokens (not trainable, logprob 0, the version of the
turn before them). Limits (docs/environments.md): ``max_turns`` model turns; ``max_tokens`` tokens after the
opening prompt, model and environment together (a turn is given at most what is left); one observation at most
``max_observation_tokens`` (its text is cut, and counted); an observation that would pass ``max_tokens`` ends
the episode instead (``token_budget``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from groupwise.episodes.environment import Message, StepResult
from groupwise.episodes.record import EpisodeEnd, EpisodeRecord, EpisodeResume
from groupwise.types import Completion, FinishReason

if TYPE_CHECKING:
    from groupwise.episodes.template import ChatRenderer

T = TypeVar("T")

TRUNCATION_MARK = " …[truncated]"
#: The most characters one token is taken to cover. An answer's contents are cut to ``max_observation_tokens ×
#: MAX_CHARS_PER_TOKEN`` characters before anything renders or tokenizes them, so an answer of megabytes costs what
#: one of that size costs; its first ``max_observation_tokens`` tokens are kept unless its tokens are longer than
#: this on average (long runs of one character), when it keeps the characters that bound allows.
MAX_CHARS_PER_TOKEN = 32


@dataclass(frozen=True)
class EpisodeLimits:
    """``episode.max_turns``, ``episode.max_tokens``, ``episode.max_observation_tokens``, the per-turn cap
    ``generation.max_new_tokens`` and the model's positions (``max_context``: prompt and episode together)."""

    max_turns: int
    max_tokens: int
    max_observation_tokens: int
    max_turn_tokens: int
    max_context: int | None = None


@dataclass(frozen=True)
class Answer:
    """An environment's answer to one turn, made ready on the step's thread (:meth:`Episode.prepare`): the checked
    result, its messages as kept (cut to the observation cap, marked), how the answer ends the episode (None: it
    goes on) and, when it goes on, the tokens the model reads next."""

    result: StepResult
    observations: tuple[Message, ...]
    truncated: bool
    end: EpisodeEnd | None
    env_ids: tuple[int, ...] = ()


@dataclass
class Episode:
    """One of a group's G episodes, from its opening messages to its end."""

    sample_index: int
    history: list[Message]
    prompt_ids: tuple[int, ...]
    limits: EpisodeLimits
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    trainable: list[bool] = field(default_factory=list)
    assistant: list[str] = field(default_factory=list)
    observations: list[tuple[Message, ...]] = field(default_factory=list)
    step_rewards: list[float] = field(default_factory=list)
    end: EpisodeEnd | None = None
    last_finish: FinishReason = "stop"
    tool_calls: int = 0
    tool_errors: int = 0
    truncated_observations: int = 0
    env_seconds: float = 0.0
    resume: EpisodeResume = ""
    retries: int = 0  # times the sample started over with a fresh environment after a failure
    retried_tokens: int = 0  # tokens its failed attempts had sampled

    @property
    def finished(self) -> bool:
        return self.end is not None

    @property
    def turns(self) -> int:
        return len(self.assistant)

    def context(self) -> tuple[int, ...]:
        """What the model continues next: the opening prompt and every token since."""
        return self.prompt_ids + tuple(self.token_ids)

    def room(self) -> int:
        """Tokens the episode may still add: what the token budget leaves, within the model's positions."""
        left = self.limits.max_tokens - len(self.token_ids)
        if self.limits.max_context is not None:
            left = min(left, self.limits.max_context - len(self.prompt_ids) - len(self.token_ids))
        return left

    def turn_cap(self) -> int:
        """New tokens the next turn may sample: the per-turn cap within :meth:`room`."""
        return min(self.limits.max_turn_tokens, self.room())

    def add_turn(self, completion: Completion) -> Message:
        """Append the model's sampled tokens as they are; the reply message the environment will see."""
        self.token_ids += completion.token_ids
        self.logprobs += completion.logprobs
        self.versions += completion.token_versions
        self.trainable += [True] * len(completion.token_ids)
        self.assistant.append(completion.text)
        self.last_finish = completion.finish_reason
        return {"role": "assistant", "content": completion.text}

    def prepare(self, result: StepResult, reply: Message, sampled: list[int], renderer: ChatRenderer) -> Answer:
        """The environment's answer to the last turn made ready for :meth:`apply`, without changing the episode:
        its messages cut to the observation cap and, when the model reads them next, their tokens. Run on the
        step's own thread (never the controller's or the stream's loop): an answer of megabytes costs no more
        than ``cap × MAX_CHARS_PER_TOKEN`` characters of rendering there, and nothing anywhere else."""
        observations = tuple(result.messages)
        cap = self.limits.max_observation_tokens
        if result.done or self.turns >= self.limits.max_turns:  # never shown: kept (in the record) under the cap
            _, kept = largest_fit(observations, cap, lambda shown: _content_fits(shown, cap, renderer))
            return Answer(result, kept, kept is not observations, "done" if result.done else "max_turns")
        closing = len(renderer.after_turn(self.history, reply, sampled, ()))

        def fitting(shown: tuple[Message, ...]) -> list[int] | None:
            env_ids = renderer.after_turn(self.history, reply, sampled, shown)
            return env_ids if len(env_ids) - closing <= cap else None

        env_ids, kept = largest_fit(observations, cap, fitting)
        if env_ids is None or len(env_ids) >= self.room():  # no room for the answer and one more sampled token
            return Answer(result, kept, kept is not observations, "token_budget")
        return Answer(result, kept, kept is not observations, None, tuple(env_ids))

    def apply(self, answer: Answer, reply: Message) -> None:
        """Record the prepared answer to the last turn: its reward and counts, then either the end of the episode
        or the observation tokens."""
        result = answer.result
        self.step_rewards.append(float(result.reward))
        self.tool_calls += int(result.info.get("tool_calls", 0))
        self.tool_errors += int(result.info.get("tool_errors", 0))
        self.observations.append(answer.observations)
        self.truncated_observations += answer.truncated
        if answer.end is not None:
            self.end = answer.end
            return
        version = self.versions[-1] if self.versions else 0
        self.token_ids += answer.env_ids
        self.logprobs += [0.0] * len(answer.env_ids)
        self.versions += [version] * len(answer.env_ids)
        self.trainable += [False] * len(answer.env_ids)
        self.history += [reply, *answer.observations]

    def record(self, reward: float) -> EpisodeRecord:
        assert self.end is not None, "a finished episode"
        return EpisodeRecord(
            turns=self.turns, end=self.end, reward=reward, step_rewards=tuple(self.step_rewards),
            tool_calls=self.tool_calls, tool_errors=self.tool_errors,
            truncated_observations=self.truncated_observations, env_seconds=self.env_seconds,
            model_tokens=sum(self.trainable), env_tokens=len(self.trainable) - sum(self.trainable),
            assistant=tuple(self.assistant), observations=tuple(self.observations), resume=self.resume,
            retries=self.retries, retried_tokens=self.retried_tokens,
        )  # fmt: skip

    def completion(self, text: str, lead: tuple[int, ...] = ()) -> Completion:
        """The episode as one completion: every token after the opening prompt, with its trainable flag.

        ``lead``: opening tokens put before them as environment tokens, when the group's row prompt is only the
        part of the openings its G episodes share."""
        first = self.versions[0] if self.versions else 0
        return Completion(
            token_ids=lead + tuple(self.token_ids), logprobs=(0.0,) * len(lead) + tuple(self.logprobs), text=text,
            finish_reason=self.last_finish, weight_version=self.versions[-1] if self.versions else 0,
            token_versions=(first,) * len(lead) + tuple(self.versions),
            trainable=(False,) * len(lead) + tuple(self.trainable), episode=self.record(sum(self.step_rewards)),
        )  # fmt: skip


def largest_fit(
    observations: tuple[Message, ...], cap: int, fitting: Callable[[tuple[Message, ...]], T | None]
) -> tuple[T | None, tuple[Message, ...]]:
    """``(fitting(kept), kept)``: ``observations`` themselves when they fit, else each content cut to the same
    share of its length and marked, the largest share ``fitting`` accepts (bisection); ``(None, contents
    emptied)`` when not even that fits. Contents are first cut to ``cap × MAX_CHARS_PER_TOKEN`` characters, so no
    rendering is ever given more."""
    bound = cap * MAX_CHARS_PER_TOKEN
    bases = [message["content"][:bound] for message in observations]

    def shown_at(keep: float) -> tuple[Message, ...]:
        out = []
        for message, base in zip(observations, bases, strict=True):
            size = int(len(base) * keep)
            whole = size >= len(message["content"])
            out.append(message if whole else {**message, "content": base[:size] + TRUNCATION_MARK})
        return observations if all(a is b for a, b in zip(out, observations, strict=True)) else tuple(out)

    for keep in (1.0, 0.0):  # all of it (within the bound) fits; not even empty contents fit
        shown = shown_at(keep)
        best = (fitting(shown), shown)
        if (best[0] is not None) == (keep == 1.0):
            return best
    low, high = 0.0, 1.0
    while (high - low) * max(map(len, bases)) >= 1.0:  # one character of the longest content
        middle = (low + high) / 2
        shown = shown_at(middle)
        found = fitting(shown)
        if found is not None:
            low, best = middle, (found, shown)
        else:
            high = middle
    return best


def _content_fits(shown: tuple[Message, ...], cap: int, renderer: ChatRenderer) -> bool | None:
    """True when the contents of ``shown`` take at most ``cap`` tokens together (None otherwise): the cap of
    messages no one renders (an episode's last answer)."""
    return True if sum(len(renderer.ids(message["content"])) for message in shown) <= cap else None
