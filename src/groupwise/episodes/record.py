"""What one finished episode did: turns, tool calls, how it ended and what the environment cost."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

EpisodeEnd = Literal["done", "max_turns", "token_budget"]
"""``done``: the environment ended it; ``max_turns``: it reached ``episode.max_turns`` without that;
``token_budget``: the next turn had no room left in ``episode.max_tokens``."""

EpisodeResume = Literal["", "continued", "restarted"]
"""How a resumed run took the episode back: ``""`` it was never interrupted; ``continued`` at its turn and token,
the environment rebuilt by giving it the recorded turns again; ``restarted`` from its opening, because the rebuilt
environment answered differently."""


@dataclass(frozen=True)
class EpisodeRecord:
    """The summary of one episode, carried on its :class:`~groupwise.types.Completion` (and in ``train_data``).

    ``assistant`` holds the text of each model turn and ``observations`` the messages the environment answered
    each with, so an episode can be replayed into a fresh environment (``groupwise audit --replay-episodes``).
    ``model_tokens`` were sampled and train; ``env_tokens`` (chat-template framing and observations) do not.
    ``retries`` counts the times the sample started over with a fresh environment (session) after a failure
    (``episode.retry_failed_episodes``), and ``retried_tokens`` what those failed attempts had sampled.
    A harness session's record also holds ``harness``: its sequences, requests and their limits, retokenized
    tokens, and its request log (each request as asked, where it was placed, the ids served), which
    ``groupwise audit --replay-sessions`` renders again.
    """

    turns: int
    end: EpisodeEnd
    reward: float
    step_rewards: tuple[float, ...]
    tool_calls: int = 0
    tool_errors: int = 0
    truncated_observations: int = 0
    env_seconds: float = 0.0
    model_tokens: int = 0
    env_tokens: int = 0
    assistant: tuple[str, ...] = ()
    observations: tuple[tuple[dict[str, str], ...], ...] = ()
    resume: EpisodeResume = ""
    retries: int = 0
    retried_tokens: int = 0
    harness: dict[str, Any] | None = None  # a harness session's counts and request log (docs/harnesses.md)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["observations"] = [[dict(m) for m in turn] for turn in self.observations]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpisodeRecord:
        return cls(**{
            **data,
            "step_rewards": tuple(data["step_rewards"]),
            "assistant": tuple(data.get("assistant", ())),
            "observations": tuple(tuple(dict(m) for m in turn) for turn in data.get("observations", ())),
        })  # fmt: skip
