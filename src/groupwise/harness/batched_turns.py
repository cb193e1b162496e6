"""Harness requests sampled in batches on any generator, on the thread that owns it.

The sync loop, evaluation, the vLLM backend and Ray's workers hand the generator one batch of requests at a time.
Here the endpoint's handlers queue their prepared requests (:meth:`BatchedTurns.sample`) and the thread that owns the
generator serves them (:meth:`BatchedTurns.serve_until`): it samples a batch as soon as every running session of
its sessions has a request queued, or ``window_s`` after the first request of the batch arrived, whichever comes
first. A session busy with a slow tool therefore holds the others up by at most the window, never until its tool
returns. Sampling depends on each request's seed, not on the batch it lands in.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from groupwise.generation.base import Generator
from groupwise.generation.request_limits import generate_by_limit
from groupwise.types import Completion, GenerationRequest, SamplingParams

Pressure = Callable[[], tuple[int, int, int]]
"""``(sessions, sessions with a request in flight, requests in flight)`` of the sessions this sampler serves."""


@dataclass
class _Ask:
    request: GenerationRequest
    future: asyncio.Future[list[Completion]]
    loop: asyncio.AbstractEventLoop
    arrived: float


class BatchedTurns:
    """A :class:`~groupwise.harness.endpoint.TurnSampler` over ``generator``, served by :meth:`serve_until`."""

    def __init__(self, generator: Generator, sampling: SamplingParams, window_s: float, max_rows: int = 512) -> None:
        self.generator = generator
        self.sampling = sampling
        self.window_s = window_s
        self.max_rows = max_rows
        self.pressure: Pressure = lambda: (0, 0, 0)
        self.seconds = 0.0
        self._asks: list[_Ask] = []
        self._ready = threading.Condition()

    @property
    def version(self) -> int:
        return self.generator.version

    async def sample(self, request: GenerationRequest) -> list[Completion]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Completion]] = loop.create_future()
        with self._ready:
            self._asks.append(_Ask(request, future, loop, time.monotonic()))
            self._ready.notify_all()
        return await future

    def serve_until(self, finished: Callable[[], bool], poll_s: float = 0.05) -> None:
        """Sample queued requests in batches until ``finished()`` (checked at least every ``poll_s``); a generator
        failure is raised here after every waiting request was told."""
        while not finished():
            batch = self._next_batch(poll_s)
            if not batch:
                continue
            started = time.perf_counter()
            try:
                outputs = generate_by_limit([a.request for a in batch], self.sampling, self.generator.generate)
            except BaseException as exc:
                for ask in batch:
                    _settle(ask, exc)
                raise
            finally:
                self.seconds += time.perf_counter() - started
            for ask, completions in zip(batch, outputs, strict=True):
                _settle(ask, completions)

    def drain(self, error: BaseException) -> None:
        """Answer every request still queued with ``error`` (its session ended: nobody will serve it)."""
        with self._ready:
            asks, self._asks = self._asks, []
        for ask in asks:
            _settle(ask, error)

    def _next_batch(self, poll_s: float) -> list[_Ask]:
        """The requests to sample now: wait for the first, then for the rest of the running sessions' requests up
        to the window."""
        with self._ready:
            if not self._asks:
                self._ready.wait(poll_s)
                if not self._asks:
                    return []
            deadline = self._asks[0].arrived + self.window_s
            while not self._everyone_waits() and (left := deadline - time.monotonic()) > 0:
                self._ready.wait(min(left, poll_s))
            batch, self._asks = self._asks[: self.max_rows], self._asks[self.max_rows :]
        return [ask for ask in batch if not ask.future.cancelled()]

    def _everyone_waits(self) -> bool:
        sessions, waiting, in_flight = self.pressure()
        return waiting >= sessions and len(self._asks) >= in_flight


def _settle(ask: _Ask, outcome: list[Completion] | BaseException) -> None:
    def settle() -> None:
        if ask.future.done():
            return
        if isinstance(outcome, BaseException):
            ask.future.set_exception(outcome)
        else:
            ask.future.set_result(outcome)

    with contextlib.suppress(RuntimeError):  # the endpoint's loop closed: nobody waits any more
        ask.loop.call_soon_threadsafe(settle)
