"""Rewards stay paired with their completions across dynamic-sampling rounds (docs/design.md: the misaligned
reward bug of per-key batch slicing), replayed on our types.

Every row carries an identifiable marker: raw reward = prompt × 10 + generation, completion text
"p<prompt>g<gen>". Pins: (1) one round, one zero-variance group dropped: the trained batch's reward column
is the kept groups' rewards, in order, row-aligned with the completions; over-generation slices whole
groups, never a prefix of the unfiltered rewards; (2) two rounds fill the step after round one drops a group:
the trained rewards are exactly the kept groups', in order, and the JSONL lines pair each completion with
its own reward; (3) reward/unfiltered_mean is the mean over every row generated in every round, and
differs from reward/trained_mean when something was filtered.
"""

import json
import statistics

import pytest

from groupwise.algo.accumulator import DynamicSamplingAccumulator
from groupwise.algo.filter import GroupFilter
from groupwise.batch import RowBatch
from groupwise.run.jsonl import write_rows_jsonl
from groupwise.types import Completion, Group, Prompt


def marked_group(prompt: int, zero_variance: bool = False) -> Group:
    """Two completions of prompt ``prompt``; rewards prompt×10 + gen (both prompt×10 if zero_variance)."""
    rewards = [float(prompt * 10 + (0 if zero_variance else gen)) for gen in range(2)]
    completions = [Completion((prompt, gen), (-0.1, -0.2), f"p{prompt}g{gen}", "stop", 0) for gen in range(2)]
    return Group(prompt, Prompt(uid=f"seed/train/{prompt}", answer="", text=f"p{prompt}"), (prompt,),
                 completions, rewards, rewards)


def trained_rows(groups: list[Group]) -> RowBatch:
    batch = RowBatch.from_groups(groups)
    batch["text"] = [c.text for g in groups for c in g.completions]
    return batch


def new_accumulator(p: int) -> DynamicSamplingAccumulator:
    return DynamicSamplingAccumulator(p, GroupFilter(enabled=True), 4, "raise", 1.0, "discard")


def assert_rows_carry_their_own_reward(batch: RowBatch) -> None:
    for text, reward in zip(batch["text"], batch["raw_reward"], strict=True):
        prompt, gen = (int(x) for x in text[1:].split("g"))
        assert reward == prompt * 10 + gen, f"row {text} carries reward {reward}"


def test_case1_one_round_drops_a_zero_variance_group_and_rewards_stay_aligned():
    acc = new_accumulator(2)
    acc.add_round([marked_group(1), marked_group(2, zero_variance=True), marked_group(3)])
    selection = acc.finish()
    batch = trained_rows(selection.trained)
    assert batch["raw_reward"] == (10.0, 11.0, 30.0, 31.0)
    assert batch["text"] == ("p1g0", "p1g1", "p3g0", "p3g1")
    assert_rows_carry_their_own_reward(batch)


def test_case1_over_generation_keeps_first_whole_kept_groups_not_an_unfiltered_prefix():
    acc = new_accumulator(2)
    acc.add_round([marked_group(1), marked_group(2, zero_variance=True), marked_group(3), marked_group(4)])
    selection = acc.finish()
    batch = trained_rows(selection.trained)
    # Slicing the unfiltered reward column on its own (per key) would give [10, 11, 20, 20].
    assert batch["raw_reward"] == (10.0, 11.0, 30.0, 31.0)
    assert [g.group_id for g in selection.surplus] == [4]
    assert selection.tally.discarded_valid_groups == 1


def test_case2_two_rounds_fill_the_step_with_exactly_the_kept_groups(tmp_path):
    acc = new_accumulator(3)
    acc.add_round([marked_group(1), marked_group(2, zero_variance=True)])
    assert acc.can_generate_more and acc.groups_needed == 2
    acc.add_round([marked_group(3), marked_group(4)])
    selection = acc.finish()
    batch = trained_rows(selection.trained)
    assert batch["raw_reward"] == (10.0, 11.0, 30.0, 31.0, 40.0, 41.0)
    assert_rows_carry_their_own_reward(batch)

    path = tmp_path / "train_data" / "step_0.jsonl"
    write_rows_jsonl(path, {"content": batch["text"], "rewards": batch["raw_reward"]})
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["content"], r["rewards"]) for r in lines] == list(zip(batch["text"], batch["raw_reward"], strict=True))

    tally = selection.tally
    with pytest.raises(ValueError, match="different row counts"):
        write_rows_jsonl(tmp_path / "bad.jsonl", {
            "content": batch["text"], "rewards": [r for g in tally.generated_raw_rewards for r in g]})


def test_case3_unfiltered_metric_covers_every_generated_row_of_every_round():
    acc = new_accumulator(3)
    round1 = [marked_group(1), marked_group(2, zero_variance=True)]
    round2 = [marked_group(3), marked_group(4)]
    acc.add_round(round1)
    acc.add_round(round2)
    metrics = acc.finish().tally.metrics()
    every_row = [r for g in round1 + round2 for r in g.raw_rewards]
    trained = [r for g in (round1[0], *round2) for r in g.raw_rewards]
    assert metrics["reward/unfiltered_mean"] == pytest.approx(statistics.mean(every_row))
    assert metrics["reward/trained_mean"] == pytest.approx(statistics.mean(trained))
    assert metrics["reward/unfiltered_mean"] != metrics["reward/trained_mean"]
    # not the last round only (the usual fix of the bug) and not a prefix of the concatenated rounds
    assert metrics["reward/unfiltered_mean"] != pytest.approx(statistics.mean(r for g in round2 for r in g.raw_rewards))
    assert metrics["reward/unfiltered_mean"] != pytest.approx(statistics.mean(every_row[: len(trained)]))
    assert metrics["ds/gen_rounds"] == 2.0 and metrics["ds/groups_filtered"] == 1.0


def test_case3_metrics_agree_when_nothing_was_filtered():
    acc = new_accumulator(2)
    acc.add_round([marked_group(1), marked_group(3)])
    metrics = acc.finish().tally.metrics()
    assert metrics["reward/unfiltered_mean"] == metrics["reward/trained_mean"]
