"""Group baselines and advantages.

Pins: mean and leave-one-out baselines (LOO for G = 2 is the other row); A = r − b; normalisation by the
population std of the group, decided on EXACT equality of the WHOLE group for both baselines, so identical groups
give exactly 0, `[0] + [0.95]*7` stays bounded (never ~2000), and every row of a group is divided by the same std:
hand-computed `[1, 0, 0, 0]` (mean: √3, −1/√3; LOO: 4/√3 ≈ 2.31, −4/(3√3) ≈ −0.77) and G = 2 (mean ±1, LOO ±2);
advantages sum to 0 for both baselines, mean-baseline ones are bounded by sqrt(G − 1) and LOO ones are the mean's
times G / (G − 1); clipping applies each optional bound. Batch-level normalisation: group baselines divided by ONE
population std over every reward of the step (a zero-variance group stays exactly 0, an all-equal batch gives
exactly 0), and a step's chunk uses it when ``grpo.advantage_std`` is ``batch``; without std normalisation the
advantage is ``r − mean`` undivided.
"""

import math
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from groupwise.algo.advantages import (
    batch_normalized_advantages,
    clip_advantages,
    group_advantages,
    group_baselines,
    group_std,
)
from groupwise.chunks import group_row_advantages
from groupwise.config.algorithm import GrpoSection


def test_mean_and_leave_one_out_baselines():
    assert group_baselines([1.0, 0.0, 0.0, 0.0], "mean") == pytest.approx([0.25] * 4)
    assert group_baselines([1.0, 0.0, 0.0, 0.0], "leave_one_out") == pytest.approx([0.0, 1 / 3, 1 / 3, 1 / 3])
    assert group_baselines([3.0, 5.0], "leave_one_out") == [5.0, 3.0]


def test_leave_one_out_needs_two_rows():
    with pytest.raises(ValueError, match="at least 2 rows"):
        group_baselines([1.0], "leave_one_out")


def test_unknown_baseline_raises():
    with pytest.raises(ValueError, match="unknown baseline kind 'median'"):
        group_baselines([1.0, 0.0], "median")  # type: ignore[arg-type]


def test_mean_baseline_normalised_by_population_std():
    # mean 0.25, population std sqrt(3)/4: A = 0.75/(sqrt(3)/4) = sqrt(3), -0.25/(sqrt(3)/4) = -1/sqrt(3)
    adv = group_advantages([1.0, 0.0, 0.0, 0.0], "mean", normalize=True)
    assert adv == pytest.approx([math.sqrt(3)] + [-1 / math.sqrt(3)] * 3, rel=1e-5)


def test_leave_one_out_divides_every_row_by_the_group_std():
    # diffs 1 − 0 and 0 − 1/3, all divided by the population std sqrt(3)/4: 4/sqrt(3) ≈ 2.31, −4/(3 sqrt(3)) ≈ −0.77
    adv = group_advantages([1.0, 0.0, 0.0, 0.0], "leave_one_out", normalize=True)
    scale = math.sqrt(3) / 4 + 1e-6
    assert adv == [1.0 / scale] + [-(1 / 3) / scale] * 3
    assert adv == pytest.approx([4 / math.sqrt(3)] + [-4 / (3 * math.sqrt(3))] * 3, rel=1e-5)
    assert adv[0] == pytest.approx(2.3094, abs=1e-4) and adv[1] == pytest.approx(-0.7698, abs=1e-4)


def test_group_of_two_is_divided_by_its_std_with_either_baseline():
    # mean 0.5, population std 0.5: mean-baseline diffs ±0.5 → ±1; leave-one-out diffs ±1 → ±2
    scale = 0.5 + 1e-6
    assert group_advantages([1.0, 0.0], "mean", normalize=True) == [0.5 / scale, -0.5 / scale]
    assert group_advantages([1.0, 0.0], "leave_one_out", normalize=True) == [1.0 / scale, -1.0 / scale]
    assert group_advantages([1.0, 0.0], "leave_one_out", normalize=True) == pytest.approx([2.0, -2.0], rel=1e-5)
    assert group_advantages([0.3, 0.7], "leave_one_out", normalize=False) == pytest.approx([-0.4, 0.4])


@pytest.mark.parametrize("baseline", ["mean", "leave_one_out"])
def test_one_loser_among_identical_winners_stays_bounded(baseline):
    # the loser sits at the bound: −sqrt(G − 1) = −sqrt(7) with mean, times G / (G − 1) = 8/7 with leave-one-out
    adv = group_advantages([0.0] + [0.95] * 7, baseline, normalize=True)
    loser = -math.sqrt(7) * (8 / 7 if baseline == "leave_one_out" else 1.0)
    assert adv[0] == pytest.approx(loser, rel=1e-5)
    assert adv[1:] == pytest.approx([-loser / 7] * 7, rel=1e-5)


@pytest.mark.parametrize("baseline", ["mean", "leave_one_out"])
@pytest.mark.parametrize("value", [0.95, 1 / 6, 0.1])
def test_identical_rewards_give_exactly_zero(baseline, value):
    assert group_advantages([value] * 8, baseline, normalize=True) == [0.0] * 8
    assert group_advantages([value] * 8, baseline, normalize=False) == [0.0] * 8


def test_without_normalisation_advantage_is_reward_minus_baseline():
    assert group_advantages([2.0, 0.0, 1.0], "mean", normalize=False) == pytest.approx([1.0, -1.0, 0.0])


rewards_lists = st.lists(st.floats(-10, 10, allow_nan=False), min_size=2, max_size=16)


@given(rewards_lists)
def test_mean_baseline_advantages_sum_to_zero_and_are_bounded(rewards):
    adv = group_advantages(rewards, "mean", normalize=True)
    bound = math.sqrt(len(rewards) - 1) + 1e-9
    assert all(abs(a) <= bound for a in adv)
    scale = group_std(rewards) + 1e-6
    assert abs(math.fsum(adv)) <= 1e-9 * len(rewards) * (1 + 10 / scale)


@given(rewards_lists)
def test_leave_one_out_advantages_sum_to_zero_and_are_the_mean_ones_scaled(rewards):
    """Whole-group division: LOO's r_i − mean(r_j≠i) is G/(G − 1) · (r_i − mean(r)), and every row shares one std."""
    g = len(rewards)
    adv = group_advantages(rewards, "leave_one_out", normalize=True)
    scale = group_std(rewards) + 1e-6
    assert abs(math.fsum(adv)) <= 1e-9 * g * (1 + 10 / scale)
    want = [g / (g - 1) * a for a in group_advantages(rewards, "mean", normalize=True)]
    assert adv == pytest.approx(want, rel=1e-7, abs=1e-9 * (1 + 10 / scale))


def test_clip_advantages_applies_each_optional_bound():
    values = [-3.0, -0.5, 0.5, 3.0]
    assert clip_advantages(values, -1.0, 2.0) == [-1.0, -0.5, 0.5, 2.0]
    assert clip_advantages(values, low=-1.0) == [-1.0, -0.5, 0.5, 3.0]
    assert clip_advantages(values, high=0.0) == [-3.0, -0.5, 0.0, 0.0]
    assert clip_advantages(values) == values
    with pytest.raises(ValueError, match="low <= high"):
        clip_advantages(values, 1.0, -1.0)


def test_batch_normalisation_divides_group_baselines_by_one_std_over_the_step():
    groups = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
    every = [r for g in groups for r in g]
    mean = sum(every) / len(every)
    std = math.sqrt(sum((r - mean) ** 2 for r in every) / len(every))
    want = [[(r - sum(g) / len(g)) / (std + 1e-6) for r in g] for g in groups]
    got = batch_normalized_advantages(groups, "mean")
    assert got[2] == [0.0] * 4  # a zero-variance group stays exactly 0
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, rel=1e-12)
    assert got[0][0] != pytest.approx(group_advantages(groups[0], "mean", normalize=True)[0])
    assert batch_normalized_advantages([[0.5, 0.5], [0.5, 0.5]], "leave_one_out") == [[0.0, 0.0], [0.0, 0.0]]


def test_a_chunk_uses_the_advantage_estimator_the_section_names():
    rewards = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.5]]
    groups = [SimpleNamespace(rewards=r) for r in rewards]  # advantages read only a group's rewards
    batch = group_row_advantages(groups, GrpoSection(advantage_std="batch"))
    assert [list(a) for a in batch] == batch_normalized_advantages(rewards, "mean")
    undivided = group_row_advantages(groups, GrpoSection(normalize_advantages=False))
    assert [list(a) for a in undivided] == [[0.75, -0.25, -0.25, -0.25], [0.375, 0.375, -0.625, -0.125]]
