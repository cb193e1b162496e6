"""The rollout pump, driven through the real controller.

Covered: stamps (in_order stamps the dispatch index, weight_fifo none); capacity and in-flight bounds hold
and every permit comes back; resume top-up of a partially restored in_order step (the surplus prompt goes
back to the loader); replace: a spare stands in (no shortfall, replaced {0: 1}, stamps contiguous, the
partial leftover pool is not trained but counted); a failing replacement falls back to a charge within the
per-slot budget; borrow: a later step's READY group is promoted into the short step and the lender repaid by
the spare; nothing to borrow (lender in flight) → replace in place; never borrow without a spare (shrink);
windowed aborts only out-of-window in-flight attempts at sync; a prompt backing off before a retry when the
run stops gets a slot-less ``pending`` line, so its last line settles it (audit: pending, no conflict); a
fatal failure cancels every other rollout and surfaces with the prompt named; filtered groups consume no
failure budget and reset the consecutive-drop streak; ready_first diverts batches to the spare pool, windowed
never does; a rollout client that returns the wrong group id is refused.
"""

from __future__ import annotations

import asyncio

import pytest
from fakes import Outcome, RecordingTrainer, ScriptedRollouts, make_loader, run_virtual
from fakes.rollouts import ScriptedDataError
from fakes.settings import controller_settings, failure_settings

from groupwise.config import RolloutFailureSection, sampler_config
from groupwise.controller.buffer import GroupBuffer
from groupwise.controller.controller import build_controller
from groupwise.controller.fate_records import FateRecord
from groupwise.run.audit import audit_fates, prompt_outcome
from groupwise.types import Completion, Group

G = 2
ZERO = (1.0, 1.0)


def make(sampler, knobs, P, n_prompts, script=None, default=None, fates=None, trainer=None, state=None,
         rollouts=None, **kw):
    failure = kw.pop(
        "failure",
        failure_settings(
            on_dropped_prompt="shrink",
            min_step_batch_fraction=0.5,
            max_data_attempts_per_prompt=1,
            max_skipped_prompts=10,
        ),
    )
    cfg = controller_settings(
        prompts_per_step=P,
        group_size=G,
        sampler=sampler_config(sampler, **knobs),
        failure=failure,
        max_buffered_rollouts=kw.pop("capacity", 16),
        dynamic_sampling=kw.pop("ds", False),
        **kw,
    )
    rollouts = rollouts or ScriptedRollouts(group_size=G, script=script or {}, default=default or Outcome())
    trainer = trainer or RecordingTrainer()
    on_fate = fates.append if fates is not None else None
    controller = build_controller(cfg, make_loader(n_prompts), rollouts, trainer, on_fate=on_fate, state=state)
    return controller, rollouts, trainer


def replace(**kw) -> RolloutFailureSection:
    base = dict(
        on_dropped_prompt="replace",
        max_replacement_attempts=1,
        replacement_reserve_prompts=2,
        min_step_batch_fraction=0.5,
        max_data_attempts_per_prompt=1,
        max_skipped_prompts=10,
    )
    base.update(kw)
    return failure_settings(**base)


def test_in_order_stamps_dispatch_index_and_weight_fifo_none():
    controller, _, trainer = make("in_order", {"max_lookahead_versions": 1}, 2, 6)
    run_virtual(controller.run)
    assert [(c.step, [g.target_step for g in c.groups]) for c in trainer.chunks] == [
        (0, [0, 0]),
        (1, [1, 1]),
        (2, [2, 2]),
    ]
    controller, _, trainer = make("weight_fifo", {"max_staleness_versions": 1}, 2, 4)
    run_virtual(controller.run)
    assert all(g.target_step is None for c in trainer.chunks for g in c.groups)


class BoundsWatcher(ScriptedRollouts):
    """Records concurrency and buffer occupancy whenever a rollout starts."""

    controller = None
    max_concurrent = 0
    max_buffer = 0
    _running = 0

    async def rollout(self, prompt, group_id, attempt, start_version):
        self._running += 1
        self.max_concurrent = max(self.max_concurrent, self._running)
        self.max_buffer = max(self.max_buffer, len(self.controller.ctx.buffer))
        try:
            return await super().rollout(prompt, group_id, attempt, start_version)
        finally:
            self._running -= 1


def test_capacity_and_inflight_bounds_and_permits_come_back():
    cfg = controller_settings(
        prompts_per_step=2,
        group_size=G,
        sampler=sampler_config("windowed", max_staleness_versions=5),
        max_buffered_rollouts=3,
        max_inflight_prompts=2,
        dynamic_sampling=False,
        failure=failure_settings(min_step_batch_fraction=0.5),
    )
    rollouts = BoundsWatcher(group_size=G)
    controller = build_controller(cfg, make_loader(10), rollouts, RecordingTrainer(chunk_latency=10.0))
    rollouts.controller = controller
    summary = run_virtual(controller.run)
    assert summary.steps_trained == 5
    assert rollouts.max_concurrent == 2
    assert rollouts.max_buffer == 3
    assert controller.ctx.capacity.in_use == 0 and controller.rollout_pump.inflight.in_use == 0


def test_resume_tops_up_a_partially_restored_in_order_step():
    saved = GroupBuffer()
    sid = saved.reserve(0, target_step=0)
    comps = [Completion((1,), (-0.1,), "x", "stop", 0) for _ in range(G)]
    from groupwise.types import Prompt

    saved.commit(sid, Group(sid, Prompt(uid="restored", answer=""), (1,), comps, [0, 1], [0, 1]), 0)
    # A snapshot taken before anything ran, with one ready group of step 0 in its buffer.
    state = {**make("in_order", {"max_lookahead_versions": 1}, 4, 8)[0].state_dict(), "buffer": saved.state_dict()}
    controller, rollouts, trainer = make("in_order", {"max_lookahead_versions": 1}, 4, 8, state=state)
    summary = run_virtual(controller.run)
    assert trainer.uids_per_step() == {0: ["restored", "p0", "p1", "p2"], 1: ["p3", "p4", "p5", "p6"]}
    assert summary.unused_prompts == 1  # p7: a partial last batch cannot make a full in_order step
    assert all(call.group_id > sid for call in rollouts.calls)


def test_replace_spare_stands_in_and_leftover_pool_is_counted():
    controller, _, trainer = make(
        "in_order",
        {"max_lookahead_versions": 0},
        2,
        8,
        ds=True,
        script={"p1": [Outcome(rewards=ZERO)]},
        failure=replace(),
    )
    summary = run_virtual(controller.run)
    assert trainer.uids_per_step() == {0: ["p0", "p2"], 1: ["p4", "p5"], 2: ["p3", "p6"]}
    assert [(r.step, r.replaced, r.charged) for r in summary.ledger_history] == [(0, 1, 0), (1, 0, 0), (2, 0, 0)]
    assert [[g.target_step for g in c.groups] for c in trainer.chunks] == [[0, 0], [1, 1], [2, 2]]
    assert summary.unused_prompts == 1
    assert summary.fates.by_resolution[("filtered", "replaced")] == 1


def test_failing_replacement_falls_back_to_a_charge():
    fates: list[FateRecord] = []
    controller, _, trainer = make(
        "in_order",
        {"max_lookahead_versions": 0},
        2,
        8,
        ds=True,
        fates=fates,
        script={"p1": [Outcome(rewards=ZERO)], "p2": [Outcome(rewards=ZERO)]},
        failure=replace(max_replacement_attempts=1),
    )
    summary = run_virtual(controller.run)
    assert trainer.uids_per_step()[0] == ["p0"]
    assert (summary.ledger_history[0].selected, summary.ledger_history[0].charged) == (1, 1)
    assert [(r.prompt_uid, r.resolution, r.step) for r in fates if r.fate == "filtered"] == [
        ("p1", "replaced", None),
        ("p2", "charged", 0),
    ]


def test_borrow_promotes_a_later_ready_group_and_the_spare_repays_the_lender():
    script = {"p1": [Outcome(latency=2.0, rewards=ZERO)], "p4": [Outcome(latency=1.0)], "p5": [Outcome(latency=1.0)]}
    controller, _, trainer = make(
        "in_order", {"max_lookahead_versions": 1}, 2, 8, ds=True, script=script, failure=replace()
    )
    summary = run_virtual(controller.run)
    uids = trainer.uids_per_step()
    assert sorted(uids[0]) == ["p0", "p4"] and sorted(uids[1]) == ["p2", "p5"]
    assert [(r.step, r.promoted, r.replaced) for r in summary.ledger_history[:2]] == [(0, 1, 0), (1, 0, 1)]
    assert [g.target_step for g in trainer.chunks[0].groups] == [0, 0]


def test_in_flight_group_is_not_borrowed_and_shrink_never_borrows():
    slow_lookahead = {
        "p1": [Outcome(latency=2.0, rewards=ZERO)],
        "p4": [Outcome(latency=5.0)],
        "p5": [Outcome(latency=5.0)],
    }
    controller, _, trainer = make(
        "in_order", {"max_lookahead_versions": 1}, 2, 8, ds=True, script=slow_lookahead, failure=replace()
    )
    summary = run_virtual(controller.run)
    assert trainer.uids_per_step()[0] == ["p0", "p2"]  # replaced in place
    assert all(r.promoted == 0 for r in summary.ledger_history)
    ready_lookahead = {"p1": [Outcome(latency=2.0, rewards=ZERO)], "p4": [Outcome(latency=1.0)]}
    controller, _, trainer = make("in_order", {"max_lookahead_versions": 1}, 2, 4, ds=True, script=ready_lookahead)
    summary = run_virtual(controller.run)
    assert trainer.uids_per_step() == {0: ["p0"], 1: ["p2", "p3"]}
    assert [(r.selected, r.charged, r.promoted) for r in summary.ledger_history][0] == (1, 1, 0)


def test_windowed_aborts_only_out_of_window_inflight_attempts():
    fates: list[FateRecord] = []
    script = {"p0": [Outcome(latency=1.0)], "p1": [Outcome(latency=100.0)], "p2": [Outcome(latency=2.0)]}
    metrics = {}
    controller, rollouts, trainer = make(
        "windowed",
        {"max_staleness_versions": 0},
        1,
        4,
        script=script,
        fates=fates,
        capacity=3,
        min_groups_for_streaming_train=1,
    )
    controller.train_pump.on_step_end = lambda step, m, groups: metrics.__setitem__(step, m)
    summary = run_virtual(controller.run)
    assert sorted(r.prompt_uid for r in fates if r.fate == "aborted") == ["p1", "p2"]
    assert all(r.resolution == "uncharged" for r in fates if r.fate == "aborted")
    assert trainer.uids_per_step() == {0: ["p0"], 1: ["p3"]}
    assert [g.start_version for g in trainer.chunks[1].groups] == [1]
    assert metrics[0]["buffer/aborted_inflight_groups"] == 2.0 and summary.aborted_inflight_groups == 2


def test_fatal_failure_cancels_every_other_rollout_and_names_the_prompt():
    fates: list[FateRecord] = []
    script = {"p2": [Outcome(latency=1.0, fail="data")]}
    controller, rollouts, _ = make(
        "ready_first",
        {"max_staleness_versions": 1},
        4,
        8,
        script=script,
        fates=fates,
        default=Outcome(latency=50.0),
        failure=failure_settings(max_data_attempts_per_prompt=1, max_skipped_prompts=0),
    )
    with pytest.raises(ScriptedDataError) as info:
        run_virtual(controller.run)
    assert any("'p2'" in note for note in getattr(info.value, "__notes__", []))
    assert rollouts.finished == []  # every other rollout was cancelled, none ran to completion
    assert sorted(r.prompt_uid for r in fates if r.fate == "pending") == ["p0", "p1", "p3", "p4", "p5", "p6", "p7"]
    assert [(r.prompt_uid, r.resolution) for r in fates if r.fate == "failed"] == [("p2", "fatal")]


def test_a_prompt_backing_off_when_the_run_stops_ends_pending_without_a_slot():
    fates: list[FateRecord] = []
    # p2 (step 1's batch) fails with an infra error; its backoff outlasts step 0, which is the last step.
    script = {"p2": [Outcome(latency=1.0, fail="infra")]}
    failure = failure_settings(backoff_base_s=1000.0, max_backoff_s=1000.0, max_infra_attempts_per_prompt=5)
    controller, _, trainer = make(
        "in_order", {"max_lookahead_versions": 1}, 2, 8, script=script, fates=fates, failure=failure, max_steps=1
    )
    run_virtual(controller.run)
    assert [c.step for c in trainer.chunks] == [0]
    p2 = [r for r in fates if r.prompt_uid == "p2"]
    assert [(r.fate, r.resolution, r.group_id is None) for r in p2] == [
        ("failed", "retried", False),
        ("pending", None, True),
    ]
    assert p2[1].attempt == 1 and p2[1].start_version is None and "waiting to retry" in p2[1].detail
    lines = [{**r.as_dict(), "mode": "async"} for r in fates]
    assert prompt_outcome([line for line in lines if line["prompt_uid"] == "p2"]) == ("pending", 0)
    assert audit_fates(lines, [f"p{i}" for i in range(8)]).conflicting_groups == []


def test_filtered_groups_use_no_failure_budget_and_reset_the_drop_streak():
    script = {
        "p0": [Outcome(latency=1.0, fail="infra")],
        "p1": [Outcome(latency=2.0, rewards=ZERO)],
        "p2": [Outcome(latency=3.0, fail="infra")],
        "p3": [Outcome(latency=4.0, rewards=ZERO)],
    }
    failure = failure_settings(
        on_dropped_prompt="shrink",
        max_infra_attempts_per_prompt=1,
        max_consecutive_dropped_prompts=1,
        max_skipped_prompts=0,
        min_step_batch_fraction=0.5,
    )
    controller, _, trainer = make(
        "windowed",
        {"max_staleness_versions": 9},
        1,
        6,
        script=script,
        ds=True,
        failure=failure,
        min_groups_for_streaming_train=1,
    )
    summary = run_virtual(controller.run)
    assert trainer.uids_per_step() == {0: ["p4"], 1: ["p5"]}
    assert controller.ctx.budgets.max_consecutive_seen == 1
    assert controller.rollout_pump.groups_finished == 4  # 2 filtered + 2 trained: progress for a watchdog
    assert summary.fates.by_resolution[("filtered", "uncharged")] == 2


def test_ready_first_diverts_to_the_pool_and_windowed_never_does():
    script = {"p0": [Outcome(rewards=ZERO)]}
    controller, rollouts, trainer = make(
        "ready_first", {"max_staleness_versions": 0}, 2, 6, ds=True, script=script, failure=replace()
    )
    summary = run_virtual(controller.run)
    assert trainer.uids_per_step()[0] == ["p1", "p2"]  # p2 came from the pool (batch 1 was diverted)
    assert summary.ledger_history[0].replaced == 1
    controller, rollouts, trainer = make(
        "windowed", {"max_staleness_versions": 3}, 2, 6, ds=True, script=script, failure=replace()
    )
    summary = run_virtual(controller.run)
    assert [c.uid for c in rollouts.calls] == [f"p{i}" for i in range(6)]
    assert len(controller.ctx.spare_pool) == 0 and summary.unused_prompts == 0


class WrongIdRollouts(ScriptedRollouts):
    async def rollout(self, prompt, group_id, attempt, start_version):
        group = await super().rollout(prompt, group_id, attempt, start_version)
        group.group_id = group_id + 1000
        return group


def test_rollout_client_must_return_the_given_group_id():
    cfg = controller_settings(
        prompts_per_step=2,
        group_size=G,
        dynamic_sampling=False,
        failure=failure_settings(max_data_attempts_per_prompt=1),
    )
    controller = build_controller(cfg, make_loader(2), WrongIdRollouts(group_size=G), RecordingTrainer())
    with pytest.raises(ValueError, match="must return the group_id it was given"):
        run_virtual(controller.run)


def test_cancelled_run_leaves_no_task_running():
    async def main():
        controller, rollouts, _ = make(
            "ready_first", {"max_staleness_versions": 1}, 2, 8, default=Outcome(latency=30.0)
        )
        task = asyncio.ensure_future(controller.run())
        await asyncio.sleep(5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(100)
        return rollouts, controller

    rollouts, controller = run_virtual(main)
    assert rollouts.finished == [] and len(controller.ctx.buffer) == 0
    assert controller.fates["pending"] == len(rollouts.calls) == 4
