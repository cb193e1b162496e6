"""One episode as a state machine over tokens: the model's turns kept as sampled, the environment's rendered.

The episode's completion is every token after its opening prompt: sampled tokens (trainable, with the logprob
and weight version they were sampled with) and environment tokens (not trainable, logprob 0, the version of the
turn before them). Limits (docs/environments.md): ``max_turns`` model turns; ``max_tokens`` tokens after the
opening prompt, model and environment together (a turn is given at most what is left); one observation at most
``max_observation_tokens`` (its text is cut, and counted); an observation that would pass ``max_tokens`` ends
the episode instead (``token_budget``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from groupwise.episodes.environment import Message, StepResult
from groupwise.episodes.record import EpisodeEnd, EpisodeRecord, EpisodeResume
from groupwise.types import Completion, FinishReason

if TYPE_CHECKING:
    from groupwise.episodes.template import ChatRenderer

TRUNCATION_MARK = " …[truncated]"


@dataclass(frozen=True)
class EpisodeLimits:
    """``episode.max_turns``, ``episode.max_tokens``, ``episode.max_observation_tokens``, the per-turn cap
    ``generation.max_new_tokens`` and the model's positions (``max_context``: prompt and episode together)."""

    max_turns: int
    max_tokens: int
    max_observation_tokens: int
    max_turn_tokens: int
    max_context: int | None = None


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

    def apply(self, result: StepResult, reply: Message, sampled: list[int], renderer: ChatRenderer) -> None:
        """Record the environment's answer to the last turn: its reward and counts, then either the end of the
        episode or the observation tokens (cut to the observation cap; the end when the budget has no room)."""
        self.step_rewards.append(float(result.reward))
        self.tool_calls += int(result.info.get("tool_calls", 0))
        self.tool_errors += int(result.info.get("tool_errors", 0))
        observations = tuple(result.messages)
        self.observations.append(observations)
        if result.done:
            self.end = "done"
            return
        if self.turns >= self.limits.max_turns:
            self.end = "max_turns"
            return
        env_ids, cut = self._render(reply, sampled, observations, renderer)
        if cut != observations:
            self.truncated_observations += 1
            self.observations[-1] = observations = cut
        if env_ids is None or len(env_ids) >= self.room():  # no room for the answer and one more sampled token
            self.end = "token_budget"
            return
        version = self.versions[-1] if self.versions else 0
        self.token_ids += env_ids
        self.logprobs += [0.0] * len(env_ids)
        self.versions += [version] * len(env_ids)
        self.trainable += [False] * len(env_ids)
        self.history += [reply, *observations]

    def _render(
        self, reply: Message, sampled: list[int], observations: tuple[Message, ...], renderer: ChatRenderer
    ) -> tuple[list[int] | None, tuple[Message, ...]]:
        """The environment tokens of ``observations``, their contents cut (and marked) until the rendered answer
        fits ``max_observation_tokens``; ``None`` when even its framing with empty contents does not fit."""
        cap = self.limits.max_observation_tokens
        closing_only = len(renderer.after_turn(self.history, reply, sampled, ()))
        shown, keep = observations, 1.0
        for _ in range(12):
            env_ids = renderer.after_turn(self.history, reply, sampled, shown)
            size = len(env_ids) - closing_only
            if size <= cap:
                return env_ids, shown
            if keep == 0.0:
                break
            keep = keep * 0.9 * cap / size if keep * cap / size > 0.01 else 0.0
            shown = tuple(_cut(m, keep) for m in observations)
        return None, shown

    def record(self, reward: float) -> EpisodeRecord:
        assert self.end is not None, "a finished episode"
        return EpisodeRecord(
            turns=self.turns, end=self.end, reward=reward, step_rewards=tuple(self.step_rewards),
            tool_calls=self.tool_calls, tool_errors=self.tool_errors,
            truncated_observations=self.truncated_observations, env_seconds=self.env_seconds,
            model_tokens=sum(self.trainable), env_tokens=len(self.trainable) - sum(self.trainable),
            assistant=tuple(self.assistant), observations=tuple(self.observations), resume=self.resume,
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


def _cut(message: Message, keep: float) -> Message:
    content = message["content"]
    return {**message, "content": content[: int(len(content) * keep)] + TRUNCATION_MARK}
