"""Continuous batching, continuations and partial rollouts in the engine (``groupwise.generation.stream``).

Invariants pinned (float32 on CPU; tokens compared exactly, logprobs within 1e-5 where batch shapes differ):

- continuous batching: a call with more rows than ``max_batch_rows`` runs as one stream in which requests join as
  rows finish (``joins`` > 0); each request gets the tokens, finish reasons and text it gets in a call of its own
  (the counter RNG: a row's draws depend only on seed, sample index and position), across EOS, a stop string and
  ``max_new_tokens``;
- a stream on its own thread takes requests submitted while it runs and hands each back as soon as its own rows
  are done: a one-token request submitted after long ones comes back before them, with its own call's tokens;
- continuations: samples that carry a prefix (cut at different lengths, one already finished, one without any)
  come back as the uninterrupted completions, the prefix's logprobs and versions kept exactly;
- partial rollouts (``continue``): weights loaded at a token boundary — tokens before it keep version 0 and the old
  weights' draws, tokens after it carry version 1; with ``recompute`` they equal a continuation of the progress at
  that boundary under the new weights in a fresh engine, and they differ from the old weights' tokens; with
  ``keep`` and unchanged weights nothing changes but the versions (bit-identical logprobs);
- ``off`` (a drain): a load posted while rows decode waits for them: the running requests keep one version and the
  old weights' tokens, and a request submitted meanwhile is generated wholly under the new weights;
- a cancelled request is never answered and frees its slots; progress at a boundary is a prefix of the final
  completions; a load that raises fails the requests the stream holds with its error, and the stream goes on;
- an engine without the fast step refuses a stream with the reason, and ``continuous_batching`` then runs calls.
"""

from __future__ import annotations

import threading

import pytest
from fakes.decoder_models import assert_same_completions, char_tokenizer, peaked_model, text_requests

from groupwise.generation import Engine
from groupwise.types import GenerationRequest, RowPrefix, SamplingParams

pytestmark = pytest.mark.numerics

EOS = 2
STOPS = (EOS, *range(10, 40))  # many stop tokens: rows finish at many different steps
TEXTS = ["1+2=", "a much longer prompt: 81*7=", "9", "12+30=", "77-5=", "hello"]
SAMPLING = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.9, stop=("a",))


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


def _requests(tokenizer, samples: int = 5) -> list[GenerationRequest]:
    return text_requests(tokenizer, TEXTS, samples)


def _alone(model, tokenizer, requests, sampling=SAMPLING):
    """Each request in a call of its own, on the compacting path: the reference every stream must match."""
    engine = Engine(model, tokenizer, STOPS, cuda_graphs="off")
    return [engine.generate([request], sampling)[0] for request in requests]


def _collect(stream, requests):
    results: dict[int, object] = {}
    handles = [stream.submit(request, lambda outcome, i=i: results.__setitem__(i, outcome))
               for i, request in enumerate(requests)]  # fmt: skip
    return results, handles


def test_continuous_batching_samples_what_each_request_samples_alone(tokenizer) -> None:
    model = peaked_model(len(tokenizer), seed=0)
    requests = _requests(tokenizer)
    engine = Engine(model, tokenizer, STOPS, continuous_batching=True, max_batch_rows=7)
    stream_calls = []
    original = engine._generate_streamed
    engine._generate_streamed = lambda *a: stream_calls.append(1) or original(*a)
    got = engine.generate(requests, SAMPLING)
    assert stream_calls, "the call must run as a stream"
    assert_same_completions(got, _alone(model, tokenizer, requests))
    completions = [c for per in got for c in per]
    assert {c.finish_reason for c in completions} == {"stop", "length"}
    assert any(c.token_ids[-1] in STOPS for c in completions) and any("a" in c.text for c in completions)
    assert all(c.token_versions == (0,) * c.num_tokens for c in completions)


def test_requests_join_a_running_stream_and_come_back_when_their_rows_are_done(tokenizer) -> None:
    model = peaked_model(len(tokenizer), seed=0)
    long_requests = _requests(tokenizer)
    prompt = tuple(tokenizer("7")["input_ids"])
    candidates = [GenerationRequest(prompt, 3, seed) for seed in range(100, 160)]
    short = next(r for r, per in zip(candidates, _alone(model, tokenizer, candidates), strict=True)
                 if max(c.num_tokens for c in per) <= 2)  # fmt: skip
    stream = Engine(model, tokenizer, STOPS).open_stream(SAMPLING, max_rows=40)
    order: list[str] = []
    done = threading.Event()
    results: dict[str, object] = {}

    def answer(name, outcome):
        results[name] = outcome
        order.append(name)
        if len(results) == len(long_requests) + 1:
            done.set()

    stream.start("test-stream")
    try:
        for i, request in enumerate(long_requests):
            stream.submit(request, lambda outcome, i=i: answer(f"long{i}", outcome))
        while stream.steps < 3:  # the stream is decoding the long requests when the short one arrives
            threading.Event().wait(0.001)
        with stream.paused():
            joined_at = stream.steps
            stream.submit(short, lambda outcome: answer("short", outcome))
        assert done.wait(60)
    finally:
        assert stream.close(10)
    assert stream.joins == 1
    expected = _alone(model, tokenizer, [*long_requests, short])
    assert_same_completions([results[f"long{i}"] for i in range(len(long_requests))] + [results["short"]], expected)
    lengths = {name: max(c.num_tokens for c in results[name]) for name in results}
    still_running = {name for name, length in lengths.items() if length > joined_at + 3}
    assert still_running, f"no long row outlasts the short request ({lengths}, joined at step {joined_at})"
    assert still_running <= set(order[order.index("short") + 1 :]), f"the short request waited: order {order}"


def test_a_continuation_returns_the_uninterrupted_completions(tokenizer) -> None:
    model = peaked_model(len(tokenizer), seed=3)
    requests = _requests(tokenizer)
    full = Engine(model, tokenizer, STOPS, cuda_graphs="off").generate(requests, SAMPLING)
    continued = []
    for request, per in zip(requests, full, strict=True):
        prefixes = []
        for sample, c in enumerate(per):
            cut = min(c.num_tokens, 1 + (sample * 3) % 7)
            finish = c.finish_reason if cut == c.num_tokens else None
            cut_prefix = RowPrefix(c.token_ids[:cut], c.logprobs[:cut], (5,) * cut, finish)
            prefixes.append(None if sample == 2 else cut_prefix)
        continued.append(GenerationRequest(request.prompt_token_ids, request.num_samples, request.seed,
                                           tuple(prefixes)))  # fmt: skip
    got = Engine(model, tokenizer, STOPS).generate(continued, SAMPLING)
    assert_same_completions(got, full)
    assert any(p is not None and p.finish_reason for r in continued for p in r.prefixes), "a finished row"
    for request, per_got, per_full in zip(continued, got, full, strict=True):
        for prefix, c, reference in zip(request.prefixes, per_got, per_full, strict=True):
            cut = 0 if prefix is None else len(prefix.token_ids)
            assert c.logprobs[:cut] == reference.logprobs[:cut]  # kept exactly, not recomputed
            assert c.token_versions == (5,) * cut + (0,) * (c.num_tokens - cut)


def _swapped(tokenizer, kv: str, new_state, ticks: int = 4):
    """Generate with the stream's weights replaced by ``new_state`` (version 1) after ``ticks`` token boundaries;
    returns (completions, progress at the swap)."""
    model = peaked_model(len(tokenizer), seed=0)
    engine = Engine(model, tokenizer, STOPS)
    stream = engine.open_stream(SAMPLING, max_rows=40, partial="continue", kv=kv)
    results, handles = _collect(stream, _requests(tokenizer))
    assert stream.run_until_idle(max_ticks=ticks)
    progress = stream.progress()
    finished = set(results)  # answered before the load (the stream reports them until forgotten)
    answered: list[object] = []
    stream.post_weights(lambda: engine.load_weights(new_state, 1), answered.append)
    assert not stream.run_until_idle()
    assert answered == [None]
    at_swap = [None if i in finished else progress.get(h) for i, h in enumerate(handles)]
    return [results[i] for i in range(len(handles))], at_swap


def test_partial_rollouts_recompute_continue_rows_under_the_new_weights(tokenizer) -> None:
    requests = _requests(tokenizer)
    old = peaked_model(len(tokenizer), seed=0)
    new = peaked_model(len(tokenizer), seed=4)
    got, progress = _swapped(tokenizer, "recompute", new.state_dict())
    old_full = _alone(old, tokenizer, requests)
    running = [i for i, rows in enumerate(progress) if rows is not None]  # the others finished before the load
    assert 0 < len(running) < len(requests)
    continued = [GenerationRequest(requests[i].prompt_token_ids, requests[i].num_samples, requests[i].seed,
                                   progress[i]) for i in running]  # fmt: skip
    expected = dict(zip(running, Engine(new, tokenizer, STOPS).generate(continued, SAMPLING), strict=True))
    assert_same_completions(got, [expected.get(i, old_full[i]) for i in range(len(requests))])
    for i, per_request in enumerate(got):
        for c, prefix in zip(per_request, progress[i] or (None,) * len(per_request), strict=True):
            cut = c.num_tokens if i not in running else len(prefix.token_ids) if prefix is not None else 0
            assert c.token_versions == (0,) * cut + (1,) * (c.num_tokens - cut)
    assert any(set(c.token_versions) == {0, 1} for per in got for c in per), "some rows span the weight load"
    assert [[c.token_ids for c in got[i]] for i in running] != [[c.token_ids for c in old_full[i]] for i in running]


def test_partial_rollouts_keep_with_the_same_weights_change_only_the_versions(tokenizer) -> None:
    requests = _requests(tokenizer)
    same = peaked_model(len(tokenizer), seed=0)
    got, _ = _swapped(tokenizer, "keep", same.state_dict())
    stream = Engine(peaked_model(len(tokenizer), seed=0), tokenizer, STOPS).open_stream(SAMPLING, max_rows=40)
    results, handles = _collect(stream, requests)
    stream.run_until_idle()
    uninterrupted = [results[i] for i in range(len(handles))]
    for per_got, per_ref in zip(got, uninterrupted, strict=True):
        for a, b in zip(per_got, per_ref, strict=True):
            assert (a.token_ids, a.logprobs, a.text) == (b.token_ids, b.logprobs, b.text)  # bit-exact: same kernels
    assert any(set(c.token_versions) == {0, 1} for per in got for c in per)


def test_off_drains_the_running_rows_before_loading_weights(tokenizer) -> None:
    requests = _requests(tokenizer)
    old, new = peaked_model(len(tokenizer), seed=0), peaked_model(len(tokenizer), seed=4)
    engine = Engine(peaked_model(len(tokenizer), seed=0), tokenizer, STOPS)
    stream = engine.open_stream(SAMPLING, max_rows=40, partial="off")
    results, handles = _collect(stream, requests)
    stream.run_until_idle(max_ticks=3)
    loaded_at: list[int] = []
    stream.post_weights(lambda: engine.load_weights(new.state_dict(), 1), lambda error: loaded_at.append(stream.steps))
    late = GenerationRequest(tuple(tokenizer("5+5=")["input_ids"]), 4, seed=7)
    late_result: list[object] = []
    stream.submit(late, late_result.append)
    stream.run_until_idle()
    running = [results[i] for i in range(len(handles))]
    assert_same_completions(running, _alone(old, tokenizer, requests))
    assert all(c.token_versions == (0,) * c.num_tokens for per in running for c in per)
    longest = max(c.num_tokens for per in running for c in per)
    assert loaded_at == [longest - 1], "the load waits until the longest running row has drawn its last token"
    assert_same_completions(late_result, _alone(new, tokenizer, [late]))
    assert all(c.token_versions == (1,) * c.num_tokens for c in late_result[0])


def test_cancel_progress_and_a_failing_load(tokenizer) -> None:
    model = peaked_model(len(tokenizer), seed=0)
    requests = _requests(tokenizer)
    stream = Engine(model, tokenizer, STOPS).open_stream(SAMPLING, max_rows=40, partial="continue")
    results, handles = _collect(stream, requests)
    stream.run_until_idle(max_ticks=3)
    stream.cancel(handles[1])
    progress = stream.progress()
    stream.run_until_idle()
    assert 1 not in results
    kept = [i for i in range(len(requests)) if i != 1]
    assert_same_completions([results[i] for i in kept], _alone(model, tokenizer, [requests[i] for i in kept]))
    assert [h for h in progress if h != handles[1]], "some requests were still running at the cut"
    for i in [i for i in kept if handles[i] in progress]:
        for c, prefix in zip(results[i], progress[handles[i]], strict=True):
            assert prefix is not None and c.token_ids[: len(prefix.token_ids)] == prefix.token_ids
    # A load that raises: every request the stream holds gets its error; the stream goes on serving.
    failing, _ = _collect(stream, requests[:2])
    stream.run_until_idle(max_ticks=2)
    answered: list[object] = []
    stream.post_weights(lambda: (_ for _ in ()).throw(RuntimeError("disk on fire")), answered.append)
    stream.run_until_idle()
    assert [type(e) for e in answered] == [RuntimeError]
    assert [str(failing[i]) for i in range(2)] == ["disk on fire"] * 2
    after, _ = _collect(stream, requests[:1])
    stream.run_until_idle()
    assert_same_completions([after[0]], _alone(model, tokenizer, requests[:1]))


def test_without_the_fast_step_a_stream_is_refused_and_calls_run_in_chunks(tokenizer) -> None:
    model = peaked_model(len(tokenizer), seed=0)
    engine = Engine(model, tokenizer, STOPS, fast_decode=False, continuous_batching=True)
    assert "transformers forward" in engine.decode_path or not engine.stream_support().available
    assert "own forward" in engine.stream_support().reason
    with pytest.raises(ValueError, match="cannot run a generation stream: the model decodes with its own forward"):
        engine.open_stream(SAMPLING)
    requests = _requests(tokenizer, samples=2)
    assert_same_completions(engine.generate(requests, SAMPLING), _alone(model, tokenizer, requests))
    continuing = GenerationRequest(requests[0].prompt_token_ids, 1, 0, (RowPrefix((5,), (-1.0,), (0,)),))
    with pytest.raises(ValueError, match="continues earlier rows, which needs a generation stream"):
        engine.generate([continuing], SAMPLING)
