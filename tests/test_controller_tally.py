"""StepTallyBook: which step a finished group's rewards are tallied to.

Invariants pinned:
- a stamped group counts toward its target step while that step is open, even if another step is being
  assembled; once its step has closed it counts toward the assembling step and is reported as late;
- an unstamped group counts toward the step being assembled when it finished;
- the book decides each group once with the run's filter: zero-variance groups are counted (and dropped and
  counted as filtered only when dynamic sampling is on), and the filter's reward range splits them into all-max and
  all-min; the unfiltered mean covers every generated row, the trained mean only the trained rows; a step's tally
  is emitted once.
"""

from __future__ import annotations

import pytest

from groupwise.algo.filter import GroupFilter
from groupwise.controller.ledger import StepLedger
from groupwise.controller.step_tally import StepTallyBook
from groupwise.types import Completion, Group, Prompt


def group(gid: int, rewards: list[float], target: int | None = None) -> Group:
    comps = [Completion((1,), (-0.1,), "x", "stop", 0) for _ in rewards]
    return Group(gid, Prompt(uid=f"u{gid}", answer=""), (1,), comps, rewards, rewards, target_step=target)


def test_tally_step_rules_and_metrics():
    ledger = StepLedger(2, 0.5)
    book = StepTallyBook(ledger, GroupFilter(enabled=True))
    assert book.record_generated(group(0, [0.0, 1.0], target=1)) == (1, False)
    assert book.record_generated(group(1, [1.0, 1.0])) == (0, True)
    ledger.record_selected(0, 2)
    ledger.close(0)
    assert book.record_generated(group(2, [0.0, 0.0], target=0)) == (1, True)
    book.record_trained(1, [group(0, [0.0, 1.0], target=1)])
    m0 = book.pop_metrics(0)
    assert (m0["ds/groups_generated"], m0["ds/groups_filtered"], m0["ds/zero_variance_max_fraction"]) == (1, 1, 1)
    m1 = book.pop_metrics(1)
    assert m1["ds/groups_generated"] == 2.0 and m1["ds/groups_filtered"] == 1.0
    assert m1["ds/late_tallied_groups"] == 1.0 and m1["ds/zero_variance_min_fraction"] == 0.5
    assert m1["reward/unfiltered_mean"] == pytest.approx(0.25) and m1["reward/trained_mean"] == 0.5
    assert book.pop_metrics(1)["ds/groups_generated"] == 0.0  # emitted once


def test_with_the_filter_off_a_zero_variance_group_is_counted_but_kept():
    book = StepTallyBook(StepLedger(2, 0.5), GroupFilter(enabled=False))
    assert book.record_generated(group(0, [0.0, 0.0])) == (0, False)
    metrics = book.pop_metrics(0)
    assert (metrics["ds/zero_variance_fraction"], metrics["ds/zero_variance_min_fraction"]) == (1.0, 1.0)
    assert metrics["ds/groups_filtered"] == 0.0


def test_the_reward_range_of_the_filter_tells_all_max_from_all_min():
    book = StepTallyBook(StepLedger(2, 0.5), GroupFilter(enabled=True, reward_low=-1.0, reward_high=1.0))
    assert book.record_generated(group(0, [-1.0, -1.0])) == (0, True)
    assert book.record_generated(group(1, [1.0, 1.0])) == (0, True)
    assert book.record_generated(group(2, [0.0, 0.0])) == (0, True)
    metrics = book.pop_metrics(0)
    assert metrics["ds/zero_variance_min_fraction"] == metrics["ds/zero_variance_max_fraction"] == pytest.approx(1 / 3)
