"""Sampling maths.

- ``splitmix64`` on torch int64 equals the textbook unsigned 64-bit algorithm written with Python
  integers (so torch's wrap-around and our logical shifts are right);
- counter uniforms lie in [0, 1), depend only on (seed, sample index, position), differ across
  any one coordinate, and are uniform enough (mean, decile counts);
- top-k/top-p candidate sets equal a brute-force construction, the nucleus always keeps the top
  token, and probabilities are renormalised over the survivors;
- inverse-CDF picks the first index whose cumulative mass exceeds u·total and never a
  zero-probability candidate;
- greedy is argmax; recorded logprobs are the unfiltered tempered log-softmax.
"""

from __future__ import annotations

import pytest
import torch

from groupwise.generation.sampling import (
    check_sampling_params,
    counter_uniforms,
    filtered_candidates,
    inverse_cdf_pick,
    sample_tokens,
    seed_to_int64,
    splitmix64,
    tempered_logprobs_of,
)
from groupwise.types import SamplingParams

pytestmark = pytest.mark.numerics

MASK64 = (1 << 64) - 1


def _reference_splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def test_splitmix64_matches_unsigned_reference() -> None:
    inputs = [0, 1, 2, 12345, (1 << 63) - 1, 1 << 63, MASK64, 0xDEADBEEFCAFEBABE]
    tensor = torch.tensor([seed_to_int64(x) for x in inputs], dtype=torch.long)
    got = [value & MASK64 for value in splitmix64(tensor).tolist()]
    assert got == [_reference_splitmix64(x) for x in inputs]


def test_counter_uniforms_depend_only_on_their_counter() -> None:
    seeds = torch.tensor([7, 7, 8], dtype=torch.long)
    samples = torch.tensor([0, 1, 0], dtype=torch.long)
    at_3 = counter_uniforms(seeds, samples, 3)
    assert len(set(at_3.tolist())) == 3, "changing seed or sample index must change the draw"
    assert not torch.equal(at_3, counter_uniforms(seeds, samples, 4))
    # the same counter in another batch (other rows, other order) gives the same number
    alone = counter_uniforms(torch.tensor([8], dtype=torch.long), torch.tensor([0], dtype=torch.long), 3)
    assert alone.item() == at_3[2].item()
    reversed_batch = counter_uniforms(seeds.flip(0), samples.flip(0), 3)
    assert torch.equal(reversed_batch, at_3.flip(0))


def test_counter_uniforms_are_uniform_on_unit_interval() -> None:
    n = 20_000
    seeds = torch.full((n,), seed_to_int64(2**63 + 5), dtype=torch.long)
    uniforms = counter_uniforms(seeds, torch.arange(n), 0)
    assert uniforms.dtype == torch.float64
    assert uniforms.min().item() >= 0.0 and uniforms.max().item() < 1.0
    assert abs(uniforms.mean().item() - 0.5) < 0.01
    deciles = torch.histc(uniforms.float(), bins=10, min=0.0, max=1.0)
    assert torch.all((deciles - n / 10).abs() < 0.06 * n / 10)  # ~4.5 sigma per bin


def _brute_force_candidates(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> dict[int, float]:
    probs = torch.softmax(logits.double() / temperature, dim=-1).tolist()
    ranked = sorted(range(len(probs)), key=lambda i: (-probs[i], i))
    if top_k > 0:
        ranked = ranked[:top_k]
    mass = sum(probs[i] for i in ranked)
    kept, before = [], 0.0
    for i in ranked:
        if before >= top_p:
            break
        kept.append(i)
        before += probs[i] / mass
    total = sum(probs[i] for i in kept)
    return {i: probs[i] / total for i in kept}


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"), [(1.0, 3, 1.0), (0.5, 0, 0.6), (1.3, 5, 0.8), (1.0, 0, 1.0)]
)
def test_filtered_candidates_match_brute_force(temperature: float, top_k: int, top_p: float) -> None:
    logits = torch.tensor([[2.0, 0.5, 1.5, -1.0, 0.0, 1.0, 3.0, -2.0], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]])
    candidates, probs = filtered_candidates(logits, temperature, top_k, top_p)
    for row in range(2):
        got = {int(c): float(p) for c, p in zip(candidates[row], probs[row], strict=True) if p > 0}
        expected = _brute_force_candidates(logits[row], temperature, top_k, top_p)
        assert got.keys() == expected.keys()
        for token, prob in expected.items():
            assert got[token] == pytest.approx(prob, abs=1e-6)


def test_tiny_top_p_keeps_only_the_most_likely_token() -> None:
    logits = torch.tensor([[0.0, 4.0, 1.0]])
    candidates, probs = filtered_candidates(logits, 1.0, 0, 1e-6)
    assert {int(c) for c, p in zip(candidates[0], probs[0], strict=True) if p > 0} == {1}


def test_inverse_cdf_picks_first_index_exceeding_target_and_skips_zero_mass() -> None:
    probs = torch.tensor([[0.2, 0.0, 0.3, 0.5]], dtype=torch.float64).expand(5, -1)
    uniforms = torch.tensor([0.0, 0.1999, 0.2, 0.4999, 0.5], dtype=torch.float64)
    assert inverse_cdf_pick(probs, uniforms).tolist() == [0, 0, 2, 2, 3]
    unnormalised = torch.tensor([[2.0, 0.0, 3.0, 5.0]], dtype=torch.float64)
    assert inverse_cdf_pick(unnormalised, torch.tensor([0.25], dtype=torch.float64)).tolist() == [2]


def test_greedy_is_argmax_and_logprobs_are_unfiltered_tempered_log_softmax() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 1.0, 3.0]])
    tokens = sample_tokens(logits, torch.zeros(2, dtype=torch.float64), 0.0, 0, 1.0)
    assert tokens.tolist() == [1, 0]
    expected = torch.log_softmax(logits / 0.5, dim=-1).gather(1, tokens.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(tempered_logprobs_of(logits, tokens, 0.5), expected)
    greedy = torch.log_softmax(logits, dim=-1).gather(1, tokens.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(tempered_logprobs_of(logits, tokens, 0.0), greedy)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (SamplingParams(max_new_tokens=0), "max_new_tokens=0"),
        (SamplingParams(temperature=-0.1), "temperature=-0.1"),
        (SamplingParams(top_p=0.0), r"top_p=0.0 must be in \(0, 1\]"),
        (SamplingParams(top_k=-1), "top_k=-1"),
        (SamplingParams(stop=("",)), "empty string"),
    ],
)
def test_bad_sampling_params_are_rejected(params: SamplingParams, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_sampling_params(params)
