"""Behaviour importance weights against hand-computed values, the sequence-level mask (``seq_mask_tis``) above all.

Invariants pinned, on four completions whose raw weights ``w = exp(prev − gen)`` are chosen so that each bound
acts differently (bounds [0.5, 2]):
- ``tis`` clamps each token to the bounds, ``icepop`` zeroes each token outside them, ``none`` keeps ``w``, and
  ``importance_sampling: false`` gives 1 everywhere;
- ``seq_mask_tis`` computes ``g_i = exp(mean_t log w_it)`` over the valid tokens only, drops a completion WHOLE when
  ``g_i`` leaves the bounds, keeps the others' raw (untruncated) token weights, and drops a completion with a
  non-finite token log-ratio;
- through ``dapo`` the masked completions reach neither the loss nor the gradient, ``loss/is_seq_masked_fraction``
  counts them among the completions and ``loss/is_oob_fraction`` still counts tokens; through ``gspo``, whose
  weight is already the sequence's geometric mean, ``seq_mask_tis`` equals ``icepop``.
"""

from __future__ import annotations

import math

import pytest
import torch

from groupwise.algo.clip_losses import dapo
from groupwise.algo.gspo import gspo
from groupwise.algo.importance import behaviour_weights, geometric_mean_weights
from groupwise.algo.loss_seam import LossInputs
from groupwise.config.algorithm import LossSection

pytestmark = pytest.mark.numerics

LO, HI, PAD = 0.5, 2.0, 7.0
#: Raw weights per completion: kept by the sequence mask with a weight above the bound, kept, dropped below, dropped
#: for a token the sampler recorded at probability 0 (gen = −inf, so w = inf, reported as 0).
WEIGHTS = [[1.5, 0.8, 1.2], [3.0, 1.2], [0.3, 0.5], [math.inf, 1.0]]
GEOMETRIC = [(1.5 * 0.8 * 1.2) ** (1 / 3), math.sqrt(3.6), math.sqrt(0.15), math.inf]
WIDTH = 3


def padded(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor([row + [PAD] * (WIDTH - len(row)) for row in rows], dtype=torch.float64)


def case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prev, gen, valid): prev = −1 everywhere, gen = prev − log w (−inf where w is inf), padding arbitrary."""
    prev = padded([[-1.0] * len(row) for row in WEIGHTS])
    gen = padded([[-1.0 - math.log(w) for w in row] for row in WEIGHTS])
    valid = padded([[1.0] * len(row) for row in WEIGHTS]) != PAD
    return prev, gen, valid


def applied(truncation: str, enabled: bool = True) -> list[float]:
    """The applied weights of the case's valid tokens, completion after completion."""
    prev, gen, valid = case()
    weights = behaviour_weights(prev, gen, valid, enabled=enabled, truncation=truncation, lo=LO, hi=HI)  # type: ignore[arg-type]
    return weights.applied[valid].tolist()


def flat(rows: list[list[float]]) -> list[float]:
    return [w for row in rows for w in row]


def test_the_geometric_mean_is_over_valid_tokens_only():
    prev, gen, valid = case()
    got = geometric_mean_weights(prev, gen, valid).tolist()
    assert got[:3] == pytest.approx(GEOMETRIC[:3], rel=1e-12) and got[3] == math.inf
    assert GEOMETRIC[0] == pytest.approx(1.1292, abs=1e-4) and GEOMETRIC[1] == pytest.approx(1.8974, abs=1e-4)


def test_each_truncation_against_hand_computed_weights():
    assert applied("none") == pytest.approx(flat([[1.5, 0.8, 1.2], [3.0, 1.2], [0.3, 0.5], [0.0, 1.0]]))
    assert applied("tis") == pytest.approx(flat([[1.5, 0.8, 1.2], [2.0, 1.2], [0.5, 0.5], [0.5, 1.0]]))
    assert applied("icepop") == pytest.approx(flat([[1.5, 0.8, 1.2], [0.0, 1.2], [0.0, 0.5], [0.0, 1.0]]))
    # whole completions: 0 and 1 kept with their RAW weights (3.0 stays 3.0), 2 (g = 0.39) and 3 (g = inf) dropped
    assert applied("seq_mask_tis") == pytest.approx(flat([[1.5, 0.8, 1.2], [3.0, 1.2], [0.0, 0.0], [0.0, 0.0]]))
    assert applied("seq_mask_tis", enabled=False) == [1.0] * 9
    prev, gen, valid = case()
    weights = behaviour_weights(prev, gen, valid, enabled=True, truncation="seq_mask_tis", lo=LO, hi=HI)
    assert weights.masked_rows is not None and weights.masked_rows.tolist() == [False, False, True, True]


def inputs_for(truncation: str, advantages: list[float]) -> LossInputs:
    """A micro-batch with ratio 1 (cur = prev) and the case's behaviour weights; the token-level normaliser 9."""
    prev, gen, valid = case()
    cur = prev.clone().requires_grad_(True)
    settings = LossSection(is_truncation=truncation, is_ratio_min=LO, is_ratio_max=HI)  # type: ignore[arg-type]
    return LossInputs(cur, prev, gen, torch.tensor(advantages, dtype=torch.float64), valid.double(), settings,
                      normaliser=9.0)  # fmt: skip


def test_dapo_with_the_sequence_mask_drops_whole_completions_from_value_and_gradient():
    advantages = [1.0, -0.5, 2.0, 1.0]
    inputs = inputs_for("seq_mask_tis", advantages)
    result = dapo(inputs)
    # r = 1, unclipped: ℓ = −A per token, times the applied weight; completions 2 and 3 weigh 0
    kept = [[1.5, 0.8, 1.2], [3.0, 1.2], [0.0, 0.0], [0.0, 0.0]]
    want = sum(-a * w for a, row in zip(advantages, kept, strict=True) for w in row) / 9
    assert result.loss.item() == pytest.approx(want, rel=1e-12)
    result.loss.backward()
    assert inputs.logprobs.grad is not None
    grad = [inputs.logprobs.grad[i, : len(row)].tolist() for i, row in enumerate(kept)]
    want_grad = [[-a * w / 9 for w in row] for a, row in zip(advantages, kept, strict=True)]
    assert grad == [pytest.approx(row, rel=1e-12) for row in want_grad]
    metrics = result.stats.as_metrics()
    assert metrics["loss/is_seq_masked_fraction"] == 0.5  # 2 of the 4 completions
    assert metrics["loss/is_oob_fraction"] == pytest.approx(3 / 9)  # tokens 3.0, 0.3 and the recorded-at-0 one
    assert "loss/is_seq_masked_fraction" not in dapo(inputs_for("tis", advantages)).stats.as_metrics()


def test_gspo_with_the_sequence_mask_is_icepop_on_its_sequence_weight():
    advantages = [1.0, -0.5, 2.0, 1.0]
    masked, icepop = inputs_for("seq_mask_tis", advantages), inputs_for("icepop", advantages)
    a, b = gspo(masked), gspo(icepop)
    assert a.loss.item() == pytest.approx(b.loss.item(), rel=1e-12)
    a.loss.backward()
    b.loss.backward()
    assert masked.logprobs.grad is not None and icepop.logprobs.grad is not None
    torch.testing.assert_close(masked.logprobs.grad, icepop.logprobs.grad, rtol=1e-12, atol=1e-15)
    assert masked.logprobs.grad[2:].abs().sum() == 0 and masked.logprobs.grad[:2].abs().sum() > 0
