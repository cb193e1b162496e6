"""Bounded-memory logprobs: the chunked LM-head path and the scorer that chooses it.

Invariants pinned:
- ``head_logprobs`` equals ``log_softmax((h Wᵀ + b) / T)`` gathered at the targets, and the entropy of that
  distribution, whatever the chunk size; its gradients (logprob and entropy outputs, into hidden, weight and
  bias) pass ``torch.autograd.gradcheck`` in float64;
- it saves no ``[N, V]`` tensor for the backward pass (``saved_tensors_hooks``), where the plain path does;
- on a real (tiny) model the scorer's chunked path gives the plain path's logprobs, entropies and parameter
  gradients within 1e-5 (ragged rows, temperature, entropy in the loss), scores exactly the completion tokens
  (no padding or prompt position reaches the head) and leaves masked entries 0;
- a model whose logits are not ``lm_head(hidden)`` is scored on the plain path, with the reason: a soft-capping
  config, a non-Linear head, and (caught by the probe) a forward that changes the logits;
- the autocast path (CUDA mixed precision, run here in bfloat16 on the CPU) stays close to float32.
"""

from __future__ import annotations

import pytest
import torch

from groupwise.model import load_policy
from groupwise.model.chunked_logprobs import head_logprobs
from groupwise.model.completion_scorer import CompletionScorer
from groupwise.model.logprobs import completion_logprobs

pytestmark = pytest.mark.numerics

TINY = {"vocab": "full", "num_layers": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}
PROMPTS = [[1, 10, 11, 12], [1, 20], [1, 30, 31, 32, 33, 34, 35], [1, 7, 8]]
COMPLETIONS = [[40, 41, 2], [50, 51, 52, 53, 54, 55, 56, 57], [60], [0, 61, 0, 62, 2]]  # 0 = a sampled pad id


@pytest.fixture(scope="module")
def model():
    return load_policy("tiny", tiny=TINY, seed=11, device="cpu").model.train()


def _reference(hidden, weight, bias, targets, temperature):
    logp = torch.log_softmax((hidden @ weight.t() + bias) / temperature, dim=-1)
    return logp.gather(-1, targets[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
def test_head_logprobs_equal_the_whole_softmax_for_any_chunk(chunk):
    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(7, 5, generator=gen, dtype=torch.float64), torch.randn(11, 5, generator=gen,
                                                                                        dtype=torch.float64)
    bias, targets = torch.randn(11, generator=gen, dtype=torch.float64), torch.randint(0, 11, (7,), generator=gen)
    logprobs, entropy = head_logprobs(hidden, weight, targets, 0.7, chunk, bias=bias)
    want_logprobs, want_entropy = _reference(hidden, weight, bias, targets, 0.7)
    torch.testing.assert_close(logprobs, want_logprobs, rtol=0, atol=1e-12)
    torch.testing.assert_close(entropy, want_entropy, rtol=0, atol=1e-12)


def test_head_logprobs_gradients_pass_gradcheck_in_float64():
    gen = torch.Generator().manual_seed(1)

    def leaf(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()

    hidden, weight, bias = leaf(6, 4), leaf(9, 4), leaf(9)
    targets = torch.randint(0, 9, (6,), generator=gen)
    both = lambda h, w, b: head_logprobs(h, w, targets, 0.8, 4, bias=b)  # noqa: E731
    only_logprobs = lambda h, w, b: head_logprobs(h, w, targets, 0.8, 4, bias=b)[0]  # noqa: E731
    only_entropy = lambda h, w, b: head_logprobs(h, w, targets, 0.8, 4, bias=b)[1]  # noqa: E731
    for fn in (both, only_logprobs, only_entropy):
        assert torch.autograd.gradcheck(fn, (hidden, weight, bias))


def _saved_shapes(run) -> list[tuple[int, ...]]:
    shapes: list[tuple[int, ...]] = []

    def pack(tensor):
        shapes.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return shapes


def test_the_chunked_path_saves_no_tokens_by_vocabulary_tensor(model):
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    tokens = sum(len(c) for c in COMPLETIONS)

    def vocab_sized_elements(shapes):
        """Saved elements of every tensor with a vocabulary dimension, except the head weight [V, H] itself (a
        Python chunk loop under autograd would show up here as N × V elements in [chunk, V] pieces)."""
        return sum(torch.Size(s).numel() for s in shapes if vocab in s and s != (vocab, hidden))

    chunked = CompletionScorer(1.0, 4)
    assert vocab_sized_elements(_saved_shapes(lambda: chunked.score(model, PROMPTS, COMPLETIONS, True))) == 0
    plain = _saved_shapes(lambda: completion_logprobs(model, PROMPTS, COMPLETIONS, 1.0, with_entropy=True))
    assert vocab_sized_elements(plain) >= tokens * vocab, "the plain path keeps [rows, T, V] logits: caught above"


def _loss_and_grads(model, logprobs, entropy):
    weights = torch.linspace(-1.0, 1.0, logprobs.numel()).reshape(logprobs.shape)
    loss = (logprobs * weights).sum() + 0.3 * entropy.sum()
    return torch.autograd.grad(loss, [p for p in model.parameters()])


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_chunked_scorer_matches_the_plain_path_in_values_and_gradients(model, temperature):
    scored = CompletionScorer(temperature, 5).score(model, PROMPTS, COMPLETIONS, with_entropy=True)
    logprobs, entropy, mask = completion_logprobs(model, PROMPTS, COMPLETIONS, temperature, with_entropy=True)
    assert torch.equal(scored.mask, mask)
    torch.testing.assert_close(scored.logprobs, logprobs, rtol=0, atol=1e-5)
    torch.testing.assert_close(scored.entropy, entropy, rtol=0, atol=1e-5)
    assert torch.all(scored.logprobs[~mask] == 0) and torch.all(scored.entropy[~mask] == 0)
    for got, want in zip(_loss_and_grads(model, scored.logprobs, scored.entropy),
                         _loss_and_grads(model, logprobs, entropy), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_only_completion_positions_reach_the_head(model, monkeypatch):
    import groupwise.model.completion_scorer as scorer_module

    seen = []
    real = scorer_module.head_logprobs
    monkeypatch.setattr(scorer_module, "head_logprobs", lambda hidden, *a, **k: seen.append(hidden.shape[0])
                        or real(hidden, *a, **k))
    scored = CompletionScorer(1.0, 1024).score(model, PROMPTS, COMPLETIONS)
    assert seen == [sum(len(c) for c in COMPLETIONS)]
    widest = max(len(p) + len(c) for p, c in zip(PROMPTS, COMPLETIONS, strict=True))
    # the last column predicts nothing scored and is not fed
    fed = [min(len(p) + len(c), widest - 1) for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    assert scored.real_tokens == sum(fed)
    assert scored.padded_tokens == len(PROMPTS) * (widest - 1)


def test_models_with_other_logits_fall_back_to_the_plain_path_with_a_reason(model, monkeypatch):
    capped = load_policy("tiny", tiny=TINY, seed=11, device="cpu").model
    capped.config.final_logit_softcapping = 30.0
    assert "final_logit_softcapping=30.0" in CompletionScorer(1.0, 8).describe(capped)

    wrapped = load_policy("tiny", tiny=TINY, seed=11, device="cpu").model
    wrapped.lm_head = torch.nn.Sequential(wrapped.lm_head)
    assert "not a plain Linear" in CompletionScorer(1.0, 8).describe(wrapped)

    scaled = load_policy("tiny", tiny=TINY, seed=11, device="cpu").model
    forward = type(scaled).forward

    def doubled_logits(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        out.logits = out.logits * 2.0
        return out

    monkeypatch.setattr(scaled, "forward", doubled_logits.__get__(scaled))
    scorer = CompletionScorer(1.0, 8)
    assert scorer.describe(scaled).startswith("plain") and "probe logits differ" in scorer.describe(scaled)
    logprobs, _, _ = completion_logprobs(scaled, PROMPTS, COMPLETIONS, 1.0)
    assert torch.equal(scorer.score(scaled, PROMPTS, COMPLETIONS).logprobs, logprobs)
    assert CompletionScorer(1.0, 8).describe(model).startswith("chunked")


def test_autocast_path_stays_close_to_float32(model):
    full = CompletionScorer(1.0, 4).score(model, PROMPTS, COMPLETIONS, with_entropy=True)
    mixed = CompletionScorer(1.0, 4, compute_dtype=torch.bfloat16).score(model, PROMPTS, COMPLETIONS,
                                                                         with_entropy=True)
    assert mixed.logprobs.dtype == torch.float32
    torch.testing.assert_close(mixed.logprobs, full.logprobs, rtol=0, atol=0.05)
    loss = (mixed.logprobs.sum() + mixed.entropy.sum())
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    model.zero_grad(set_to_none=True)
