"""The vLLM backend's synchronous generator (``vllm.LLM`` in this process) on the shipped tiny model, on CPU.

Invariants pinned:
- it is a ``Generator``: one list per request in order, ``num_samples`` completions each, stamped with the version;
- building it leaves ``torch.set_num_threads`` working (vLLM's CPU worker replaces it); a second in-process engine
  is refused with the reason;
- greedy completions equal the built-in engine's (tokens, text, finish reasons exactly; logprobs within 1e-5);
- recorded logprobs are the unfiltered tempered ones (``log_softmax(logits / T)[token]``, T = 1 for greedy): equal,
  within 1e-5, to ``completion_logprobs`` recomputed by the policy on the same tokens — the quantity the built-in
  engine records — at T = 1 and T = 0.7 (under top-k: ``test_vllm_full_vocab.py``); this (``processed``) engine
  refuses top-k/top-p instead of recording renormalised values;
- finish reasons: ``length`` after exactly ``max_new_tokens``; EOS kept as the last token and dropped from the
  text; a stop string ends the row as on the built-in engine;
- seeds: the same call twice is identical; sample i does not depend on how many samples were asked for or on the
  other requests of the call; different samples draw differently;
- a continued row (``RowPrefix``) keeps its prefix's tokens, logprobs and versions and continues after it; a row
  whose prefix finished comes back as it was;
- ``load_weights`` changes the logprobs to those of the new weights and the version; loading the original weights
  back restores the original completions bit for bit (identical inputs and weights); a lower version and a state
  dict of other names are refused, the engine unchanged.

Tolerance: vLLM's CPU kernels (attention, fused matmuls) round differently from the transformers forward; 1e-5 on
float32 logprobs of a 4-layer model (seen: ~2e-6).
"""

from __future__ import annotations

import pytest
import torch
from vllm_tier import vllm_marks

from groupwise.generation import Engine, Generator
from groupwise.model import completion_logprobs
from groupwise.model.logprobs import logprob_temperature
from groupwise.types import GenerationRequest, RowPrefix, SamplingParams

pytestmark = vllm_marks()
TOL = 1e-5


@pytest.fixture(scope="module")
def generator(settings, policy, eos, weight_names):
    from groupwise.generation.vllm.engine import VllmGenerator

    generator = VllmGenerator(settings, policy.tokenizer, eos, weight_names)
    yield generator
    generator.shutdown()


@pytest.fixture(scope="module")
def builtin(policy, eos) -> Engine:
    return Engine(policy.model, policy.tokenizer, eos_token_ids=eos)


def _requests(prompt_ids, num_samples: int = 1, seed: int = 11) -> list[GenerationRequest]:
    return [GenerationRequest(prompt, num_samples, seed + index) for index, prompt in enumerate(prompt_ids)]


def _recomputed(model, prompt, completion, temperature: float) -> list[float]:
    with torch.no_grad():
        logprobs, _, _ = completion_logprobs(model, [prompt], [completion.token_ids], logprob_temperature(temperature))
    return logprobs[0, : completion.num_tokens].tolist()


def _max_gap(a, b) -> float:
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def test_is_a_generator_with_the_answer_shape(generator, prompt_ids):
    assert isinstance(generator, Generator)
    out = generator.generate(_requests(prompt_ids, num_samples=3), SamplingParams(max_new_tokens=6))
    assert [len(per_request) for per_request in out] == [3] * len(prompt_ids)
    assert all(c.weight_version == generator.version for per_request in out for c in per_request)
    assert all(c.token_versions == (generator.version,) * c.num_tokens for per_request in out for c in per_request)


def test_building_the_engine_leaves_the_process_as_it_was(settings, policy, eos, weight_names, generator):
    from groupwise.generation.vllm.engine import VllmGenerator

    with pytest.raises(RuntimeError, match="already runs in this process"):
        VllmGenerator(settings, policy.tokenizer, eos, weight_names)  # (refused before anything is built)
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)  # vLLM's worker had replaced this by a no-op
    try:
        assert torch.get_num_threads() == threads + 1
    finally:
        torch.set_num_threads(threads)


def test_greedy_matches_the_builtin_engine(generator, builtin, prompt_ids):
    sampling = SamplingParams(max_new_tokens=6, temperature=0.0)
    ours = generator.generate(_requests(prompt_ids), sampling)
    theirs = builtin.generate(_requests(prompt_ids), sampling)
    for (a,), (b,) in zip(ours, theirs, strict=True):
        assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)
        assert _max_gap(a.logprobs, b.logprobs) < TOL


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recorded_logprobs_are_the_tempered_unfiltered_ones(generator, policy, prompt_ids, temperature):
    out = generator.generate(_requests(prompt_ids, num_samples=4), SamplingParams(max_new_tokens=6,
                                                                                   temperature=temperature))
    for prompt, per_request in zip(prompt_ids, out, strict=True):
        for completion in per_request:
            assert _max_gap(completion.logprobs, _recomputed(policy.model, prompt, completion, temperature)) < TOL


def test_top_k_needs_full_vocab_logprobs(generator, prompt_ids):
    with pytest.raises(ValueError, match="full_vocab"):
        generator.generate(_requests(prompt_ids), SamplingParams(max_new_tokens=4, temperature=0.8, top_k=3))


def test_finish_reasons_eos_length_and_stop_strings(generator, builtin, prompt_ids):
    (short,) = generator.generate(_requests(prompt_ids[:1], num_samples=2), SamplingParams(max_new_tokens=1))
    assert all(c.finish_reason == "length" and c.num_tokens == 1 for c in short)
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    ((eos_row,),) = generator.generate(_requests(prompt_ids[:1]), greedy)
    assert eos_row.finish_reason == "stop" and eos_row.token_ids[-1] in generator.eos_token_ids
    assert len(eos_row.text) >= 2
    assert generator.tokenizer.decode(eos_row.token_ids[:-1]) == eos_row.text  # EOS dropped from the text only
    stop_char = eos_row.text[1]  # a character the greedy answer spells (after its first one)
    stopping = SamplingParams(max_new_tokens=6, temperature=0.0, stop=(stop_char,))
    ((ours,),), ((theirs,),) = generator.generate(_requests(prompt_ids[:1]), stopping), builtin.generate(
        _requests(prompt_ids[:1]), stopping
    )
    assert (ours.token_ids, ours.text, ours.finish_reason) == (theirs.token_ids, theirs.text, theirs.finish_reason)
    assert ours.finish_reason == "stop" and ours.text.endswith(stop_char) and ours.num_tokens < eos_row.num_tokens


def test_sampling_depends_only_on_seed_and_sample_index(generator, prompt_ids):
    sampling = SamplingParams(max_new_tokens=6, temperature=1.5)
    first = generator.generate(_requests(prompt_ids, num_samples=8), sampling)
    assert generator.generate(_requests(prompt_ids, num_samples=8), sampling) == first
    fewer = generator.generate(_requests(prompt_ids, num_samples=3), sampling)
    alone = generator.generate(_requests(prompt_ids, num_samples=8)[2:3], sampling)
    for index, per_request in enumerate(fewer):
        assert [c.token_ids for c in per_request] == [c.token_ids for c in first[index][:3]]
    assert [c.token_ids for c in alone[0]] == [c.token_ids for c in first[2]]
    assert _max_gap(alone[0][0].logprobs, first[2][0].logprobs) < TOL
    assert len({c.token_ids for per_request in first for c in per_request}) > len(prompt_ids)  # samples differ


def test_continued_rows_keep_their_prefix(generator, policy, prompt_ids):
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0)
    (whole,) = generator.generate(_requests(prompt_ids[:1], num_samples=2), sampling)
    done, running = whole[0], whole[1]
    prefixes = (
        RowPrefix(done.token_ids, done.logprobs, (0,) * done.num_tokens, done.finish_reason),
        RowPrefix(running.token_ids[:1], running.logprobs[:1], (0,)),
    )
    request = GenerationRequest(prompt_ids[0], 2, seed=11, prefixes=prefixes)
    ((kept, continued),) = generator.generate([request], sampling)
    assert (kept.token_ids, kept.logprobs, kept.finish_reason, kept.text) == (
        done.token_ids, done.logprobs, done.finish_reason, done.text,
    )  # fmt: skip
    assert continued.token_ids[:1] == running.token_ids[:1] and continued.logprobs[:1] == running.logprobs[:1]
    assert continued.token_versions == (0,) + (generator.version,) * (continued.num_tokens - 1)
    assert 1 < continued.num_tokens <= sampling.max_new_tokens
    assert _max_gap(continued.logprobs, _recomputed(policy.model, prompt_ids[0], continued, 1.0)) < TOL


def test_load_weights_changes_logprobs_and_restoring_restores_them(
    generator, policy, prompt_ids, original_state, noisy_state, model_with, versions
):
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0)
    before = generator.generate(_requests(prompt_ids, num_samples=2), sampling)
    noisy_version = next(versions)
    generator.load_weights(noisy_state, noisy_version)
    noisy = generator.generate(_requests(prompt_ids, num_samples=2), sampling)
    assert generator.version == noisy_version and all(c.weight_version == noisy_version for r in noisy for c in r)
    noisy_model = model_with(policy, noisy_state)
    for prompt, per_request, old in zip(prompt_ids, noisy, before, strict=True):
        for completion in per_request:
            assert _max_gap(completion.logprobs, _recomputed(noisy_model, prompt, completion, 1.0)) < TOL
        assert [c.logprobs for c in per_request] != [c.logprobs for c in old]
    generator.load_weights(original_state, next(versions))
    restored = generator.generate(_requests(prompt_ids, num_samples=2), sampling)
    for per_request, old in zip(restored, before, strict=True):
        assert [(c.token_ids, c.logprobs, c.text) for c in per_request] == [(c.token_ids, c.logprobs, c.text)
                                                                             for c in old]  # fmt: skip


def test_load_weights_refuses_a_lower_version_or_other_names(generator, prompt_ids, original_state):
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    before, version = generator.generate(_requests(prompt_ids), greedy), generator.version
    with pytest.raises(ValueError, match="back from version"):
        generator.load_weights(original_state, version - 1)
    renamed = {f"other.{name}": tensor for name, tensor in original_state.items()}
    with pytest.raises(ValueError, match="does not match"):
        generator.load_weights(renamed, version + 1)
    assert generator.version == version and generator.generate(_requests(prompt_ids), greedy) == before
