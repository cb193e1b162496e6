"""The dynamic-sampling filter is per group, on raw rewards, by exact equality (invariant 3 in docs/design.md).

Pins: a group is zero-variance iff max − min ≤ tol (tol 0 = exact), so equal non-dyadic rewards whose
float32 std is a tiny residue still count as zero-variance; a lone correct answer keeps its group; the
all-max / all-min split follows the caller's declared reward range; bad input raises.
"""

import pytest
import torch

from groupwise.algo.filter import is_zero_variance, zero_variance_kind


def test_identical_rewards_are_zero_variance_even_where_a_float32_std_is_not_zero():
    # torch 2.13 gives a float32 std of ~1.6e-8 for these eight equal values: a `std == 0` test keeps the group
    assert is_zero_variance([1 / 6] * 8)
    assert is_zero_variance(torch.full((8,), 0.95, dtype=torch.float32).tolist())


def test_lone_correct_answer_keeps_the_group():
    assert not is_zero_variance([1.0, 0.0, 0.0, 0.0])
    assert not is_zero_variance([0.0] + [0.95] * 7)


def test_tolerance_is_inclusive_and_exact_by_default():
    rewards = [0.5, 0.5 + 1e-7]
    assert not is_zero_variance(rewards)
    assert is_zero_variance(rewards, tol=1e-6)
    assert not is_zero_variance([0.0, 0.5], tol=0.49)
    assert is_zero_variance([0.0, 0.5], tol=0.5)


@pytest.mark.parametrize(
    "rewards, expected",
    [([1.0, 1.0], "max"), ([0.0, 0.0, 0.0], "min"), ([0.5, 0.5], "other"), ([0.0, 1.0], None)],
)
def test_zero_variance_kind_against_declared_range(rewards, expected):
    assert zero_variance_kind(rewards, low=0.0, high=1.0) == expected


def test_zero_variance_kind_uses_tolerance_for_the_split():
    assert zero_variance_kind([0.9995, 0.9999], low=0.0, high=1.0, tol=1e-3) == "max"


def test_zero_variance_kind_with_degenerate_range_is_other():
    assert zero_variance_kind([1.0, 1.0], low=1.0, high=1.0) == "other"


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: is_zero_variance([]), "at least one reward"),
        (lambda: is_zero_variance([1.0, float("nan")]), "finite"),
        (lambda: is_zero_variance([1.0], tol=-0.1), "tolerance"),
        (lambda: zero_variance_kind([1.0, 1.0], low=1.0, high=0.0), "low <= high"),
    ],
)
def test_bad_input_raises_with_a_clear_message(call, message):
    with pytest.raises(ValueError, match=message):
        call()
