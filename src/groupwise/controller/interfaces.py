"""What the controller and the sync loop talk to: a prompt source, a rollout client and a trainer client.

Kept small on purpose: the embedded runtime implements them with the real generator, reward function and
learner; the Ray runtime with actors; the simulator with simulated ones; the tests with scripted fakes
(``tests/fakes``). What only some clients can do is an optional capability of its own (:class:`CancelledCost`,
:class:`ResumableRollouts`, :class:`SelfTimedRollouts`, and a prompt source's :class:`SkipsNoSignal`): a client
declares it by implementing it, and the controller and the loops ask for it by type (``isinstance``), never by
probing for an attribute.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from groupwise.chunks import TrainChunk
from groupwise.types import GenerationCost, Group, LoaderItem

if TYPE_CHECKING:
    from groupwise.data.signal_history import SkippedDraw

__all__ = ["CancelledCost", "LoaderItem", "PromptSource", "ResumableRollouts", "RolloutClient", "SelfTimedRollouts",
           "SkipsNoSignal", "TrainerClient"]


@runtime_checkable
class PromptSource(Protocol):
    """A checkpointable prompt stream (``groupwise.data.loader.PromptLoader`` satisfies this)."""

    @property
    def exhausted(self) -> bool: ...

    def take(self, n: int) -> Sequence[LoaderItem]: ...

    def push_front(self, items: Sequence[LoaderItem]) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...


@runtime_checkable
class SkipsNoSignal(Protocol):
    """A prompt source that skips draws predicted to carry no signal before they are dispatched
    (``groupwise.data.skipping_loader``): the loops tell it each generated group's outcome, and write a
    ``skipped_no_signal`` fate for each draw it skipped, right after the ``take`` that skipped it."""

    def observe(self, group: Group) -> None:
        """Record a generated group's outcome in its prompt's history."""
        ...

    def drain_skipped(self) -> Sequence[SkippedDraw]:
        """The draws skipped since the last call, in draw order."""
        ...


@runtime_checkable
class RolloutClient(Protocol):
    """Generation + scoring of one prompt group, and weight updates of the generator."""

    async def rollout(self, prompt: LoaderItem, group_id: int, attempt: int, start_version: int) -> Group:
        """Generate G completions of ``prompt.prompt`` and score them, for an attempt dispatched at generator version
        ``start_version``.

        The returned group carries what it was given — ``group_id``, ``attempt``, ``start_version`` and the
        prompt's ``epoch`` — set once here (the controller checks them), and ``end_version``, the generator version
        it finished under. ``attempt`` (0, 1, ...) numbers the attempts at this prompt so seeds can be derived from
        (run seed, prompt uid, attempt). Raise on failure: the controller classifies the error
        (``groupwise.controller.failures``) and retries or skips.
        """
        ...

    async def sync_weights(self, version: int) -> None:
        """Load the trainer's weights of ``version`` into the generator (in-flight rollouts may continue)."""
        ...


# --- optional capabilities: a client declares one by implementing it; the controller asks by type ---------------


@runtime_checkable
class CancelledCost(Protocol):
    """A rollout client that can say what a cancelled attempt cost (for the ``waste/*`` accounting)."""

    async def spent(self, group_id: int) -> GenerationCost:
        """What the attempt of ``group_id`` that the controller cancelled cost, once its generator stopped working
        on it (nothing, :data:`~groupwise.types.NO_COST`, for an attempt it never ran)."""
        ...


@runtime_checkable
class ResumableRollouts(Protocol):
    """A rollout client that keeps what running attempts generated and can continue one after a resume;
    ``resumed_tokens`` counts the tokens it continued rather than generated again."""

    resumed_tokens: int

    async def fetch_progress(self) -> dict[int, dict[str, Any] | None]:
        """What every running attempt generated so far, by group id, as plain JSON-able data (a checkpoint saves
        it). Read right after a controller snapshot: a later token boundary of the same attempts."""
        ...

    async def resume(
        self, prompt: LoaderItem, group_id: int, attempt: int, start_version: int, progress: dict[str, Any]
    ) -> Group:
        """Continue the attempt a checkpoint saved (``progress``, as :meth:`fetch_progress` gave it) instead of
        starting it again; the group is as :meth:`RolloutClient.rollout` returns it."""
        ...


@runtime_checkable
class SelfTimedRollouts(Protocol):
    """A rollout client that sets each group's ``gen_seconds`` itself (the simulator, whose generator has no calls
    to time); the sync loop otherwise splits each round's seconds among its groups."""

    attributes_gen_seconds: bool


@runtime_checkable
class TrainerClient(Protocol):
    """The learner side of one RL step, fed in chunks of whole groups."""

    async def train_chunk(self, step: int, chunk: TrainChunk, first_chunk: bool) -> None:
        """Forward/backward for one chunk of ``step`` (whole groups and their advantages, built by the loop that
        assembles the step); the step stays open until :meth:`finish_step`."""
        ...

    async def finish_step(self, step: int) -> dict[str, float]:
        """One optimizer step over every chunk of ``step`` (one loss normaliser); return its metrics."""
        ...
