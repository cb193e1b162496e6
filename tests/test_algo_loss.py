"""The clipped policy-gradient loss (``dapo`` on :class:`LossInputs`) against hand-computed values.

Pins: clip-low and clip-high bind the objective (and zero its gradient) on the right side; dual clip caps
negative-advantage tokens at −A·c (its fraction is reported only when ``dual_clip_c`` is set); IS weights
exp(prev − gen) are clamped (tis), zeroed outside the bounds (icepop) or raw (none), with non-finite weights → 0;
token- vs sequence-level normalisation; k3 KL with input/output clamps; entropy bonus; padded positions never reach
value or gradient; summing chunk losses with the step's global denominator equals the one-shot loss in value AND
gradient, and merged stats equal one-shot stats; bad input raises naming the tensor or the coefficient.
"""

import math

import pytest
import torch

from groupwise.algo.clip_losses import dapo
from groupwise.algo.loss import global_denominator
from groupwise.algo.loss_seam import LossInputs
from groupwise.algo.loss_stats import LossStats
from groupwise.config.algorithm import LossSection

pytestmark = pytest.mark.numerics

CLIP = dict(epsilon_low=0.2, epsilon_high=0.28)


def leaf(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def data(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def policy_loss(logprobs, prev_logprobs, generation_logprobs, advantages, mask, *, denominator, ref_logprobs=None,
                entropy=None, **settings):
    """``dapo`` on these tensors, the loss section built from ``settings`` (normalization, clip, IS, KL, entropy)."""
    inputs = LossInputs(logprobs, prev_logprobs, generation_logprobs, advantages, mask, LossSection(**settings),
                        normaliser=denominator, ref_logprobs=ref_logprobs, entropy=entropy)
    result = dapo(inputs)
    return result.loss, result.stats


def assert_values(tensor: torch.Tensor, expected) -> None:
    torch.testing.assert_close(tensor, data(expected), rtol=1e-9, atol=1e-12)


def test_clip_low_and_high_bind_the_objective():
    # row 0: A=+1, r=[1.5, 1.0]; row 1: A=-1, r=[0.5, 1.1]; prev = gen, so w = 1
    cur = leaf([[math.log(1.5), 0.0], [math.log(0.5), math.log(1.1)]])
    zeros, mask = data([[0.0, 0.0], [0.0, 0.0]]), data([[1, 1], [1, 1]])
    loss, stats = policy_loss(cur, zeros, zeros, data([1.0, -1.0]), mask, **CLIP, normalization="token_level",
                              denominator=4.0)
    # ℓ = max(-A r, -A clip(r, 0.8, 1.28)) = [-1.28, -1.0, 0.8, 1.1]
    assert loss.item() == pytest.approx((-1.28 - 1.0 + 0.8 + 1.1) / 4)
    loss.backward()
    # clipped tokens have no gradient; unclipped -A·r has d/dlogp = -A·r
    assert_values(cur.grad, [[0.0, -1.0 / 4], [0.0, 1.1 / 4]])
    metrics = stats.as_metrics(loss.item())
    assert metrics["loss/clip_fraction"] == 0.5
    assert metrics["loss/clip_low_fraction"] == 0.25 and metrics["loss/clip_high_fraction"] == 0.25
    assert metrics["loss/ratio_mean"] == pytest.approx((1.5 + 1.0 + 0.5 + 1.1) / 4)
    assert metrics["loss/total"] == loss.item()
    assert "loss/dual_clip_fraction" not in metrics  # no dual clip set: not measured, not a 0.0


def test_ratio_inside_the_clip_range_is_not_clipped_whatever_the_sign():
    cur = leaf([[math.log(1.1)], [math.log(0.9)]])
    zeros = data([[0.0], [0.0]])
    loss, stats = policy_loss(cur, zeros, zeros, data([1.0, -1.0]), data([[1], [1]]), **CLIP,
                              normalization="token_level", denominator=2.0)
    assert loss.item() == pytest.approx((-1.1 + 0.9) / 2)
    assert stats.clip_count == 0


def test_dual_clip_caps_negative_advantage_tokens():
    # A = -1, r = 5: unclipped 5 > clipped 1.28, so ℓ = 5; dual clip with c = 3 gives min(5, 3) = 3
    cur, zeros, mask = leaf([[math.log(5.0)]]), data([[0.0]]), data([[1]])
    plain, _ = policy_loss(cur, zeros, zeros, data([-1.0]), mask, **CLIP, normalization="token_level",
                           denominator=1.0)
    capped, stats = policy_loss(cur, zeros, zeros, data([-1.0]), mask, **CLIP, dual_clip_c=3.0,
                                normalization="token_level", denominator=1.0)
    assert plain.item() == pytest.approx(5.0)
    assert capped.item() == pytest.approx(3.0)
    capped.backward()
    assert cur.grad.item() == 0.0
    assert stats.as_metrics()["loss/dual_clip_fraction"] == 1.0


def test_dual_clip_leaves_positive_advantages_alone():
    cur, zeros, mask = leaf([[math.log(0.1)]]), data([[0.0]]), data([[1]])
    loss, stats = policy_loss(cur, zeros, zeros, data([2.0]), mask, **CLIP, dual_clip_c=3.0,
                              normalization="token_level", denominator=1.0)
    assert loss.item() == pytest.approx(-2.0 * 0.1)
    assert stats.dual_clip_count == 0


@pytest.mark.parametrize(
    "importance_sampling, truncation, expected",
    [(True, "tis", (-2.0 - 1.5) / 2), (True, "icepop", (0.0 - 1.5) / 2), (True, "none", (-3.0 - 1.5) / 2),
     (False, "tis", -1.0)],
)
def test_importance_weights_and_truncation(importance_sampling, truncation, expected):
    # r = 1, A = 1 so ℓ = -1; w = exp(prev - gen) = [3, 1.5] with bounds [0.5, 2]
    cur = leaf([[0.0, 0.0]])
    prev, gen = data([[0.0, 0.0]]), data([[-math.log(3.0), -math.log(1.5)]])
    loss, stats = policy_loss(cur, prev, gen, data([1.0]), data([[1, 1]]), **CLIP, normalization="token_level",
                              denominator=2.0, importance_sampling=importance_sampling, is_truncation=truncation,
                              is_ratio_min=0.5, is_ratio_max=2.0)
    assert loss.item() == pytest.approx(expected)
    metrics = stats.as_metrics()
    assert metrics["loss/is_weight_mean"] == pytest.approx(2.25)
    assert metrics["loss/is_weight_max"] == pytest.approx(3.0)
    assert metrics["loss/is_oob_fraction"] == 0.5


def test_non_finite_importance_weight_becomes_zero():
    cur = leaf([[0.0, 0.0]])
    prev, gen = data([[0.0, 0.0]]), data([[-math.inf, 0.0]])
    loss, _ = policy_loss(cur, prev, gen, data([1.0]), data([[1, 1]]), **CLIP, normalization="token_level",
                          denominator=2.0, is_truncation="none")
    assert loss.item() == pytest.approx(-0.5)
    loss.backward()
    assert_values(cur.grad, [[0.0, -0.5]])


def test_token_versus_sequence_level_normalisation_and_padding():
    # r = 1: ℓ = -A. Row 0 (A=1) has 1 valid token, row 1 (A=-2) has 2; the padded slot holds NaN
    cur = leaf([[0.0, math.nan], [0.0, 0.0]])
    zeros, mask = data([[0.0, math.inf], [0.0, 0.0]]), data([[1, 0], [1, 1]])
    adv = data([1.0, -2.0])
    assert global_denominator([mask], "token_level") == 3.0
    assert global_denominator([mask], "sequence_level") == 2.0
    token, _ = policy_loss(cur, zeros, zeros, adv, mask, **CLIP, normalization="token_level", denominator=3.0)
    sequence, _ = policy_loss(cur, zeros, zeros, adv, mask, **CLIP, normalization="sequence_level",
                              denominator=2.0)
    assert token.item() == pytest.approx((-1 + 2 + 2) / 3)
    assert sequence.item() == pytest.approx((-1 / 1 + (2 + 2) / 2) / 2)
    sequence.backward()
    assert_values(cur.grad, [[-1 / 2, 0.0], [2 / 4, 2 / 4]])


def test_k3_kl_value_gradient_and_clamps():
    # ref - cur = log 2: k3 = 2 - 1 - log 2; d/dcur = -(exp(x) - 1) = -1
    cur, zeros, mask = leaf([[0.0, 0.0]]), data([[0.0, 0.0]]), data([[1, 1]])
    ref = data([[math.log(2.0), 30.0]])  # the second token's log-ratio 30 is clamped to 20, then k3 to 10
    loss, stats = policy_loss(cur, zeros, zeros, data([0.0]), mask, **CLIP, normalization="token_level",
                              denominator=2.0, kl_coef=0.1, ref_logprobs=ref)
    k3 = 2.0 - 1.0 - math.log(2.0)
    assert loss.item() == pytest.approx(0.1 * (k3 + 10.0) / 2)
    loss.backward()
    assert cur.grad[0, 0].item() == pytest.approx(0.1 * -1.0 / 2)
    assert stats.as_metrics()["loss/kl"] == pytest.approx((k3 + 10.0) / 2)


def test_entropy_bonus_lowers_the_loss_and_pushes_entropy_up():
    cur, zeros, mask = leaf([[0.0, 0.0]]), data([[0.0, 0.0]]), data([[1, 1]])
    entropy = leaf([[0.5, 1.5]])
    loss, stats = policy_loss(cur, zeros, zeros, data([0.0]), mask, **CLIP, normalization="token_level",
                              denominator=2.0, entropy=entropy, entropy_coef=0.01)
    assert loss.item() == pytest.approx(-0.01 * (0.5 + 1.5) / 2)
    loss.backward()
    assert_values(entropy.grad, [[-0.005, -0.005]])
    assert stats.as_metrics()["loss/entropy"] == pytest.approx(1.0)


def _random_step(seed: int):
    g = torch.Generator().manual_seed(seed)
    rows, width = 6, 5
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).double()
    cur = (torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.3 - 1.0).requires_grad_()
    prev = cur.detach() + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.3
    gen = prev + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.5
    ref = cur.detach() + torch.randn(rows, width, generator=g, dtype=torch.float64) * 0.5
    entropy = torch.rand(rows, width, generator=g, dtype=torch.float64).requires_grad_()
    adv = torch.randn(rows, generator=g, dtype=torch.float64)
    return cur, prev, gen, ref, entropy, adv, mask


@pytest.mark.parametrize("normalization", ["token_level", "sequence_level"])
def test_chunked_loss_equals_one_shot_in_value_and_gradient(normalization):
    cur, prev, gen, ref, entropy, adv, mask = _random_step(0)
    options = dict(**CLIP, dual_clip_c=3.0, normalization=normalization, kl_coef=0.05, is_truncation="tis",
                   entropy_coef=0.01)
    chunks = [slice(0, 2), slice(2, 3), slice(3, 6)]
    denominator = global_denominator([mask[c] for c in chunks], normalization)
    assert denominator == global_denominator([mask], normalization)

    whole, whole_stats = policy_loss(cur, prev, gen, adv, mask, ref_logprobs=ref, entropy=entropy,
                                     denominator=denominator, **options)
    whole_grads = torch.autograd.grad(whole, [cur, entropy])

    total, merged = torch.zeros((), dtype=torch.float64), LossStats()
    for c in chunks:
        part, part_stats = policy_loss(cur[c], prev[c], gen[c], adv[c], mask[c], ref_logprobs=ref[c],
                                       entropy=entropy[c], denominator=denominator, **options)
        total = total + part
        merged = merged.merge(part_stats)
    chunk_grads = torch.autograd.grad(total, [cur, entropy])

    assert total.item() == pytest.approx(whole.item(), rel=1e-12)
    for a, b in zip(chunk_grads, whole_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)
    assert merged.as_metrics(total.item()) == pytest.approx(whole_stats.as_metrics(whole.item()))
    assert whole_grads[0].abs().sum() > 0


def test_global_denominator_rejects_a_step_without_valid_tokens():
    with pytest.raises(ValueError, match="no valid tokens"):
        global_denominator([torch.zeros(2, 3)], "token_level")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(advantages=data([1.0, 2.0])), "advantages must be"),
        (dict(mask=data([[1, 1, 1]])), "mask has shape"),
        (dict(kl_coef=0.1), "needs ref_logprobs"),
        (dict(entropy_coef=0.1), "needs the per-token entropy"),
        (dict(denominator=0.0), "normaliser must be > 0"),
    ],
)
def test_bad_input_raises_naming_the_problem(overrides, message):
    args = dict(logprobs=data([[0.0, 0.0]]), prev_logprobs=data([[0.0, 0.0]]),
                generation_logprobs=data([[0.0, 0.0]]), advantages=data([1.0]), mask=data([[1, 1]]), **CLIP,
                normalization="token_level", denominator=1.0)
    args.update(overrides)
    with pytest.raises(ValueError, match=message):
        policy_loss(**args)
