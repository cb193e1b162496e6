"""The sync dynamic-sampling accumulator and its step tally.

Pins: exactly max_gen_rounds rounds (no off-by-one); every generated group is tallied before filtering;
kept groups are whole and in round order, carried-in groups first; the exhaustion error names rounds,
groups generated, the all-max / all-min split (and the groups sharing another reward) and the fixes;
train_short trains a short step only at or above ceil(P × min_step_batch_fraction); surplus is carried
(counted as carried out, then as carried in and
trained next step) or discarded (counted); the conservation identity
`generated + carried_in == filtered + trained + discarded + carried_out` holds over random rounds; the
filter never drops a lone correct answer, and G = 2 with leave-one-out trains with non-zero advantages.
"""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from groupwise.algo.accumulator import DynamicSamplingAccumulator, DynamicSamplingExhausted
from groupwise.algo.advantages import group_advantages
from groupwise.algo.filter import GroupFilter
from groupwise.algo.tally import StepTally
from groupwise.types import Completion, Group, Prompt


def make_group(group_id: int, raw: list[float]) -> Group:
    completions = [Completion((5,), (-1.0,), f"g{group_id}c{i}", "stop", 0) for i in range(len(raw))]
    return Group(group_id, Prompt(uid=f"t/train/{group_id}", answer="a", text="q"), (1,), completions,
                 list(raw), list(raw))


def accumulator(p: int = 2, enabled: bool = True, **overrides) -> DynamicSamplingAccumulator:
    options = dict(max_gen_rounds=3, on_exhausted="raise", min_step_batch_fraction=1.0, surplus="discard")
    options.update(overrides)
    return DynamicSamplingAccumulator(p, GroupFilter(enabled), **options)


class Ids:
    """Fresh group ids, as the dispatcher assigns them."""

    def __init__(self) -> None:
        self.next = 0

    def groups(self, *rewards: list[float]) -> list[Group]:
        made = [make_group(self.next + i, r) for i, r in enumerate(rewards)]
        self.next += len(rewards)
        return made


def test_runs_exactly_max_gen_rounds_then_raises():
    ids, acc = Ids(), accumulator(max_gen_rounds=3)
    rounds = 0
    while acc.can_generate_more:
        acc.add_round(ids.groups([1.0, 1.0], [0.0, 0.0]))
        rounds += 1
    assert rounds == 3 == acc.rounds
    with pytest.raises(RuntimeError, match="no round may be added"):
        acc.add_round(ids.groups([1.0, 0.0]))
    with pytest.raises(DynamicSamplingExhausted):
        acc.finish()


def test_exhaustion_message_gives_rounds_counts_split_and_fixes():
    ids, acc = Ids(), accumulator(p=4, max_gen_rounds=2)
    acc.add_round(ids.groups([1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.0]))
    acc.add_round(ids.groups([1.0, 1.0], [0.5, 0.5], [0.0, 1.0], [1.0, 1.0]))
    with pytest.raises(DynamicSamplingExhausted) as err:
        acc.finish()
    message = str(err.value)
    assert "kept 2 of 4 groups after 2 of max_gen_rounds=2" in message
    assert "8 groups generated, 6 zero-variance (75%)" in message
    assert "4 all-max (50%" in message and "1 all-min (12%" in message
    assert "1 (12%) with another reward shared by the whole group" in message  # the [0.5, 0.5] group
    for fix in ("max_gen_rounds", "batch_multiplier", "on_exhausted=train_short", "entropy_coef", "data"):
        assert fix in message


def test_complete_step_trains_first_p_kept_groups_in_round_order():
    ids, acc = Ids(), accumulator(p=3)
    first = ids.groups([1.0, 0.0], [1.0, 1.0], [0.0, 1.0])
    second = ids.groups([0.0, 0.0], [0.2, 0.4], [0.1, 0.9])
    acc.add_round(first)
    assert not acc.is_complete and acc.groups_needed == 1
    acc.add_round(second)
    assert acc.is_complete and not acc.can_generate_more
    selection = acc.finish()
    assert [g.group_id for g in selection.trained] == [0, 2, 4]
    assert [g.group_id for g in selection.surplus] == [5]
    assert selection.carry_over == []
    assert selection.tally.discarded_valid_groups == 1


@pytest.mark.parametrize("kept_rounds, trains", [(2, True), (1, False)])
def test_train_short_trains_only_at_or_above_the_floor(kept_rounds, trains):
    ids = Ids()
    acc = accumulator(p=4, max_gen_rounds=2, on_exhausted="train_short", min_step_batch_fraction=0.5)
    for k in range(2):
        acc.add_round(ids.groups([1.0, 0.0] if k < kept_rounds else [1.0, 1.0], [0.0, 0.0]))
    if trains:
        selection = acc.finish()
        assert [g.group_id for g in selection.trained] == [0, 2]
        assert selection.tally.groups_trained == 2
    else:
        with pytest.raises(DynamicSamplingExhausted, match=r"ceil\(P x min_step_batch_fraction\) = 2"):
            acc.finish()



def test_carry_moves_surplus_to_the_next_step_and_counts_it_on_both_sides():
    ids = Ids()
    step1 = accumulator(p=2, surplus="carry")
    step1.add_round(ids.groups([1.0, 0.0], [0.0, 1.0], [0.5, 0.0], [0.0, 0.0]))
    sel1 = step1.finish()
    assert [g.group_id for g in sel1.carry_over] == [2]
    assert sel1.tally.carried_out_groups == 1 and sel1.tally.discarded_valid_groups == 0

    step2 = accumulator(p=2, surplus="carry", carried_in=sel1.carry_over)
    assert step2.groups_needed == 1
    step2.add_round(ids.groups([1.0, 1.0], [0.25, 0.75]))
    sel2 = step2.finish()
    assert [g.group_id for g in sel2.trained] == [2, 5]
    metrics = sel2.tally.metrics()
    assert metrics["ds/carried_groups"] == 1.0
    # unfiltered mean covers only this step's generated rows, not the carried group generated earlier
    assert metrics["reward/unfiltered_mean"] == pytest.approx((1 + 1 + 0.25 + 0.75) / 4)
    assert metrics["reward/trained_mean"] == pytest.approx((0.5 + 0 + 0.25 + 0.75) / 4)


def test_more_carried_in_than_p_completes_without_generating_and_recarries_the_rest():
    carried = [make_group(i, [1.0, 0.0]) for i in range(3)]
    acc = accumulator(p=2, surplus="carry", carried_in=carried)
    assert acc.is_complete and not acc.can_generate_more
    selection = acc.finish()
    assert [g.group_id for g in selection.trained] == [0, 1]
    assert [g.group_id for g in selection.carry_over] == [2]
    assert selection.tally.carried_groups == 2 and selection.tally.carried_in_groups == 3
    assert math.isnan(selection.tally.metrics()["reward/unfiltered_mean"])


def test_disabled_keeps_zero_variance_groups_but_still_counts_them():
    ids, acc = Ids(), accumulator(p=3, enabled=False, max_gen_rounds=1)
    acc.add_round(ids.groups([1.0, 1.0], [0.0, 0.0], [1.0, 0.0]))
    selection = acc.finish()
    assert [g.group_id for g in selection.trained] == [0, 1, 2]
    metrics = selection.tally.metrics()
    assert metrics["ds/groups_filtered"] == 0.0
    assert metrics["ds/zero_variance_fraction"] == pytest.approx(2 / 3)
    assert metrics["ds/zero_variance_max_fraction"] == pytest.approx(1 / 3)


def test_lone_correct_answer_is_kept_whole_and_gets_credit_with_leave_one_out():
    acc = accumulator(p=1)
    acc.add_round([make_group(0, [1.0, 0.0, 0.0, 0.0])])
    (group,) = acc.finish().trained
    assert group.raw_rewards == [1.0, 0.0, 0.0, 0.0]
    adv = group_advantages(group.rewards, "leave_one_out", normalize=True)
    assert adv[0] > 0 and all(a < 0 for a in adv[1:])


def test_group_of_two_with_leave_one_out_trains_with_nonzero_advantages():
    acc = accumulator(p=2)
    acc.add_round([make_group(0, [1.0, 0.0]), make_group(1, [0.0, 0.0]), make_group(2, [0.0, 1.0])])
    selection = acc.finish()
    advantages = [group_advantages(g.rewards, "leave_one_out", normalize=True) for g in selection.trained]
    assert advantages == [pytest.approx([2.0, -2.0], rel=1e-5), pytest.approx([-2.0, 2.0], rel=1e-5)]


@pytest.mark.parametrize(
    "groups, message",
    [
        ([make_group(0, [1.0, 0.0]), make_group(0, [1.0, 0.0])], "group ids \\[0\\] were already seen"),
        ([make_group(0, [1.0])], "needs G >= 2"),
        ([make_group(0, [1.0, float("inf")])], "non-finite"),
    ],
)
def test_bad_rounds_are_rejected_before_anything_is_recorded(groups, message):
    acc = accumulator()
    with pytest.raises(ValueError, match=message):
        acc.add_round(groups)
    assert acc.rounds == 0 and acc.num_kept == 0


def test_finish_twice_raises():
    acc = accumulator(p=1)
    acc.add_round([make_group(0, [1.0, 0.0])])
    acc.finish()
    with pytest.raises(RuntimeError, match="already called"):
        acc.finish()


def test_unbalanced_tally_is_detected():
    tally = StepTally()
    tally.record_generated(make_group(0, [1.0, 0.0]), None)
    with pytest.raises(AssertionError, match="generated 1 \\+ carried in 0 = 1"):
        tally.check_balance()


round_strategy = st.lists(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=2, max_size=4), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(
    p=st.integers(1, 5),
    max_rounds=st.integers(1, 4),
    surplus=st.sampled_from(["discard", "carry"]),
    enabled=st.booleans(),
    steps=st.lists(st.lists(round_strategy, min_size=1, max_size=4), min_size=1, max_size=3),
)
def test_every_group_ends_in_exactly_one_place(p, max_rounds, surplus, enabled, steps):
    ids, carried = Ids(), []
    for rounds in steps:
        acc = DynamicSamplingAccumulator(p, GroupFilter(enabled), max_rounds, "train_short", 0.01, surplus,
                                         carried_in=carried)  # fmt: skip
        kept_ids = [g.group_id for g in carried]
        generated = filtered = 0
        for rewards in rounds:
            if not acc.can_generate_more:
                break
            groups = ids.groups(*rewards)
            acc.add_round(groups)
            generated += len(groups)
            for g in groups:
                if enabled and len(set(g.raw_rewards)) == 1:
                    filtered += 1
                else:
                    kept_ids.append(g.group_id)
        if not kept_ids:
            with pytest.raises(DynamicSamplingExhausted):
                acc.finish()
            return
        selection = acc.finish()
        t = selection.tally
        assert [g.group_id for g in selection.trained] == kept_ids[:p]
        assert [g.group_id for g in selection.surplus] == kept_ids[p:]
        assert (t.groups_generated, t.groups_filtered) == (generated, filtered)
        assert t.groups_generated == (
            t.groups_filtered + t.groups_trained - t.carried_in_groups + t.discarded_valid_groups
            + t.carried_out_groups
        )
        assert t.carried_in_groups == len(carried)
        carried = selection.carry_over
