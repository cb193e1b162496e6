"""Prefix reuse in the generation stream (``groupwise.generation.stream_prefixes``, its store and its prefill).

Invariants pinned (float32 on CPU; tokens and finish reasons compared exactly, logprobs within 1e-5):

- multi-turn requests (each turn's prompt = the previous prompt + its sampled tokens + an answer) sample on a stream
  with reuse exactly what they sample on a stream without it, across EOS, stop strings, the token limit, several
  samples per request and slots that grow; and the reuse happened: every turn after the first prefills only the
  last sampled token and the answer (``reused_tokens`` / ``prefilled_tokens`` counted exactly);
- a weight load (``post_weights``, or weights changed in place on the engine) empties the store: the next turn
  reuses nothing and samples what a fresh stream samples under the new weights; with ``kv="keep"`` a row that
  lived across the load is never stored;
- the store holds at most its cap of token positions, evicts an entry a request reused whole first, then the least
  recently used, and drops an entry that a newer one extends; ``prefix_tokens=0`` reuses nothing; a cancelled
  request's row is not stored;
- a closed stream lets go of what it kept (its serving thread empties the store on its way out);
- ``common_prefix`` is the longest common prefix; a reused prefix always leaves one token to prefill.
"""

from __future__ import annotations

import threading

import pytest
import torch
from fakes.decoder_models import assert_same_completions, char_tokenizer, peaked_model

from groupwise.generation import Engine
from groupwise.generation.prefix_prefill import prefill_inputs
from groupwise.generation.prefix_store import PrefixStore, common_prefix
from groupwise.types import GenerationRequest, SamplingParams

EOS = 2
STOPS = (EOS, *range(10, 30))
SAMPLING = SamplingParams(max_new_tokens=14, temperature=1.0, top_p=0.9, stop=("a",))
TEXTS = ["1+2=", "a much longer prompt: 81*7=", "9", "hello there"]


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


def _turns(stream, tokenizer, turns: int = 4, samples: int = 2, first: list[GenerationRequest] | None = None):
    """Run ``turns`` rounds: each completion's next turn is its prompt + its tokens + an answer; returns every
    round's completions and, per round, the stream's (reused, prefilled) token counts after it and its distinct
    prompts."""
    requests = first or [GenerationRequest(tuple(tokenizer(t)["input_ids"]), samples, seed=i)
                         for i, t in enumerate(TEXTS)]  # fmt: skip
    rounds, counts, prompts = [], [], []
    for turn in range(turns):
        prompts.append({request.prompt_token_ids for request in requests})
        results: dict[int, object] = {}
        for i, request in enumerate(requests):
            stream.submit(request, lambda outcome, i=i, results=results: results.__setitem__(i, outcome))
        stream.run_until_idle()
        got = [results[i] for i in range(len(requests))]
        rounds.append(got)
        counts.append((stream.prefixes.reused_tokens, stream.prefixes.prefilled_tokens))
        answer = tuple(tokenizer(f" ok{turn}:")["input_ids"])
        requests = [GenerationRequest(request.prompt_token_ids + c.token_ids + answer, 1, seed=100 * turn + i)
                    for i, (request, per) in enumerate(zip(requests, got, strict=True)) for c in per]  # fmt: skip
    return rounds, counts, prompts


@pytest.mark.numerics
def test_multi_turn_requests_sample_the_same_with_reuse_and_prefill_only_the_new_tokens(tokenizer) -> None:
    model = peaked_model(len(tokenizer), seed=0)
    reusing = Engine(model, tokenizer, STOPS).open_stream(SAMPLING, max_rows=6)
    plain = Engine(model, tokenizer, STOPS).open_stream(SAMPLING, max_rows=6, prefix_tokens=0)
    got, counts, prompts = _turns(reusing, tokenizer)
    expected, plain_counts, _ = _turns(plain, tokenizer)
    for got_round, expected_round in zip(got, expected, strict=True):
        assert_same_completions(got_round, expected_round)
    completions = [c for round_ in got for per in round_ for c in per]
    assert {c.finish_reason for c in completions} == {"stop", "length"}
    assert plain.prefixes.reused_tokens == 0
    assert sum(counts[0]) == plain_counts[0][1]  # every prompt token is either reused or prefilled
    answer = len(tokenizer(" ok0:")["input_ids"])
    # Turn 2: each distinct prompt (samples that drew the same tokens share one prefill) reuses all of its previous
    # turn's prompt + tokens but the last, and prefills that last token and the answer.
    assert counts[1][0] - counts[0][0] == sum(len(prompt) - answer - 1 for prompt in prompts[1])
    assert counts[1][1] - counts[0][1] == len(prompts[1]) * (1 + answer)
    assert counts[-1][0] > 2 * (counts[-1][1] - counts[0][1]), "most of the later turns' prompts were reused"


def _first(tokenizer) -> list[tuple[int, ...]]:
    return [tuple(tokenizer(t)["input_ids"]) for t in TEXTS]


@pytest.mark.numerics
def test_a_weight_load_empties_the_store_and_the_next_turn_runs_under_the_new_weights(tokenizer) -> None:
    old, new = peaked_model(len(tokenizer), seed=0), peaked_model(len(tokenizer), seed=4)
    engine = Engine(peaked_model(len(tokenizer), seed=0), tokenizer, STOPS)
    stream = engine.open_stream(SAMPLING, max_rows=16, partial="continue")  # each turn: one admission
    first, _, _ = _turns(stream, tokenizer, turns=1)
    assert len(stream.prefixes.store) > 0
    answered: list[object] = []
    stream.post_weights(lambda: engine.load_weights(new.state_dict(), 1), answered.append)
    stream.run_until_idle()
    assert answered == [None] and len(stream.prefixes.store) == 0
    follow_up = _next_turn(tokenizer, first[0])
    reused_before = stream.prefixes.reused_tokens
    got, _, _ = _turns(stream, tokenizer, turns=1, first=follow_up)
    assert stream.prefixes.reused_tokens == reused_before, "nothing from the old weights was reused"
    fresh = Engine(new, tokenizer, STOPS).open_stream(SAMPLING, max_rows=6, prefix_tokens=0)
    expected, _, _ = _turns(fresh, tokenizer, turns=1, first=follow_up)
    assert_same_completions(got[0], expected[0])
    old_stream = Engine(old, tokenizer, STOPS).open_stream(SAMPLING, max_rows=6, prefix_tokens=0)
    under_old, _, _ = _turns(old_stream, tokenizer, turns=1, first=follow_up)
    assert [c.token_ids for per in got[0] for c in per] != [c.token_ids for per in under_old[0] for c in per]


def _next_turn(tokenizer, completions) -> list[GenerationRequest]:
    answer = tuple(tokenizer(" ok0:")["input_ids"])
    pairs = zip(_first(tokenizer), completions, strict=True)
    return [GenerationRequest(prompt + c.token_ids + answer, 1, seed=i) for i, (prompt, per) in enumerate(pairs)
            for c in per]  # fmt: skip


def test_weights_changed_in_place_on_the_engine_are_seen(tokenizer) -> None:
    new = peaked_model(len(tokenizer), seed=4)
    engine = Engine(peaked_model(len(tokenizer), seed=0), tokenizer, STOPS)
    stream = engine.open_stream(SAMPLING, max_rows=16)  # each turn: one admission
    first, _, _ = _turns(stream, tokenizer, turns=1)
    with stream.paused():  # as evaluation's generator loads weights: straight into the engine, the stream parked
        engine.load_weights(new.state_dict(), 0)  # same version number: only the parameters tell
    reused_before = stream.prefixes.reused_tokens
    _turns(stream, tokenizer, turns=1, first=_next_turn(tokenizer, first[0]))
    assert stream.prefixes.reused_tokens == reused_before


def test_keep_across_a_load_stores_no_row_that_spans_it(tokenizer) -> None:
    engine = Engine(peaked_model(len(tokenizer), seed=0), tokenizer, STOPS)
    stream = engine.open_stream(SAMPLING, max_rows=16, partial="continue", kv="keep")
    requests = [GenerationRequest(tuple(tokenizer(t)["input_ids"]), 2, seed=i) for i, t in enumerate(TEXTS)]
    results: dict[int, object] = {}
    for i, request in enumerate(requests):
        stream.submit(request, lambda outcome, i=i: results.__setitem__(i, outcome))
    stream.run_until_idle(max_ticks=2)
    stream.post_weights(lambda: engine.load_weights(peaked_model(len(tokenizer), seed=4).state_dict(), 1), print)
    stream.run_until_idle()
    spanning = [c for per in results.values() for c in per if set(c.token_versions) == {0, 1}]
    assert spanning, "some rows live across the load"
    assert len(stream.prefixes.store) == 0, "each row that finished after the load holds keys/values of both"


def test_the_store_is_bounded_least_recently_used_first_and_drops_what_a_newer_entry_extends() -> None:
    store = PrefixStore(max_tokens=10)
    store.match_weights("w")

    def kv(tokens):
        return torch.arange(len(tokens), dtype=torch.float32).view(1, 1, 1, len(tokens), 1).expand(2, 2, 1, -1, 1)

    store.put((1, 2, 3), kv((1, 2, 3)))
    store.put((5, 6, 7), kv((5, 6, 7)))
    assert store.longest((1, 2, 9, 9), limit=10).shape[-2] == 2  # a common prefix is enough; (1, 2, 3) now recent
    store.put((8, 9, 10, 11), kv((8, 9, 10, 11)))  # 10 positions: at the cap
    assert store.tokens == 10 and len(store) == 3
    store.put((1, 2, 3, 4), kv((1, 2, 3, 4)))  # extends (1, 2, 3), which goes; then (5, 6, 7) is the oldest
    assert store.tokens == 8 and store.longest((5, 6, 7, 0), limit=10) is None
    assert store.longest((1, 2, 3, 4, 5), limit=3).shape[-2] == 3  # at most the limit
    store.put(tuple(range(100, 111)), kv(range(11)))  # longer than the cap: not kept
    assert store.tokens == 8
    store.match_weights("w2")
    assert store.tokens == 0 and store.longest((1, 2, 3, 4, 5), limit=10) is None
    store.put((1, 2), kv((1, 2)))
    store.match_weights(None)  # weights whose changes cannot be seen: nothing kept
    assert len(store) == 0


def test_an_entry_reused_whole_goes_first() -> None:
    store = PrefixStore(max_tokens=9)
    store.match_weights("w")
    kv = torch.zeros((1, 2, 1, 3, 1))
    store.put((1, 2, 3), kv)
    store.put((5, 6, 7), kv)
    assert store.longest((1, 2, 3, 4), limit=10).shape[-2] == 3  # all of (1, 2, 3): its row stores a longer one
    store.put((8, 9, 10), kv)
    store.put((11, 12, 13), kv)  # over the cap: (1, 2, 3) goes, though (5, 6, 7) was used less recently
    assert store.longest((1, 2, 3, 4), limit=10) is None and store.longest((5, 6, 7, 0), limit=10) is not None


def test_a_stream_stays_under_its_cap_and_zero_turns_reuse_off(tokenizer) -> None:
    model = peaked_model(len(tokenizer), seed=0)
    capped = Engine(model, tokenizer, STOPS).open_stream(SAMPLING, max_rows=6, prefix_tokens=40)
    _, counts, _ = _turns(capped, tokenizer, turns=3)
    assert 0 < capped.prefixes.store.tokens <= 40 and counts[-1][0] > 0
    with pytest.raises(ValueError, match="prefix_tokens=-1 must be >= 0"):
        Engine(model, tokenizer, STOPS).open_stream(SAMPLING, prefix_tokens=-1)


def test_a_cancelled_row_is_not_stored(tokenizer) -> None:
    stream = Engine(peaked_model(len(tokenizer), seed=0), tokenizer, STOPS).open_stream(SAMPLING, max_rows=6)
    request = GenerationRequest(tuple(tokenizer(TEXTS[1])["input_ids"]), 1, seed=0)
    handle = stream.submit(request, print)
    stream.run_until_idle(max_ticks=2)
    stream.cancel(handle)
    stream.run_until_idle()
    assert len(stream.prefixes.store) == 0


def test_a_closed_stream_lets_go_of_what_it_kept(tokenizer) -> None:
    stream = Engine(peaked_model(len(tokenizer), seed=0), tokenizer, STOPS).open_stream(SAMPLING, max_rows=6)
    answered = threading.Event()
    stream.start("test-prefixes")
    stream.submit(GenerationRequest(tuple(tokenizer(TEXTS[1])["input_ids"]), 2, seed=0), lambda _: answered.set())
    assert answered.wait(60)
    with stream.paused():
        assert len(stream.prefixes.store) > 0
    assert stream.close(10)
    assert len(stream.prefixes.store) == 0


def test_common_prefix_and_reuse_leaving_a_token() -> None:
    assert common_prefix((1, 2, 3), (1, 2, 4, 5)) == 2
    assert common_prefix((1, 2, 3), (1, 2, 3, 4)) == 3
    assert common_prefix((7,), (1,)) == 0
    assert common_prefix(tuple(range(50)), tuple(range(37)) + (99,)) == 37
    with pytest.raises(ValueError, match="at least one token"):
        prefill_inputs([(1, 2)], [torch.zeros((1, 2, 1, 2, 4))])
