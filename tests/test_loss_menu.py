"""Each built-in loss against its paper's formula, computed here with plain Python floats.

Invariants pinned, for dapo, grpo, dr_grpo, gspo, gspo_token and cispo on one hand-written micro-batch (two
completions of 3 and 2 tokens, one padded position, ratios that leave the clip range on both sides, behaviour
weights one of which is truncated, an entropy bonus):
- the loss VALUE equals the formula (token-level mean, per-completion mean, constant normaliser, sequence-level
  geometric-mean ratio, detached clipped coefficient);
- the GRADIENT with respect to every token's log-probability and entropy equals the formula's derivative:
  a PPO-clipped token gets none, a CISPO token always gets one, a GSPO completion shares one ratio;
- padding reaches neither value nor gradient; gspo and gspo_token agree in value and gradient.
"""

from __future__ import annotations

import math

import pytest
import torch

from groupwise.algo.loss_registry import resolve_loss
from groupwise.algo.loss_seam import LossInputs
from groupwise.config.algorithm import LossSection

pytestmark = pytest.mark.numerics

PREV = [[-1.0, -2.0, -0.5], [-1.5, -0.3]]
RATIO = [[1.5, 0.9, 1.25], [0.7, 0.85]]  # r = exp(cur − prev)
WEIGHT = [[1.2, 0.8, 1.0], [3.0, 0.5]]  # raw behaviour weight exp(prev − gen); 3.0 is truncated to 2 by tis
ENTROPY = [[0.5, 1.0, 1.5], [2.0, 0.25]]
ADV = [1.0, -0.5]
EPS_LOW, EPS_HIGH, IS_MAX, ENTROPY_COEF, MAX_NEW_TOKENS = 0.2, 0.28, 2.0, 0.1, 6
LENGTHS = [len(row) for row in PREV]
TOKENS, ROWS = sum(LENGTHS), len(LENGTHS)
PAD = 123.0


def padded(rows: list[list[float]]) -> torch.Tensor:
    width = max(LENGTHS)
    return torch.tensor([row + [PAD] * (width - len(row)) for row in rows], dtype=torch.float64)


def cur_values() -> list[list[float]]:
    return [[p + math.log(r) for p, r in zip(ps, rs, strict=True)] for ps, rs in zip(PREV, RATIO, strict=True)]


def ppo_term(r: float, a: float, low: float, high: float) -> tuple[float, float]:
    """``max(−A·r, −A·clip(r, 1 − low, 1 + high))`` and its derivative in ``log r`` (0 where the clip binds)."""
    unclipped, clipped = -a * r, -a * min(max(r, 1 - low), 1 + high)
    return (clipped, 0.0) if clipped > unclipped else (unclipped, -a * r)


def token_share(loss: str, i: int) -> float:
    """``k_i``: the loss is ``Σ_i Σ_t k_i · x_it`` for a per-token term ``x`` (the normaliser of each family)."""
    if loss in ("dapo", "cispo"):
        return 1 / TOKENS
    if loss == "dr_grpo":
        return 1 / (ROWS * MAX_NEW_TOKENS)
    return 1 / (ROWS * LENGTHS[i])  # grpo, gspo, gspo_token: per-completion mean, then over completions


def expected(loss: str) -> tuple[float, list[list[float]], list[list[float]]]:
    """(value, d value / d logprob, d value / d entropy) from the formulas in docs/learner.md."""
    value, grad_cur, grad_entropy = 0.0, [], []
    cur = cur_values()
    for i, (ratios, a) in enumerate(zip(RATIO, ADV, strict=True)):
        k, n = token_share(loss, i), LENGTHS[i]
        weights = [min(w, IS_MAX) for w in WEIGHT[i]]
        if loss in ("gspo", "gspo_token"):
            s = math.exp(sum(math.log(r) for r in ratios) / n)
            w = min(math.exp(sum(math.log(x) for x in WEIGHT[i]) / n), IS_MAX)
            term, slope = ppo_term(s, a, EPS_LOW, EPS_HIGH)
            value += w * term / ROWS
            grad_cur.append([w * slope / (ROWS * n)] * n)
        elif loss == "cispo":
            coefs = [min(r, 1 + EPS_HIGH) for r in ratios]
            value += sum(-k * w * c * a * x for w, c, x in zip(weights, coefs, cur[i], strict=True))
            grad_cur.append([-k * w * c * a for w, c in zip(weights, coefs, strict=True)])
        else:
            high = EPS_LOW if loss == "grpo" else EPS_HIGH
            terms = [ppo_term(r, a, EPS_LOW, high) for r in ratios]
            value += sum(k * w * t for w, (t, _) in zip(weights, terms, strict=True))
            grad_cur.append([k * w * g for w, (_, g) in zip(weights, terms, strict=True)])
        value += sum(-ENTROPY_COEF * k * h for h in ENTROPY[i])
        grad_entropy.append([-ENTROPY_COEF * k] * n)
    return value, grad_cur, grad_entropy


def computed(loss: str) -> tuple[float, torch.Tensor, torch.Tensor]:
    cur = padded(cur_values()).requires_grad_(True)
    entropy = padded(ENTROPY).requires_grad_(True)
    prev = padded(PREV)
    gen = prev - torch.log(padded(WEIGHT))
    mask = padded([[1.0] * n for n in LENGTHS]).ne(PAD).to(torch.float64)
    settings = LossSection(type=loss, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, is_ratio_max=IS_MAX,
                           entropy_coef=ENTROPY_COEF)
    normaliser = {"token_level": TOKENS, "sequence_level": ROWS}[resolve_loss(loss).normalization(settings)]
    inputs = LossInputs(cur, prev, gen, torch.tensor(ADV, dtype=torch.float64), mask, settings,
                        normaliser=normaliser, max_completion_tokens=MAX_NEW_TOKENS, entropy=entropy)
    result = resolve_loss(loss)(inputs)
    result.loss.backward()
    assert cur.grad is not None and entropy.grad is not None
    return result.loss.item(), cur.grad, entropy.grad


@pytest.mark.parametrize("loss", ["dapo", "grpo", "dr_grpo", "gspo", "gspo_token", "cispo"])
def test_value_and_gradient_match_the_formula(loss):
    value, grad_cur, grad_entropy = expected(loss)
    got_value, got_cur, got_entropy = computed(loss)
    assert got_value == pytest.approx(value, rel=1e-12, abs=1e-12)
    torch.testing.assert_close(got_cur, padded(grad_cur).masked_fill(padded(grad_cur) == PAD, 0.0),
                               rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got_entropy, padded(grad_entropy).masked_fill(padded(grad_entropy) == PAD, 0.0),
                               rtol=1e-10, atol=1e-12)


def test_the_case_exercises_every_branch():
    """The hand-written case is not degenerate: the clip binds on both sides, a GSPO sequence is clipped and one
    is not, and CISPO caps one coefficient."""
    assert ppo_term(RATIO[0][0], ADV[0], EPS_LOW, EPS_HIGH)[1] == 0.0  # clip-high binds
    assert ppo_term(RATIO[1][0], ADV[1], EPS_LOW, EPS_HIGH)[1] == 0.0  # clip-low binds
    assert ppo_term(RATIO[0][1], ADV[0], EPS_LOW, EPS_HIGH)[1] != 0.0
    symmetric, higher = ppo_term(RATIO[0][2], 1.0, EPS_LOW, EPS_LOW), ppo_term(RATIO[0][2], 1.0, EPS_LOW, EPS_HIGH)
    assert symmetric[1] == 0.0 != higher[1]  # grpo's symmetric clip binds where dapo's clip-higher does not
    s0, s1 = (math.exp(sum(map(math.log, r)) / len(r)) for r in RATIO)
    assert ppo_term(s0, ADV[0], EPS_LOW, EPS_HIGH)[1] != 0.0 and ppo_term(s1, ADV[1], EPS_LOW, EPS_HIGH)[1] == 0.0
    assert max(max(r) for r in RATIO) > 1 + EPS_HIGH


def test_gspo_and_its_token_variant_agree():
    a, b = computed("gspo"), computed("gspo_token")
    assert a[0] == pytest.approx(b[0], rel=1e-12)
    torch.testing.assert_close(a[1], b[1], rtol=1e-12, atol=1e-15)
