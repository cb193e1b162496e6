"""The vLLM generator built with ``logprobs="full_vocab"`` (raw logits of the whole vocabulary, tempered here), on
the shipped tiny model, on CPU.

Invariants pinned:
- under top-k (T = 0.8) the recorded logprobs are the unfiltered tempered ones: equal within 1e-5 to
  ``completion_logprobs`` recomputed by the policy on the same tokens (vLLM's own processed logprobs would be
  renormalised over the k kept tokens);
- every sampled token is among the k most likely under the policy at its position;
- building the engine leaves the global torch generator as it was (vLLM's worker seeds it).

Its engine is built and closed in this module: vLLM allows one in-process engine at a time.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from vllm_tier import vllm_marks

from groupwise.model import completion_logprobs
from groupwise.types import GenerationRequest, SamplingParams

pytestmark = vllm_marks()
TOL = 1e-5


def test_full_vocab_engine_records_unfiltered_logprobs_under_top_k(settings, policy, eos, weight_names, prompt_ids):
    from groupwise.generation.vllm.engine import VllmGenerator

    rng = torch.random.get_rng_state()
    generator = VllmGenerator(replace(settings, logprobs="full_vocab"), policy.tokenizer, eos, weight_names)
    assert torch.equal(torch.random.get_rng_state(), rng)  # vLLM's worker seeded it; building restores it
    try:
        sampling = SamplingParams(max_new_tokens=6, temperature=0.8, top_k=3)
        requests = [GenerationRequest(prompt, 4, seed=5 + index) for index, prompt in enumerate(prompt_ids)]
        out = generator.generate(requests, sampling)
    finally:
        generator.shutdown()
    for prompt, per_request in zip(prompt_ids, out, strict=True):
        for completion in per_request:
            with torch.no_grad():
                expected, _, _ = completion_logprobs(policy.model, [prompt], [completion.token_ids], 0.8)
                sequence = torch.tensor([list(prompt) + list(completion.token_ids)])
                logits = policy.model(sequence).logits[0, len(prompt) - 1 : -1]
            gaps = [abs(a - b) for a, b in zip(completion.logprobs, expected[0].tolist(), strict=False)]
            assert max(gaps) < TOL
            top3 = logits.topk(3, dim=-1).indices
            assert all(token in top3[i].tolist() for i, token in enumerate(completion.token_ids))
