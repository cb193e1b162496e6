"""A group's harness sessions on a generation stream: each request joins the running decode loop as it comes.

The endpoint's handlers submit each prepared request to the stream as a request of its own (it joins whatever the
stream decodes: other sessions' requests, other groups, single-turn rows) and await its answer without holding a
thread; a session busy with a slow tool delays nobody. The group's coroutine only waits for its harnesses
(:meth:`groupwise.harness.runner.HarnessRunner.run_group`); cancelled (the controller dropped the group), every
request it still has on the stream is cancelled there and the group's harnesses are stopped.

A black-box harness cannot be replayed, so a checkpoint keeps no partial session: a resumed run starts the group's
sessions again, and their records say so (``resume: restarted``, counted in ``episode/resumed_restarted``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from groupwise.generation.base import RequestStream
from groupwise.runtime.thread_answers import answer_from_thread
from groupwise.types import Completion, GenerationRequest, SamplingParams


@dataclass
class StreamTurns:
    """A :class:`~groupwise.harness.endpoint.TurnSampler` for one group on ``stream``: what its requests cost, and
    the ones still on the stream (cancelled with the group)."""

    stream: RequestStream
    sampling: SamplingParams
    weight_version: Callable[[], int]  # the generator's current version
    seconds: float = 0.0
    sampled_tokens: int = 0
    on_stream: set[int] = field(default_factory=set)

    @property
    def version(self) -> int:
        return self.weight_version()

    async def sample(self, request: GenerationRequest) -> list[Completion]:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[list[Completion]] = loop.create_future()
        handle = self.stream.submit(request, answer_from_thread(loop, answer))
        self.on_stream.add(handle)
        try:
            completions = await answer
        except asyncio.CancelledError:
            self.stream.cancel(handle)
            raise
        finally:
            self.on_stream.discard(handle)
        self.seconds += self.stream.cost(handle)[1]
        self.stream.forget(handle)
        self.sampled_tokens += sum(len(c.token_ids) for c in completions)
        return completions

    def cancel(self) -> None:
        """Cancel every request of the group still on the stream."""
        for handle in list(self.on_stream):
            self.stream.cancel(handle)


def harness_progress(turns: StreamTurns) -> dict[str, Any] | None:
    """What a checkpoint keeps of a running harness group: that it had started (its sessions restart on resume),
    or nothing when it had not sampled anything yet."""
    return {"kind": "harness"} if turns.sampled_tokens or turns.on_stream else None
