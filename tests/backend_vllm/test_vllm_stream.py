"""The vLLM stream (``AsyncLLM``, its engine core in a child process) on the shipped tiny model, on CPU.

Invariants pinned:
- the request-stream contract every streaming backend keeps (``tests/stream_contract.py``: each request answered
  once within its own token limit, a cancel's cost once, a weight post's done once, progress until forgotten);
- as a ``Generator``: greedy completions equal the built-in engine's (tokens, text exactly; logprobs within 1e-5);
  sampled logprobs equal the policy's recompute within 1e-5; the same call twice is identical;
- pause (``keep``) / reload / resume: rows running when the weights change finish under the new weights; every
  token's version is the one it was sampled under: old ones, then new ones, the tokens that existed when the load
  was posted all old (old-version tokens' logprobs equal the old weights' recompute within 1e-4; the first
  new-version token's does not); ``weight_version`` is the last token's;
- ``partial="off"``: the load waits for the running rows, which keep one version (and, posted while the stream is
  paused, for the pause to end); later rows get the new one;
- cancellation: ``on_dropped`` gets the tokens generated so far (at least those seen before the cancel) and seconds,
  ``on_done`` is never called, the request leaves ``progress``; cancelling an answered request reports its cost;
- a resumed attempt (prefixes from ``progress``) keeps the prefix's tokens, logprobs and versions and finishes
  within ``max_new_tokens``;
- an answered request stays in ``progress`` (every row finished) with its cost until ``forget``; busy seconds and
  steps grow;
- ``close`` ends the stream: a request still running is answered with an error, and the engine still serves
  ``generate`` (the run's last evaluation); ``shutdown`` ends the engine and the loop thread.

Near-random weights (``noisy_state``) make rows run long, so a weight load lands while they run.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from stream_contract import check_request_stream_contract
from vllm_tier import vllm_marks

from groupwise.generation import Engine
from groupwise.model import completion_logprobs
from groupwise.types import Completion, GenerationRequest, SamplingParams

pytestmark = vllm_marks()
TOL = 1e-5
MAX_NEW = 20


@pytest.fixture(scope="module")
def stream(settings, policy, eos, weight_names):
    from groupwise.generation.vllm.stream import VllmStream

    sampling = SamplingParams(max_new_tokens=MAX_NEW, temperature=1.0)
    stream = VllmStream(settings, policy.tokenizer, eos, weight_names, sampling, partial="continue")
    stream.start("test-vllm-stream")
    yield stream
    stream.shutdown(60)


class Answer:
    """A request's on_done, waited for from the test's thread."""

    def __init__(self) -> None:
        self.event, self.value = threading.Event(), None

    def __call__(self, value) -> None:
        self.value = value
        self.event.set()

    def wait(self, timeout_s: float = 120.0):
        assert self.event.wait(timeout_s), "no answer in time"
        return self.value


def _wait_for(predicate, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.002)


def _tokens_so_far(stream, handle) -> list[int]:
    return [len(row.token_ids) if row is not None else 0 for row in stream.progress().get(handle, ())]


def _recomputed(model, prompt, tokens, temperature: float = 1.0) -> list[float]:
    with torch.no_grad():
        logprobs, _, _ = completion_logprobs(model, [prompt], [tokens], temperature)
    return logprobs[0, : len(tokens)].tolist()


def test_stream_generates_like_the_builtin_engine(stream, policy, eos, prompt_ids):
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    requests = [GenerationRequest(prompt, 1, seed=3) for prompt in prompt_ids]
    ours, theirs = stream.generate(requests, greedy), Engine(policy.model, policy.tokenizer, eos).generate(requests,
                                                                                                        greedy)
    for (a,), (b,) in zip(ours, theirs, strict=True):
        assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < TOL
    sampled = SamplingParams(max_new_tokens=6, temperature=1.0)
    requests = [GenerationRequest(prompt, 4, seed=index) for index, prompt in enumerate(prompt_ids)]
    first = stream.generate(requests, sampled)
    assert stream.generate(requests, sampled) == first
    for prompt, per_request in zip(prompt_ids, first, strict=True):
        for c in per_request:
            assert max(abs(x - y) for x, y in zip(c.logprobs, _recomputed(policy.model, prompt, c.token_ids),
                                                  strict=True)) < TOL  # fmt: skip


def test_the_vllm_stream_keeps_the_request_stream_contract(stream, prompt_ids):
    check_request_stream_contract(stream, prompt_ids[:3], MAX_NEW)


def test_pause_keep_resume_continues_running_rows_under_new_weights(
    stream, policy, prompt_ids, original_state, noisy_state, model_with, versions
):
    noisy_model = model_with(policy, noisy_state)
    spanned = 0
    for attempt in range(5):
        old = next(versions)
        stream.load_weights(noisy_state, old)
        loads = stream.weight_loads
        answer, loaded = Answer(), Answer()
        handle = stream.submit(GenerationRequest(prompt_ids[0], 4, seed=100 + attempt), answer)
        _wait_for(lambda handle=handle: max(_tokens_so_far(stream, handle), default=0) >= 2)
        new = next(versions)
        snapshot = stream.progress()[handle]  # every token of this snapshot was sampled before the load
        stream.post_weights(lambda new=new: stream.load_weights(original_state, new), loaded)
        assert loaded.wait() is None and stream.weight_loads == loads + 1 and stream.version == new
        completions: list[Completion] = answer.wait()
        for completion, prefix in zip(completions, snapshot, strict=True):
            versions_ = list(completion.token_versions)
            first_new = versions_.index(new) if new in versions_ else len(versions_)
            assert versions_ == [old] * first_new + [new] * (len(versions_) - first_new)
            assert first_new >= (0 if prefix is None else len(prefix.token_ids))
            assert completion.weight_version == versions_[-1]
            expected = _recomputed(noisy_model, prompt_ids[0], completion.token_ids)
            assert all(abs(a - b) < 1e-4 for a, b in zip(completion.logprobs[:first_new], expected[:first_new],
                                                         strict=True))  # fmt: skip
            if 0 < first_new < len(versions_):
                spanned += 1
                assert abs(completion.logprobs[first_new] - expected[first_new]) > 1e-2
        if spanned:
            break
    assert spanned, "no row was running across the weight load in 5 attempts"


def test_partial_off_lets_running_rows_finish_first(stream, prompt_ids, original_state, noisy_state, versions):
    old = next(versions)
    stream.load_weights(noisy_state, old)
    stream.partial = "off"
    try:
        answer, loaded = Answer(), Answer()
        handle = stream.submit(GenerationRequest(prompt_ids[2], 2, seed=9), answer)
        _wait_for(lambda: max(_tokens_so_far(stream, handle), default=0) >= 1)
        new = next(versions)
        with stream.paused():  # (evaluation's pause): the drain waits for it to end
            stream.post_weights(lambda: stream.load_weights(original_state, new), loaded)
            assert not loaded.event.wait(0.3) and stream.version == old
        assert loaded.wait() is None
        assert all(set(c.token_versions) == {old} for c in answer.wait())  # the running rows ended first
        (after,) = stream.generate([GenerationRequest(prompt_ids[2], 2, seed=9)], stream.sampling)
        assert all(set(c.token_versions) == {new} for c in after)
    finally:
        stream.partial = "continue"


def test_cancel_reports_the_tokens_so_far(stream, prompt_ids, noisy_state, versions):
    stream.load_weights(noisy_state, next(versions))
    answer, dropped = Answer(), Answer()
    handle = stream.submit(GenerationRequest(prompt_ids[0], 2, seed=21), answer)
    _wait_for(lambda: sum(_tokens_so_far(stream, handle)) >= 3)
    seen = sum(_tokens_so_far(stream, handle))
    stream.cancel(handle, lambda tokens, seconds: dropped((tokens, seconds)))
    tokens, seconds = dropped.wait()
    assert seen <= tokens < 2 * MAX_NEW and seconds > 0
    assert not answer.event.wait(0.5) and handle not in stream.progress() and stream.cost(handle) == (0, 0.0)
    finished, after = Answer(), Answer()
    handle = stream.submit(GenerationRequest(prompt_ids[0], 2, seed=22), finished)
    completions = finished.wait()
    stream.cancel(handle, lambda tokens, seconds: after((tokens, seconds)))
    assert after.wait(1.0)[0] == sum(c.num_tokens for c in completions)


def test_a_resumed_attempt_continues_its_prefix(stream, prompt_ids, noisy_state, versions):
    version = next(versions)
    stream.load_weights(noisy_state, version)
    first, dropped = Answer(), Answer()
    handle = stream.submit(GenerationRequest(prompt_ids[3], 3, seed=31), first)
    _wait_for(lambda: min(_tokens_so_far(stream, handle), default=0) >= 2)
    with stream.paused():
        snapshot = stream.progress()[handle]
        stream.cancel(handle, lambda tokens, seconds: dropped(tokens))
    dropped.wait()
    (resumed,) = stream.generate([GenerationRequest(prompt_ids[3], 3, seed=31, prefixes=snapshot)], stream.sampling)
    for completion, prefix in zip(resumed, snapshot, strict=True):
        assert prefix is not None
        k = len(prefix.token_ids)
        assert completion.token_ids[:k] == prefix.token_ids and completion.logprobs[:k] == prefix.logprobs
        assert completion.token_versions[:k] == prefix.token_versions and completion.num_tokens <= MAX_NEW
        if prefix.finish_reason is None:
            assert completion.num_tokens > k
            assert completion.token_versions[k:] == (version,) * (completion.num_tokens - k)
        else:
            assert (completion.num_tokens, completion.finish_reason) == (k, prefix.finish_reason)


def test_answered_requests_stay_in_progress_until_forgotten(stream, prompt_ids):
    steps, busy = stream.steps, stream.busy_seconds
    answer = Answer()
    handle = stream.submit(GenerationRequest(prompt_ids[1], 3, seed=41), answer)
    completions = answer.wait()
    rows = stream.progress()[handle]
    assert [row.token_ids for row in rows] == [c.token_ids for c in completions]
    assert [row.finish_reason for row in rows] == [c.finish_reason for c in completions]
    tokens, seconds = stream.cost(handle)
    assert tokens == sum(c.num_tokens for c in completions) and seconds > 0
    assert stream.steps > steps and stream.busy_seconds > busy
    stream.forget(handle)
    assert handle not in stream.progress()


def test_close_ends_the_requests_and_shutdown_the_engine(stream, prompt_ids, noisy_state, versions):
    stream.load_weights(noisy_state, next(versions))
    answer = Answer()
    handle = stream.submit(GenerationRequest(prompt_ids[0], 2, seed=51), answer)
    _wait_for(lambda: sum(_tokens_so_far(stream, handle)) >= 1)
    assert stream.close(60)
    assert isinstance(answer.wait(), RuntimeError)  # answered with the reason, never left waiting
    out = stream.generate([GenerationRequest(prompt_ids[1], 2, seed=52)], SamplingParams(max_new_tokens=4))
    assert len(out[0]) == 2 and all(1 <= c.num_tokens <= 4 for c in out[0])  # the engine still generates
    stream.shutdown(60)
    assert not stream._thread.is_alive()
    with pytest.raises(RuntimeError):
        stream.generate([GenerationRequest(prompt_ids[1], 1, seed=53)], SamplingParams(max_new_tokens=2))
