"""What a harness gets for one sample: where to send its requests, with which key, and the prompt row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from groupwise.types import Prompt


@dataclass(frozen=True)
class HarnessSession:
    """One sample's session: ``base_url`` and ``api_key`` for any OpenAI client, the ``model`` name to ask for,
    the prompt row, which of the group's G samples this is and a seed derived from the run's seed, the prompt and
    the sample (for a harness that makes random choices of its own).

    The key is this session's alone: every request made with it is recorded into this sample and no other."""

    base_url: str
    api_key: str
    model: str
    prompt: Prompt
    sample_index: int
    seed: int

    @property
    def messages(self) -> list[dict[str, str]]:
        """The prompt as chat messages: its own, or its text as one user message."""
        if self.prompt.messages is not None:
            return [dict(m) for m in self.prompt.messages]
        return [{"role": "user", "content": self.prompt.text or ""}]

    @property
    def answer(self) -> str:
        """What the prompt's reward checks against."""
        return self.prompt.answer

    @property
    def metadata(self) -> dict[str, Any]:
        return dict(self.prompt.metadata)

    def as_data(self) -> dict[str, Any]:
        """The session as JSON-able data: what a harness command reads on its standard input."""
        return {
            "base_url": self.base_url,
            "api_key": self.api_key,
            "model": self.model,
            "uid": self.prompt.uid,
            "prompt": self.prompt.text,
            "messages": self.messages,
            "answer": self.answer,
            "metadata": self.metadata,
            "sample_index": self.sample_index,
            "seed": self.seed,
        }
