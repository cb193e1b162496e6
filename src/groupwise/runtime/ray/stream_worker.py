"""A Ray generation worker's side of continuous batching: blocking calls into a generation stream on its own thread.

The worker actor is threaded (:func:`groupwise.runtime.ray.actors.generation_concurrency`), so each of its calls
runs in a thread of its own and blocks only itself: :meth:`StreamedWorker.outcomes` submits its groups to the
stream and waits for their completions (then scores them), :meth:`StreamedWorker.load_weights` waits until the
stream loaded the new weights at a token boundary, :meth:`StreamedWorker.progress_by_group` reads what the running
attempts generated so far (:mod:`groupwise.runtime.inflight`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from groupwise.generation.factory import open_stream
from groupwise.runtime.inflight import encode_progress
from groupwise.types import (
    Completion,
    GenerationCost,
    GenerationRequest,
    Group,
    LoaderItem,
    attach_cost,
    charge_seconds,
)

if TYPE_CHECKING:
    from groupwise.config import RunConfig
    from groupwise.trainer.builder import Components

T = TypeVar("T")


class GroupCancelled(RuntimeError):
    """The driver cancelled a group this call was waiting for (its requester is gone); carries what the group cost
    (``groupwise.types.cost_of``) once its rows left the stream."""


class _Answer(Generic[T]):
    """What the stream hands back for one request, waited for by the calling thread (``value`` is set before
    ``ready``)."""

    value: T

    def __init__(self) -> None:
        self.ready = threading.Event()

    def __call__(self, value: T) -> None:
        self.value = value
        self.ready.set()


_Generated = _Answer[list[Completion] | BaseException]  # a request's completions, or why there are none


class StreamedWorker:
    """A generation worker's engine stream and the calls that feed it (see the module docstring)."""

    def __init__(self, parts: Components, cfg: RunConfig) -> None:
        self.rollouts = parts.rollouts
        self.stream = open_stream(
            parts.engine, parts.rollouts.sampling,
            max_rows=cfg.generation.micro_batch_groups * cfg.grpo.num_generations_per_prompt,
            partial=cfg.async_.partial_rollouts,
            kv=cfg.async_.partial_rollout_kv,
        )
        self.stream.start("groupwise-generation")
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self._running: dict[int, tuple[int, GenerationRequest, _Generated]] = {}

    def outcomes(
        self, items: Sequence[LoaderItem], group_ids: Sequence[int], attempts: Sequence[int],
        start_versions: Sequence[int], prefixes: Sequence[tuple] | None,
    ) -> list[Group | Exception]:  # fmt: skip
        """Each group, or its own reward failure; an engine failure fails the call."""
        prefixes = list(prefixes) if prefixes is not None else [()] * len(items)
        waiting = []
        for item, group_id, attempt, rows in zip(items, group_ids, attempts, prefixes, strict=True):
            request = self.rollouts.request_for(item, attempt, tuple(rows))
            answer: _Generated = _Answer()
            handle = self.stream.submit(request, answer)
            with self._lock:
                self._running[group_id] = (handle, request, answer)
            waiting.append((item, group_id, attempt, request, handle, answer))
        try:
            outcomes: list[Group | Exception] = []
            for (item, group_id, attempt, request, handle, answer), start in zip(waiting, start_versions, strict=True):
                answer.ready.wait()
                if isinstance(answer.value, GroupCancelled):  # its place holds the cost, for the driver's books
                    outcomes.append(answer.value)
                    continue
                if isinstance(answer.value, BaseException):
                    raise answer.value
                _, seconds = self.stream.cost(handle)
                scored = self.rollouts.score_group(
                    item, group_id, attempt, request, answer.value, start, self.rollouts.generator.version
                )  # fmt: skip
                outcomes.append(charge_seconds(scored, seconds))
            return outcomes
        finally:
            with self._lock:
                for _, group_id, _, _, handle, _ in waiting:
                    self._running.pop(group_id, None)
                    self.stream.cancel(handle)  # a no-op for an answered request, other than forgetting it

    def cancel(self, group_ids: Sequence[int]) -> None:
        """The driver gave up on these groups (aborted as stale, or the run stops): free their rows, end their call."""
        with self._lock:
            running = [self._running.get(group_id) for group_id in group_ids]
        for entry in running:
            if entry is not None:
                handle, _, answer = entry
                self.stream.cancel(handle, partial(_answer_cancelled, answer))

    def load_weights(self, load: Callable[[], None]) -> None:
        """Have the stream run ``load`` at a token boundary (or after a drain) and wait for it; one at a time (the
        stream holds one pending load)."""
        with self._load_lock:
            answer: _Answer[BaseException | None] = _Answer()
            self.stream.post_weights(load, answer)
            answer.ready.wait()
        if answer.value is not None:
            raise answer.value

    def progress_by_group(self) -> dict[int, dict[str, Any] | None]:
        progress = self.stream.progress()
        sampling = self.rollouts.sampling
        with self._lock:
            running = list(self._running.items())
        return {
            group_id: encode_progress(request, sampling, progress[handle])
            for group_id, (handle, request, _) in running
            if handle in progress
        }


def _answer_cancelled(answer: _Generated, tokens: int, seconds: float) -> None:
    """A cancelled group's call gets a :class:`GroupCancelled` in its place, carrying what the group had cost."""
    answer(attach_cost(GroupCancelled("the driver cancelled this group"), GenerationCost(tokens, seconds)))
