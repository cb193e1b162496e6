"""The KV-cache engine.

- shape of the answer: one list per request, in order, ``num_samples`` completions each, stamped
  with the weight version; the engine satisfies the ``Generator`` protocol;
- finish reasons: EOS (kept as the last token, dropped from text), stop string (kept in tokens and
  text, text == decode(tokens)), length (exactly ``max_new_tokens`` tokens); EOS never mid-completion;
- recorded logprobs equal ``completion_logprobs`` recomputed on the same weights (≤ 1e-4, float32
  CPU), including rows that finished early and were compacted out of the batch mid-loop, and under
  top-k/top-p (the recorded value is the unfiltered tempered logprob) and greedy (T=1);
- determinism: same call twice is identical; a request gives the same tokens alone, batched with
  longer/shorter prompts, split across chunks, or with more samples requested (sample i stays i);
- floats: where the batch shapes differ (a request alone vs batched, chunked, with more samples), tokens,
  text and finish reasons are compared exactly and logprobs within 1e-5, since kernels may round the
  last bits differently per shape and CPU; logprobs are compared exactly only between identical
  computations (the same call twice; one request alone in two engines that differ only in their EOS ids);
- the sampling distribution: top_k=1 equals greedy; the empirical first-token distribution
  matches softmax(logits/T) (and is more peaked at low T); top-k/top-p never draw outside their
  set and match the renormalised filtered distribution;
- ``load_weights`` changes outputs and the version, refuses a lower version or a mismatched state;
- the eager-attention path (4D masks) agrees with sdpa.
"""

from __future__ import annotations

import collections

import pytest
import torch

from groupwise.generation import Engine, Generator
from groupwise.model import completion_logprobs, load_policy
from groupwise.types import Completion, GenerationRequest, SamplingParams

pytestmark = pytest.mark.numerics

TINY = {"vocab": "full", "num_layers": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}
EOS = 2


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny", tiny=TINY, seed=0, device="cpu")


@pytest.fixture(scope="module")
def engine(policy) -> Engine:
    return Engine(policy.model, policy.tokenizer, eos_token_ids=(EOS,))


@pytest.fixture(scope="module")
def peaked():
    """A policy whose next-token distributions are far from uniform (random init is nearly flat)."""
    policy = load_policy("tiny", tiny=TINY, seed=4, device="cpu")
    with torch.no_grad():
        policy.model.model.norm.weight.fill_(12.0)
    return policy


def _ids(policy, text: str) -> tuple[int, ...]:
    return tuple(policy.tokenizer(text)["input_ids"])


def _first_token_probs(policy, prompt: tuple[int, ...], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = policy.model(torch.tensor([prompt])).logits[0, -1].double()
    return torch.softmax(logits / temperature, dim=-1)


def _first_token_counts(engine: Engine, prompt: tuple[int, ...], sampling: SamplingParams, n: int) -> torch.Tensor:
    (completions,) = engine.generate([GenerationRequest(prompt, n, seed=99)], sampling)
    counts = torch.zeros(len(engine.tokenizer), dtype=torch.float64)
    for token, count in collections.Counter(c.token_ids[0] for c in completions).items():
        counts[token] = count
    return counts / n


def _assert_frequencies_match(observed: torch.Tensor, expected: torch.Tensor, n: int) -> None:
    """Each token's frequency within 5 binomial standard deviations (+1e-3) of its probability."""
    tolerance = 5 * (expected * (1 - expected) / n).sqrt() + 1e-3
    worst = ((observed - expected).abs() - tolerance).max().item()
    assert worst <= 0, f"a token frequency is {worst:.4f} outside its 5-sigma band"


def _assert_logprobs_match(policy, prompts: list[tuple[int, ...]], completions: list[Completion], temperature: float):
    recomputed, _, mask = completion_logprobs(policy.model, prompts, [c.token_ids for c in completions], temperature)
    for row, completion in enumerate(completions):
        n = completion.num_tokens
        assert mask[row].sum().item() == n
        recorded = torch.tensor(completion.logprobs)
        assert (recomputed[row, :n] - recorded).abs().max().item() <= 1e-4


def test_answer_has_one_list_per_request_in_order_with_version(policy, engine) -> None:
    assert isinstance(engine, Generator)
    requests = [
        GenerationRequest(_ids(policy, "1+1="), 3, seed=1),
        GenerationRequest(_ids(policy, "a much longer prompt 12+30="), 1, seed=2),
        GenerationRequest(_ids(policy, "5="), 0, seed=3),
        GenerationRequest(_ids(policy, "7*8="), 2, seed=4),
    ]
    out = engine.generate(requests, SamplingParams(max_new_tokens=6))
    assert [len(per_request) for per_request in out] == [3, 1, 0, 2]
    alone = engine.generate([requests[3]], SamplingParams(max_new_tokens=6))
    # The batch shapes differ (4 ragged requests vs one), so kernels may round the last bits differently:
    # tokens, text and finish reasons agree exactly, logprobs within a float32 tolerance.
    for batched, single in zip(out[3], alone[0], strict=True):
        assert (batched.token_ids, batched.text, batched.finish_reason) == (
            single.token_ids, single.text, single.finish_reason
        ), "request order in the answer must follow the request list"
        assert batched.logprobs == pytest.approx(single.logprobs, abs=1e-5)
    assert all(c.weight_version == 0 and len(c.logprobs) == c.num_tokens for per in out for c in per)


def test_finish_reasons_and_eos_placement_on_a_sampled_batch(policy, engine) -> None:
    requests = [GenerationRequest(_ids(policy, f"{i}+{i}="), 8, seed=i) for i in range(8)]
    out = engine.generate(requests, SamplingParams(max_new_tokens=40))
    completions = [c for per in out for c in per]
    reasons = collections.Counter(c.finish_reason for c in completions)
    assert reasons["stop"] >= 5 and reasons["length"] >= 5, reasons
    for c in completions:
        assert EOS not in c.token_ids[:-1]
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == EOS
            assert c.text == policy.tokenizer.decode(c.token_ids[:-1], skip_special_tokens=False)
        else:
            assert c.num_tokens == 40
            assert c.text == policy.tokenizer.decode(c.token_ids, skip_special_tokens=False)
    prompts = [r.prompt_token_ids for r in requests for _ in range(r.num_samples)]
    _assert_logprobs_match(policy, prompts, completions, 1.0)


def test_an_extra_eos_id_stops_at_its_first_occurrence(policy, engine) -> None:
    request = GenerationRequest(_ids(policy, "3+4="), 1, seed=0)
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
    (long,) = engine.generate([request], greedy)[0]
    stopper = list(dict.fromkeys(long.token_ids))[-1]  # the latest token to appear for the first time
    position = long.token_ids.index(stopper)
    other = Engine(policy.model, policy.tokenizer, eos_token_ids=(EOS, stopper))
    (short,) = other.generate([request], greedy)[0]
    assert short.finish_reason == "stop"
    # The same request alone on the same weights: every step up to the stop is the same computation.
    assert short.token_ids == long.token_ids[: position + 1]
    assert short.logprobs == long.logprobs[: position + 1]
    assert short.text == policy.tokenizer.decode(long.token_ids[:position], skip_special_tokens=False)


def test_stop_string_is_kept_in_tokens_and_text(policy, engine) -> None:
    request = GenerationRequest(_ids(policy, "9-2="), 1, seed=0)
    (long,) = engine.generate([request], SamplingParams(max_new_tokens=20, temperature=0.0))[0]
    stop = long.text[6:8]
    (short,) = engine.generate([request], SamplingParams(max_new_tokens=20, temperature=0.0, stop=(stop,)))[0]
    assert short.finish_reason == "stop"
    assert stop in short.text and stop not in policy.tokenizer.decode(short.token_ids[:-1])
    assert short.text == policy.tokenizer.decode(short.token_ids, skip_special_tokens=False)
    assert short.token_ids == long.token_ids[: short.num_tokens]


@pytest.mark.parametrize(
    "sampling", [SamplingParams(max_new_tokens=12, temperature=0.0), SamplingParams(max_new_tokens=12)]
)
def test_ragged_batches_and_chunking_do_not_change_a_request(policy, sampling) -> None:
    engine = Engine(policy.model, policy.tokenizer, eos_token_ids=(EOS,))
    target = GenerationRequest(_ids(policy, "12+3="), 4, seed=42)
    longer = GenerationRequest(_ids(policy, "a prompt that is much longer than the target one: 9*9="), 3, seed=7)
    shorter = GenerationRequest(_ids(policy, "1"), 2, seed=8)
    alone = engine.generate([target], sampling)[0]
    mixed = engine.generate([longer, target, shorter], sampling)[1]
    small_chunks = Engine(policy.model, policy.tokenizer, (EOS,), max_batch_rows=3)
    chunked = small_chunks.generate([shorter, target, longer], sampling)[1]
    more_samples = engine.generate([GenerationRequest(target.prompt_token_ids, 6, seed=42)], sampling)[0][:4]
    for other in (mixed, chunked, more_samples):
        assert [c.token_ids for c in other] == [c.token_ids for c in alone]
        for a, b in zip(alone, other, strict=True):
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) <= 1e-5
    assert engine.generate([target], sampling)[0] == alone, "the same call twice must give identical completions"


def test_seed_and_sample_index_change_sampled_completions(policy, engine) -> None:
    prompt = _ids(policy, "4+4=")
    sampling = SamplingParams(max_new_tokens=10)
    first = engine.generate([GenerationRequest(prompt, 4, seed=1)], sampling)[0]
    second = engine.generate([GenerationRequest(prompt, 4, seed=2)], sampling)[0]
    assert len({c.token_ids for c in first}) == 4
    assert [c.token_ids for c in first] != [c.token_ids for c in second]


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_new_tokens=10, temperature=0.7, top_k=5, top_p=0.9),
        SamplingParams(max_new_tokens=10, temperature=0.0),
    ],
)
def test_recorded_logprobs_are_the_unfiltered_tempered_ones(policy, engine, sampling) -> None:
    texts = ["1+2=", "long prompt 33+44="]
    requests = [GenerationRequest(_ids(policy, text), 3, seed=i) for i, text in enumerate(texts)]
    out = engine.generate(requests, sampling)
    prompts = [r.prompt_token_ids for r in requests for _ in range(r.num_samples)]
    _assert_logprobs_match(policy, prompts, [c for per in out for c in per], sampling.temperature)


def test_top_k_one_is_greedy(peaked) -> None:
    engine = Engine(peaked.model, peaked.tokenizer, (EOS,))
    request = GenerationRequest(_ids(peaked, "2*3="), 16, seed=3)
    greedy = engine.generate([request], SamplingParams(max_new_tokens=8, temperature=0.0))[0][0]
    sampled = engine.generate([request], SamplingParams(max_new_tokens=8, temperature=1.5, top_k=1))[0]
    assert all(c.token_ids == greedy.token_ids for c in sampled)


def test_empirical_distribution_follows_temperature(peaked) -> None:
    engine = Engine(peaked.model, peaked.tokenizer, (EOS,), max_batch_rows=4000)
    prompt = _ids(peaked, "2*3=")
    hot = _first_token_counts(engine, prompt, SamplingParams(max_new_tokens=1, temperature=1.0), 4000)
    cold = _first_token_counts(engine, prompt, SamplingParams(max_new_tokens=1, temperature=0.4), 4000)
    exact_hot, exact_cold = _first_token_probs(peaked, prompt, 1.0), _first_token_probs(peaked, prompt, 0.4)
    assert exact_hot.max() < 0.8 and (exact_hot > 0.05).sum() >= 2, "the fixture must leave several likely tokens"
    _assert_frequencies_match(hot, exact_hot, 4000)
    _assert_frequencies_match(cold, exact_cold, 4000)
    assert cold.max() > hot.max() + 0.1


def test_top_k_and_top_p_never_draw_outside_their_set(peaked) -> None:
    engine = Engine(peaked.model, peaked.tokenizer, (EOS,), max_batch_rows=4000)
    prompt = _ids(peaked, "7+1=")
    probs = _first_token_probs(peaked, prompt, 1.0)
    order = torch.argsort(probs, descending=True)
    top3 = set(order[:3].tolist())
    counts = _first_token_counts(engine, prompt, SamplingParams(max_new_tokens=1, top_k=3), 4000)
    assert set(counts.nonzero().flatten().tolist()) == top3
    expected = torch.zeros_like(probs)
    expected[order[:3]] = probs[order[:3]] / probs[order[:3]].sum()
    _assert_frequencies_match(counts, expected, 4000)
    mass_before = torch.cumsum(probs[order], 0) - probs[order]
    nucleus = order[mass_before < 0.6]
    assert 1 < len(nucleus) < len(probs) - 1, "the fixture must make top_p=0.6 drop some tokens and keep several"
    counts = _first_token_counts(engine, prompt, SamplingParams(max_new_tokens=1, top_p=0.6), 4000)
    assert set(counts.nonzero().flatten().tolist()) <= set(nucleus.tolist())
    expected = torch.zeros_like(probs)
    expected[nucleus] = probs[nucleus] / probs[nucleus].sum()
    _assert_frequencies_match(counts, expected, 4000)


def test_load_weights_changes_outputs_and_version() -> None:
    first = load_policy("tiny", tiny=TINY, seed=0, device="cpu")
    second = load_policy("tiny", tiny=TINY, seed=1, device="cpu")
    engine = Engine(first.model, first.tokenizer, (EOS,))
    reference = Engine(second.model, second.tokenizer, (EOS,))
    request = [GenerationRequest(_ids(first, "5+5="), 2, seed=0)]
    sampling = SamplingParams(max_new_tokens=8)
    before = engine.generate(request, sampling)
    engine.load_weights(second.model.state_dict(), version=3)
    after = engine.generate(request, sampling)
    assert engine.version == 3 and all(c.weight_version == 3 for c in after[0])
    assert [c.token_ids for c in after[0]] != [c.token_ids for c in before[0]]
    assert [c.token_ids for c in after[0]] == [c.token_ids for c in reference.generate(request, sampling)[0]]
    with pytest.raises(ValueError, match="move the engine back from version 3"):
        engine.load_weights(second.model.state_dict(), version=2)
    partial = {k: v for k, v in second.model.state_dict().items() if "layers.1." not in k}
    with pytest.raises(ValueError, match="does not match the engine's model"):
        engine.load_weights(partial, version=4)


def test_generation_restores_train_mode_and_rejects_bad_requests(policy) -> None:
    engine = Engine(policy.model, policy.tokenizer, (EOS,))
    policy.model.train()
    try:
        engine.generate([GenerationRequest(_ids(policy, "1"), 1, seed=0)], SamplingParams(max_new_tokens=2))
        assert policy.model.training
    finally:
        policy.model.eval()
    with pytest.raises(ValueError, match="request 1 has an empty prompt"):
        engine.generate([GenerationRequest((1,), 1, 0), GenerationRequest((), 1, 0)], SamplingParams())
    with pytest.raises(ValueError, match="top_p=1.5"):
        engine.generate([GenerationRequest((1,), 1, 0)], SamplingParams(top_p=1.5))
    with pytest.raises(ValueError, match="eos_token_ids is empty"):
        Engine(policy.model, policy.tokenizer, ())


def test_eager_attention_path_agrees_with_sdpa(policy, engine) -> None:
    eager = load_policy("tiny", tiny=TINY, seed=0, device="cpu")
    eager.model.set_attn_implementation("eager")
    assert eager.model.config._attn_implementation == "eager"
    requests = [GenerationRequest(_ids(policy, text), 2, seed=3) for text in ("1+2=", "a longer prompt: 8*7=")]
    sampling = SamplingParams(max_new_tokens=10, temperature=0.0)
    expected = engine.generate(requests, sampling)
    got = Engine(eager.model, eager.tokenizer, (EOS,)).generate(requests, sampling)
    assert [[c.token_ids for c in per] for per in got] == [[c.token_ids for c in per] for per in expected]
    prompts = [r.prompt_token_ids for r in requests for _ in range(r.num_samples)]
    _assert_logprobs_match(eager, prompts, [c for per in got for c in per], 0.0)
