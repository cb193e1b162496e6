"""Reward scaling and DAPO overlong shaping.

Pins: scaling clamps to the source range then maps linearly; overlong penalty is 0 before
max − buffer, linear inside the buffer, and capped at −penalty beyond max (DAPO paper; not left to fall
further); shaping adds the penalty row by row; non-finite rewards and bad parameters raise clear errors.
"""

import pytest

from groupwise.algo.reward_shaping import check_finite_rewards, overlong_penalty, scale_rewards, shape_rewards


def test_scale_rewards_clamps_then_maps_linearly():
    scaled = scale_rewards([-1.0, 0.0, 0.25, 1.0, 2.0], 0.0, 1.0, -1.0, 1.0)
    assert scaled == pytest.approx([-1.0, -1.0, -0.5, 1.0, 1.0])


def test_scale_rewards_from_a_wider_source_range():
    assert scale_rewards([5.0, 7.5], 5.0, 10.0, 0.0, 1.0) == pytest.approx([0.0, 0.5])


def test_scale_rewards_rejects_empty_source_range():
    with pytest.raises(ValueError, match="source_max > source_min"):
        scale_rewards([0.5], 1.0, 1.0, 0.0, 1.0)


@pytest.mark.parametrize(
    "length, expected",
    [(10, 0.0), (20, 0.0), (22, -0.2), (25, -0.5), (30, -0.5), (100, -0.5)],
)
def test_overlong_penalty_linear_in_buffer_and_capped(length, expected):
    # max 25, buffer 5, penalty 0.5: the buffer starts at 20; an uncapped penalty would give -1.0 at L=30
    assert overlong_penalty(length, 25, 5, 0.5) == pytest.approx(expected)


def test_shape_rewards_adds_each_rows_penalty():
    assert shape_rewards([1.0, 1.0, 0.0], [20, 22, 26], 25, 5, 0.5) == pytest.approx([1.0, 0.8, -0.5])


def test_shape_rewards_needs_one_length_per_row():
    with pytest.raises(ValueError, match="3 rewards but 2 lengths"):
        shape_rewards([1.0, 1.0, 0.0], [20, 22], 25, 5, 0.5)


@pytest.mark.parametrize(
    "args, message",
    [((10, 25, 0, 0.5), "overlong_buffer_length"), ((10, 25, 30, 0.5), "overlong_buffer_length"),
     ((10, 25, 5, -1.0), "overlong_buffer_penalty"), ((-1, 25, 5, 0.5), "length")],
)
def test_overlong_penalty_rejects_bad_parameters(args, message):
    with pytest.raises(ValueError, match=message):
        overlong_penalty(*args)


def test_check_finite_rewards_names_context_row_and_value():
    check_finite_rewards([0.0, 1.0], "ok")
    with pytest.raises(ValueError, match=r"math reward: 1 non-finite reward\(s\) \(row 2: nan\)"):
        check_finite_rewards([0.0, 1.0, float("nan")], "math reward")
