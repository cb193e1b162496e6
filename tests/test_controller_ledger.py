"""StepLedger, SparePool and failure handling.

Invariants pinned:
- open(s) = P − selected − charged; selecting beyond the open slots is an invariant error;
- a floating loss takes the first step ≥ the assembling one with an open slot, so credits never excuse
  selected work (the over-credit sequence of docs/design.md at ledger level: {0: 1, 1: 1});
- a pinned loss stays on its step even when the assembling step has room; one for a closed step is a late
  loss (counted, no effect); one with no open slot is an invariant error; None charges nothing;
- floor = ceil(P × fraction): 128 @ 0.9 → 12 drops fine, the 13th raises naming step, drops, floor and
  fraction; 4 @ 0.9 → the first drop raises; 1.0 forbids shrinking; a fraction of 0 is refused (the floor's
  formula itself is pinned in test_algo_step_size);
- close asserts selected + charged == P; close_short needs selected ≥ floor and records the unfilled rest;
  closing prunes only the closed step, later steps' charges are carried;
- SparePool: FIFO, low-water mark, take_many takes the oldest and leaves the rest, state round trip;
- failures: infra vs data classification through __cause__ chains (depth 8), registered runtime types,
  backoff min(base·2^(k−1), max), per-prompt budgets, skip and consecutive-drop run budgets.
"""

from __future__ import annotations

import pytest
from fakes.settings import failure_settings

from groupwise.controller.failures import (
    FailureBudgets,
    InfraError,
    PromptAttempts,
    RolloutDataFailure,
    RolloutRedispatchExhausted,
    backoff_seconds,
    classify_failure,
    register_infra_error_type,
)
from groupwise.controller.ledger import LedgerInvariantError, StepBelowFloorError, StepLedger
from groupwise.controller.spare_pool import SparePool


def test_floating_losses_never_excuse_selected_work():
    ledger = StepLedger(4, 0.5)
    ledger.record_selected(0, 3)
    assert ledger.charge_loss(0, pinned=False) == 0
    assert ledger.charge_loss(0, pinned=False) == 1
    assert ledger.open_slots(0) == 0 and ledger.open_slots(1) == 3
    assert ledger.shortfalls() == {0: 1, 1: 1}
    with pytest.raises(LedgerInvariantError, match="only 0 slots are open"):
        ledger.record_selected(0, 1)


def test_pinned_losses_stay_on_their_step():
    ledger = StepLedger(4, 0.5)
    assert ledger.charge_loss(2, pinned=True) == 2
    assert ledger.open_slots(0) == 4
    assert ledger.charge_loss(None, pinned=True) is None
    ledger.record_selected(0, 4)
    ledger.close(0)
    assert ledger.charge_loss(0, pinned=True) is None and ledger.late_losses == 1
    ledger.record_selected(1, 4)
    with pytest.raises(LedgerInvariantError, match="pinned to step 1 found no open slot"):
        ledger.charge_loss(1, pinned=True)


def test_floor_boundaries():
    big = StepLedger(128, 0.9)
    assert big.floor == 116
    for _ in range(12):
        big.charge_loss(0, pinned=True)
    with pytest.raises(StepBelowFloorError, match=r"step 0 lost 13 of its 128.*floor 116.*0\.9"):
        big.charge_loss(0, pinned=True)
    with pytest.raises(StepBelowFloorError):
        StepLedger(4, 0.9).charge_loss(0, pinned=False)
    with pytest.raises(StepBelowFloorError):
        StepLedger(8, 1.0).charge_loss(0, pinned=True)
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        StepLedger(4, 0.0)


def test_close_asserts_balance_and_prunes_only_the_closed_step():
    ledger = StepLedger(4, 0.5)
    ledger.charge_loss(2, pinned=True)
    ledger.record_selected(0, 3)
    with pytest.raises(LedgerInvariantError, match="selected 3 \\+ charged 0 != P 4"):
        ledger.close(0)
    ledger.charge_loss(0, pinned=False)
    rec = ledger.close(0)
    assert (rec.step, rec.selected, rec.charged, rec.closed) == (0, 3, 1, True)
    assert ledger.assembling == 1 and ledger.is_closed(0)
    assert ledger.open_slots(2) == 3  # carried, not pruned
    with pytest.raises(LedgerInvariantError, match="closing step 2 while step 1"):
        ledger.close(2)


def test_close_short_requires_the_floor():
    ledger = StepLedger(4, 0.5)
    ledger.record_selected(0, 1)
    with pytest.raises(StepBelowFloorError, match="holding 1 prompt groups, below the floor 2"):
        ledger.close_short(0)
    ledger.record_selected(0, 2)
    rec = ledger.close_short(0)
    assert (rec.selected, rec.unfilled) == (3, 1)


def test_spare_pool_fifo_mark_take_and_state():
    pool: SparePool[str] = SparePool(low_water_mark=3)
    assert pool.needs_refill()
    pool.add_batch(["a", "b"])
    assert pool.needs_refill()
    pool.add_batch(["c", "d", "e"])
    assert not pool.needs_refill()
    assert pool.take() == "a"
    assert pool.take_many(4) == ["b", "c", "d", "e"]
    assert pool.take() is None
    pool.add_batch(["x", "y", "z"])
    assert pool.take_many(2) == ["x", "y"]
    restored: SparePool[str] = SparePool(3)
    restored.load_state_dict(pool.state_dict())
    assert restored.discard_leftover() == ["z"] and len(restored) == 0


class WrappedRayError(Exception):
    pass


def test_classification_follows_causes_to_depth_eight():
    assert classify_failure(TimeoutError()) == "infra"
    assert classify_failure(ConnectionResetError()) == "infra"
    assert classify_failure(InfraError()) == "infra"
    assert classify_failure(KeyError("x")) == "data"

    def chain(depth: int) -> Exception:
        error: Exception = TimeoutError("root")
        for i in range(depth):
            outer = ValueError(f"wrap {i}")
            outer.__cause__ = error
            error = outer
        return error

    assert classify_failure(chain(8)) == "infra"
    assert classify_failure(chain(9)) == "data"
    assert classify_failure(WrappedRayError()) == "data"
    register_infra_error_type(WrappedRayError)
    assert classify_failure(WrappedRayError()) == "infra"
    with pytest.raises(TypeError):
        register_infra_error_type("RayActorError")  # type: ignore[arg-type]


def test_backoff_is_exponential_and_capped():
    assert [backoff_seconds(k, 1.0, 5.0) for k in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 5.0]
    with pytest.raises(ValueError):
        backoff_seconds(0, 1.0, 5.0)


def test_infra_budget_then_consecutive_drops():
    budgets = FailureBudgets(
        failure_settings(
            max_infra_attempts_per_prompt=3, backoff_base_s=1.0, max_backoff_s=30.0, max_consecutive_dropped_prompts=1
        )
    )
    first = PromptAttempts()
    assert budgets.on_failure(first, TimeoutError(), "p0") == 1.0
    assert budgets.on_failure(first, TimeoutError(), "p0") == 2.0
    assert budgets.on_failure(first, TimeoutError(), "p0") is None  # dropped (1 in a row is allowed)
    budgets.on_progress()  # a committed or filtered group resets the streak
    assert budgets.on_failure(PromptAttempts(infra=2), TimeoutError(), "p1") is None
    with pytest.raises(RolloutRedispatchExhausted, match="p2: .*2 prompts in a row"):
        budgets.on_failure(PromptAttempts(infra=2), TimeoutError(), "p2")


def test_data_budget_then_skip_budget():
    budgets = FailureBudgets(failure_settings(max_data_attempts_per_prompt=2, max_skipped_prompts=1))
    attempts = PromptAttempts()
    assert budgets.on_failure(attempts, KeyError("bad"), "p0") == 0.0  # immediate retry
    assert budgets.on_failure(attempts, KeyError("bad"), "p0") is None  # skipped (1 of 1)
    with pytest.raises(RolloutDataFailure, match="p1: failed 2 times") as info:
        budgets.on_failure(PromptAttempts(data=1), KeyError("worse"), "p1")
    assert isinstance(info.value.__cause__, KeyError)
    strict = FailureBudgets(failure_settings(max_data_attempts_per_prompt=1, max_skipped_prompts=0))
    with pytest.raises(KeyError, match="original"):
        strict.on_failure(PromptAttempts(), KeyError("original"), "p0")


def test_failure_settings_validation():
    with pytest.raises(ValueError, match="on_dropped_prompt"):
        failure_settings(on_dropped_prompt="drop")
    with pytest.raises(ValueError, match=r"max_data_attempts_per_prompt\n.*greater than or equal to 1"):
        failure_settings(max_data_attempts_per_prompt=0)
    with pytest.raises(ValueError, match="backoff_base_s <= max_backoff_s"):
        FailureBudgets(failure_settings(backoff_base_s=10.0, max_backoff_s=1.0))
