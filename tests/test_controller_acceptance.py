"""The over-credit bug's acceptance checks (docs/design.md), driven through the REAL controller with scripted fakes.

Invariants pinned (invariants 4 and 5 in docs/design.md):
- a loss during a non-final chunk never excuses already-selected work: two drops while step 0's first
  3-group chunk trains → shortfalls {0: 1, 1: 1}, two optimizer steps of 3 groups each, clean exhaustion;
  one drop → step 0 closes at 3, step 1 is full (4);
- a loss during an already-final chunk is charged to the next step;
- stamped in_order losses stay on their stamped step (even when the assembling step has open slots);
- windowed charges nothing and closes its last step short at exhaustion (above the floor), and raises below it;
- a custom sampler's explicit charge decision is honoured; a custom sampler without the protocol gets the
  gated defaults (spare pool on, loss charged to the assembling step);
- a custom sampler whose charge decision is not a step number (2.5, a string, -1, a bool) stops the run with a
  SamplerProtocolError naming the sampler, the call and the prompt; no fate records the bad step;
- every closed step balances: selected + charged == P.
"""

from __future__ import annotations

import asyncio

import pytest
from fakes import Outcome, RecordingTrainer, ScriptedRollouts, make_loader, run_virtual
from fakes.settings import controller_settings, failure_settings

from groupwise.config import sampler_config
from groupwise.controller.controller import build_controller
from groupwise.controller.fate_records import FateRecord
from groupwise.controller.ledger import StepBelowFloorError
from groupwise.controller.samplers.base import SamplerProtocolError
from groupwise.controller.settings import ControllerSettings

G = 2


def settings(sampler: str, knobs: dict, **overrides) -> ControllerSettings:
    failure = overrides.pop("failure", None) or failure_settings(
        on_dropped_prompt="shrink",
        max_data_attempts_per_prompt=1,
        max_skipped_prompts=10,
        min_step_batch_fraction=0.5,
    )
    base = dict(
        prompts_per_step=4,
        group_size=G,
        sampler=sampler_config(sampler, **knobs),
        min_groups_for_streaming_train=3,
        max_buffered_rollouts=16,
        max_inflight_prompts=16,
        failure=failure,
        dynamic_sampling=False,
    )
    base.update(overrides)
    return controller_settings(**base)


class ChargeWatcher:
    """An on_fate hook that remembers where losses were charged and can wait for N of them."""

    def __init__(self) -> None:
        self.records: list[FateRecord] = []
        self.charged_steps: list[int | None] = []
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def __call__(self, record: FateRecord) -> None:
        self.records.append(record)
        if record.resolution in ("charged", "uncharged"):
            self.charged_steps.append(record.step)
            for n, fut in self._waiters:
                if len(self.charged_steps) >= n and not fut.done():
                    fut.set_result(None)

    async def wait_for_losses(self, n: int) -> None:
        if len(self.charged_steps) >= n:
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        await fut


def reviewer_rollouts(failing: list[str]) -> ScriptedRollouts:
    # p0-p2 finish first (the 3-group chunk), p3 is slow, lookahead prompts p4.. finish later or fail.
    script = {f"p{i}": [Outcome(latency=1.0)] for i in range(3)}
    script["p3"] = [Outcome(latency=10.0)]
    for i in range(4, 8):
        uid = f"p{i}"
        script[uid] = [Outcome(latency=3.0, fail="data")] if uid in failing else [Outcome(latency=5.0)]
    return ScriptedRollouts(group_size=G, script=script)


def run_reviewer_case(failing: list[str]):
    watcher = ChargeWatcher()

    async def hold_first_chunk(step: int, index: int) -> None:
        if step == 0 and index == 0:
            await watcher.wait_for_losses(len(failing))

    trainer = RecordingTrainer(before_chunk=hold_first_chunk)
    rollouts = reviewer_rollouts(failing)
    controller = build_controller(
        settings("ready_first", {"max_staleness_versions": 1}), make_loader(8), rollouts, trainer, on_fate=watcher
    )
    summary = run_virtual(controller.run)
    return summary, trainer, watcher, controller


def test_two_drops_during_first_chunk_charge_one_loss_to_each_step():
    summary, trainer, watcher, controller = run_reviewer_case(["p4", "p5"])
    assert watcher.charged_steps == [0, 1]
    assert controller.ledger.shortfalls() == {0: 1, 1: 1}
    assert trainer.finished == [0, 1]
    assert trainer.groups_per_step() == {0: 3, 1: 3}
    assert trainer.uids_per_step()[0] == ["p0", "p1", "p2"]
    assert sorted(trainer.uids_per_step()[1]) == ["p3", "p6", "p7"]
    assert summary.stop_reason == "exhausted"
    assert [(r.selected, r.charged) for r in summary.ledger_history] == [(3, 1), (3, 1)]
    assert summary.pending_charges == []


def test_one_drop_closes_step_zero_at_three_and_keeps_step_one_full():
    summary, trainer, watcher, controller = run_reviewer_case(["p4"])
    assert watcher.charged_steps == [0]
    assert controller.ledger.shortfalls() == {0: 1}
    assert trainer.groups_per_step() == {0: 3, 1: 4}
    assert summary.stop_reason == "exhausted"
    assert [(r.selected, r.charged) for r in summary.ledger_history] == [(3, 1), (4, 0)]


def test_loss_during_an_already_final_chunk_goes_to_the_next_step():
    # Step 0 is fully selected (3 + 1) before p5 fails; the loss must land on step 1.
    watcher = ChargeWatcher()
    script = {f"p{i}": [Outcome(latency=1.0)] for i in range(3)}
    script["p3"] = [Outcome(latency=2.0)]
    script.update({f"p{i}": [Outcome(latency=5.0)] for i in (4, 6, 7)})
    script["p5"] = [Outcome(latency=4.0, fail="data")]

    async def hold_final_chunk(step: int, index: int) -> None:
        if step == 0 and index == 1:
            await watcher.wait_for_losses(1)

    trainer = RecordingTrainer(before_chunk=hold_final_chunk)
    controller = build_controller(
        settings("ready_first", {"max_staleness_versions": 1}),
        make_loader(8),
        ScriptedRollouts(group_size=G, script=script),
        trainer,
        on_fate=watcher,
    )
    summary = run_virtual(controller.run)
    assert trainer.chunk_sizes(0) == [3, 1]
    assert watcher.charged_steps == [1]
    assert trainer.groups_per_step() == {0: 4, 1: 3}
    assert [(r.selected, r.charged) for r in summary.ledger_history] == [(4, 0), (3, 1)]


def test_stamped_in_order_loss_stays_on_its_stamped_step():
    # p5 (batch 1, stamped step 1) fails while step 0 is still assembling with an open slot (p3 is slow).
    watcher = ChargeWatcher()
    script = {"p3": [Outcome(latency=6.0)], "p5": [Outcome(latency=2.0, fail="data")]}
    trainer = RecordingTrainer()
    controller = build_controller(
        settings("in_order", {"max_lookahead_versions": 1}),
        make_loader(8),
        ScriptedRollouts(group_size=G, script=script),
        trainer,
        on_fate=watcher,
    )
    summary = run_virtual(controller.run)
    assert watcher.charged_steps == [1]
    assert trainer.uids_per_step() == {0: ["p0", "p1", "p2", "p3"], 1: ["p4", "p6", "p7"]}
    assert [(r.selected, r.charged) for r in summary.ledger_history] == [(4, 0), (3, 1)]


def test_windowed_charges_nothing_and_closes_short_above_the_floor():
    watcher = ChargeWatcher()
    script = {"p2": [Outcome(latency=2.0, fail="data")]}
    trainer = RecordingTrainer()
    controller = build_controller(
        settings("windowed", {"max_staleness_versions": 4}, min_groups_for_streaming_train=4),
        make_loader(8),
        ScriptedRollouts(group_size=G, script=script),
        trainer,
        on_fate=watcher,
    )
    summary = run_virtual(controller.run)
    assert watcher.charged_steps == [None]
    assert controller.ledger.shortfalls() == {}
    assert trainer.groups_per_step() == {0: 4, 1: 3}
    last = summary.ledger_history[-1]
    assert (last.selected, last.charged, last.unfilled) == (3, 0, 1)
    assert summary.stop_reason == "exhausted"


def test_windowed_last_step_below_the_floor_raises():
    script = {f"p{i}": [Outcome(latency=2.0, fail="data")] for i in (5, 6, 7)}
    controller = build_controller(
        settings("windowed", {"max_staleness_versions": 4}, min_groups_for_streaming_train=4),
        make_loader(8),
        ScriptedRollouts(group_size=G, script=script),
        RecordingTrainer(),
    )
    with pytest.raises(StepBelowFloorError, match="floor 2"):
        run_virtual(controller.run)


def test_custom_sampler_explicit_charge_is_honoured():
    # The fake sampler charges every loss to assembling + 1, even while the assembling step has room.
    watcher = ChargeWatcher()
    # p0 is selected alone at t=1; p1 fails at t=2 while step 0 still has 3 open slots; the rest finish at t=3.
    script = {"p0": [Outcome(latency=1.0)], "p1": [Outcome(latency=2.0, fail="data")]}
    trainer = RecordingTrainer()
    controller = build_controller(
        settings(
            "custom", {"target": "fakes.samplers:ChargeNextStepSampler", "kwargs": {}}, min_groups_for_streaming_train=1
        ),
        make_loader(12),
        ScriptedRollouts(group_size=G, script=script, default=Outcome(latency=3.0)),
        trainer,
        on_fate=watcher,
    )
    summary = run_virtual(controller.run)
    assert watcher.charged_steps == [1]
    assert [(r.selected, r.charged) for r in summary.ledger_history] == [(4, 0), (3, 1), (4, 0)]


def test_custom_sampler_without_protocol_gets_gated_defaults():
    # A plain ready-first-like custom sampler: the loss shrinks the assembling step, a spare pool is used.
    watcher = ChargeWatcher()
    # p0, p2, p3 form step 0's first chunk at t=1; p1 fails at t=2 while step 0 has one open slot.
    script = {uid: [Outcome(latency=1.0)] for uid in ("p0", "p2", "p3")}
    script["p1"] = [Outcome(latency=2.0, fail="data")]
    controller = build_controller(
        settings("custom", {"target": "fakes.samplers:PlainReadyFirst", "kwargs": {"window": 1}}),
        make_loader(8),
        ScriptedRollouts(group_size=G, script=script, default=Outcome(latency=3.0)),
        RecordingTrainer(),
        on_fate=watcher,
    )
    summary = run_virtual(controller.run)
    assert controller.ctx.accounting.uses_replacement_pool is True
    assert controller.ctx.accounting.closes_short_at_exhaustion is False
    assert watcher.charged_steps == [0]
    assert [(r.selected, r.charged) for r in summary.ledger_history] == [(3, 1), (4, 0)]


@pytest.mark.parametrize("bad", [2.5, "next", -1, True])
def test_custom_sampler_charge_decision_must_be_a_step_number(bad):
    watcher = ChargeWatcher()
    controller = build_controller(
        settings("custom", {"target": "fakes.samplers:ChargeAnything", "kwargs": {"charge": bad}}),
        make_loader(8),
        ScriptedRollouts(group_size=G, script={"p1": [Outcome(latency=2.0, fail="data")]}),
        RecordingTrainer(),
        on_fate=watcher,
    )
    with pytest.raises(SamplerProtocolError, match=r"sampler fakes\.samplers:ChargeAnything returned") as info:
        run_virtual(controller.run)
    assert f"returned {bad!r} ({type(bad).__name__}) from charge_step_for_lost_group" in str(info.value)
    assert "an int >= 0" in str(info.value) and any("prompt 'p1'" in n for n in info.value.__notes__)
    # The lost attempt is recorded as the fatal end of the run, never with the bad step.
    lost = [r for r in watcher.records if r.prompt_uid == "p1"]
    assert [(r.fate, r.resolution, r.step) for r in lost] == [("failed", "fatal", None)]
    assert all(r.step is None or isinstance(r.step, int) for r in watcher.records)
