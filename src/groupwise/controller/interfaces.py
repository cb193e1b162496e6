"""What the controller and the sync loop talk to: a prompt source, a rollout client and a trainer client.

Kept small on purpose: the embedded runtime implements them with the real generator, reward function and
learner; the Ray runtime with actors; the simulator with simulated ones; the tests with scripted fakes
(``tests/fakes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from groupwise.types import Group, Prompt


class LoaderItem(Protocol):
    """One prompt as the loader yielded it (``groupwise.data.loader.LoadedPrompt`` satisfies this)."""

    @property
    def prompt(self) -> Prompt: ...

    @property
    def epoch(self) -> int: ...

    @property
    def index_in_epoch(self) -> int: ...


@runtime_checkable
class PromptSource(Protocol):
    """A checkpointable prompt stream (``groupwise.data.loader.PromptLoader`` satisfies this)."""

    @property
    def exhausted(self) -> bool: ...

    def take(self, n: int) -> list[LoaderItem]: ...

    def push_front(self, items: Sequence[LoaderItem]) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...


@runtime_checkable
class RolloutClient(Protocol):
    """Generation + scoring of one prompt group, and weight updates of the generator."""

    async def rollout(self, prompt: LoaderItem, group_id: int, attempt: int, start_version: int) -> Group:
        """Generate G completions of ``prompt.prompt`` under weight version ``start_version`` and score them.

        The returned group must carry ``group_id``; ``attempt`` (0, 1, ...) numbers the attempts at this
        prompt so seeds can be derived from (run seed, prompt uid, attempt). Raise on failure: the
        controller classifies the error (``groupwise.controller.failures``) and retries or skips.
        """
        ...

    async def sync_weights(self, version: int) -> None:
        """Load the trainer's weights of ``version`` into the generator (in-flight rollouts may continue)."""
        ...


@runtime_checkable
class TrainerClient(Protocol):
    """The learner side of one RL step, fed in chunks of whole groups."""

    async def train_chunk(self, step: int, groups: list[Group], first_chunk: bool) -> None:
        """Prev-logprobs, advantages and forward/backward for one chunk of ``step``; the step stays open."""
        ...

    async def finish_step(self, step: int) -> dict[str, float]:
        """One optimizer step over every chunk of ``step`` (one loss normaliser); return its metrics."""
        ...
