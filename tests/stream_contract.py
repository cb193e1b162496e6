"""The request-stream contract, as one check every streaming backend's tests run on a started stream.

A new streaming backend (``RequestStream``: ``submit``, ``cancel``, ``cost``, ``forget``, ``progress``,
``post_weights`` and the counters) passes :func:`check_request_stream_contract` before anything else: each
request is answered once with one completion per sample within its token limit (its own ``max_new_tokens`` too);
a cancel reports its cost exactly once (also for a request already answered); ``progress`` holds a request only
while it is not forgotten, as a prefix of what it is answered with; a weight post runs its load and calls ``done``
once; the step counter and the busy seconds move forward.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from groupwise.types import GenerationRequest


class Calls:
    """A callback that counts its calls and keeps their arguments (test helper)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.event = threading.Event()

    def __call__(self, *args) -> None:
        self.calls.append(args)
        self.event.set()

    def wait(self, timeout_s: float) -> tuple:
        assert self.event.wait(timeout_s), "no call in time"
        return self.calls[0]


def check_request_stream_contract(
    stream, prompts: Sequence[tuple[int, ...]], max_new: int, timeout_s: float = 120.0
) -> None:  # fmt: skip
    """Run the contract (module docstring) on ``stream``, started, sampling at most ``max_new`` tokens a row."""
    steps_before, loads_before, busy_before = stream.steps, stream.weight_loads, stream.busy_seconds
    limits = [None, 1, max(1, max_new // 2)]
    requests = [GenerationRequest(prompt, 2, 100 + i, max_new_tokens=limits[i % 3]) for i, prompt in enumerate(prompts)]
    answers = [Calls() for _ in requests]
    handles = [stream.submit(request, answer) for request, answer in zip(requests, answers, strict=True)]
    seen = {handle: stream.progress().get(handle) for handle in handles}  # a prefix of the answer, when present
    for request, answer, handle in zip(requests, answers, handles, strict=True):
        (completions,) = answer.wait(timeout_s)
        assert not isinstance(completions, BaseException), completions
        limit = request.max_new_tokens or max_new
        assert len(completions) == request.num_samples
        assert all(1 <= len(c.token_ids) <= limit and len(c.logprobs) == len(c.token_ids) for c in completions)
        for row, completion in zip(seen[handle] or (), completions, strict=False):
            assert row is None or completion.token_ids[: len(row.token_ids)] == row.token_ids
        tokens, _ = stream.cost(handle)
        assert tokens == sum(len(c.token_ids) for c in completions)
    time.sleep(0.2)
    assert all(len(answer.calls) == 1 for answer in answers), "each request is answered exactly once"
    # A cancel of an answered request reports its cost at once, once; after forget nothing of it is kept.
    dropped, cost = Calls(), stream.cost(handles[0])
    stream.cancel(handles[0], dropped)
    assert dropped.wait(timeout_s) == cost and len(dropped.calls) == 1
    for handle in handles:
        stream.forget(handle)
        assert handle not in stream.progress()
    # A cancel of a running request: its cost once, and at most one answer (it may finish at that very boundary).
    running, running_dropped = Calls(), Calls()
    handle = stream.submit(GenerationRequest(prompts[0], 2, 7), running)
    stream.cancel(handle, running_dropped)
    tokens, seconds = running_dropped.wait(timeout_s)
    assert tokens >= 0 and seconds >= 0.0
    # A weight post: its load runs, then done, once each.
    loads, done = Calls(), Calls()
    stream.post_weights(loads, done)
    assert done.wait(timeout_s) == (None,)
    time.sleep(0.2)
    assert len(loads.calls) == 1 and len(done.calls) == 1 and len(running_dropped.calls) == 1
    assert len(running.calls) <= 1
    stream.forget(handle)
    assert stream.steps > steps_before and stream.weight_loads == loads_before + 1
    assert stream.busy_seconds > busy_before
