"""Randomised controller runs (hypothesis) over drop / filter / failure / latency schedules and samplers.

Invariants pinned for in_order, ready_first, windowed and a custom sampler, with and without dynamic
sampling, shrink and replace, streaming and full-batch chunks:
- the ledger balances at every close: selected + charged == P, except a closes-short last step, which has
  selected >= floor (the ledger also asserts this at runtime; a LedgerInvariantError fails the test);
- every reserved slot (dispatched attempt) has exactly one fate record, and every dispatched prompt ends in
  exactly one terminal place; with the unused spares, every loader prompt is accounted for;
- no group is trained twice; trained fates == groups handed to the trainer == selected in the ledger;
- one finish_step per closed step, chunks flagged first exactly once;
- the run ends — completes, or fails with a named accounting error — within a bounded virtual time (a hang
  is a TimeoutError and fails the test).
"""

from __future__ import annotations

from collections import Counter

from fakes import Outcome, RecordingTrainer, ScriptedRollouts, make_loader, run_virtual
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from groupwise.config import sampler_config
from groupwise.controller.controller import build_controller
from groupwise.controller.failures import FailureSettings
from groupwise.controller.fate_records import TERMINAL_RESOLUTIONS, FateRecord
from groupwise.controller.ledger import StepBelowFloorError
from groupwise.controller.settings import ControllerSettings

G = 2
KINDS = ["ok", "ok", "ok", "zero", "data", "infra"]


@st.composite
def scenarios(draw):
    sampler = draw(st.sampled_from(["in_order", "ready_first", "windowed", "custom"]))
    window = draw(st.integers(0, 2))
    P = draw(st.integers(1, 4))
    n_prompts = P * draw(st.integers(1, 5))
    outcomes = {}
    for i in range(n_prompts):
        attempts = draw(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 5)), min_size=1, max_size=3))
        outcomes[f"p{i}"] = [
            Outcome(
                latency=float(lat),
                rewards=(1.0, 1.0) if kind == "zero" else None,
                fail=kind if kind in ("data", "infra") else None,
            )
            for kind, lat in attempts
        ]
    knobs = {
        "in_order": {"max_lookahead_versions": window},
        "ready_first": {"max_staleness_versions": window},
        "windowed": {"max_staleness_versions": window, "sample_freshest_first": draw(st.booleans())},
        "custom": {"target": "fakes.samplers:PlainReadyFirst", "kwargs": {"window": window}},
    }[sampler]
    needed = P * (window + 1)
    return dict(
        sampler=sampler,
        knobs=knobs,
        P=P,
        n_prompts=n_prompts,
        outcomes=outcomes,
        min_stream=draw(st.integers(1, P)),
        capacity=needed + draw(st.integers(0, 4)),
        inflight=draw(st.integers(1, 8)),
        ds=draw(st.booleans()),
        mode=draw(st.sampled_from(["shrink", "replace"])),
        replacements=draw(st.integers(1, 3)),
        reserve=draw(st.integers(1, 4)),
        fraction=draw(st.sampled_from([0.25, 0.5, 1.0])),
        data_attempts=draw(st.integers(1, 2)),
        infra_attempts=draw(st.integers(1, 3)),
        chunk_latency=float(draw(st.integers(0, 2))),
    )


def run_scenario(sc):
    cfg = ControllerSettings(
        prompts_per_step=sc["P"],
        group_size=G,
        sampler=sampler_config(sc["sampler"], **sc["knobs"]),
        min_groups_for_streaming_train=sc["min_stream"],
        max_buffered_rollouts=sc["capacity"],
        max_inflight_prompts=sc["inflight"],
        dynamic_sampling=sc["ds"],
        failure=FailureSettings(
            on_dropped_prompt=sc["mode"],
            max_replacement_attempts=sc["replacements"],
            replacement_reserve_prompts=sc["reserve"],
            min_step_batch_fraction=sc["fraction"],
            max_infra_attempts_per_prompt=sc["infra_attempts"],
            max_data_attempts_per_prompt=sc["data_attempts"],
            backoff_base_s=0.5,
            max_backoff_s=2.0,
            max_skipped_prompts=10_000,
            max_consecutive_dropped_prompts=10_000,
        ),
    )
    fates: list[FateRecord] = []
    rollouts = ScriptedRollouts(group_size=G, script=sc["outcomes"])
    trainer = RecordingTrainer(chunk_latency=sc["chunk_latency"])
    controller = build_controller(cfg, make_loader(sc["n_prompts"]), rollouts, trainer, on_fate=fates.append)
    try:
        summary = run_virtual(controller.run, timeout=100_000.0)
        error = None
    except StepBelowFloorError as exc:  # a legitimate, named outcome of too many losses in one step
        summary, error = None, exc
    return controller, rollouts, trainer, fates, summary, error


def check_invariants(sc, controller, rollouts, trainer, fates, summary, error):
    P = sc["P"]
    ledger = controller.ledger
    # Ledger: every closed step balanced (short only for a closes-short sampler's last step).
    for rec in ledger.history:
        if rec.unfilled:
            assert sc["sampler"] == "windowed" and rec is ledger.history[-1]
            assert rec.selected >= ledger.floor and rec.selected + rec.charged + rec.unfilled == P
        else:
            assert rec.selected + rec.charged == P
    # Every reserved slot has exactly one fate (a slot may be cancelled before its rollout even starts).
    reserved = set(range(controller.ctx.buffer.next_slot_id))
    called = [call.group_id for call in rollouts.calls]
    assert len(set(called)) == len(called) and set(called) <= reserved
    fate_ids = Counter(r.group_id for r in fates if r.group_id is not None)
    assert set(fate_ids) == reserved and all(n == 1 for n in fate_ids.values())
    # Slot-less lines: only a prompt backing off before a retry when the run stopped, after its failed/retried line.
    retried = {r.prompt_uid for r in fates if r.fate == "failed" and r.resolution == "retried"}
    slotless = [r for r in fates if r.group_id is None]
    assert all(r.fate == "pending" and r.start_version is None and r.prompt_uid in retried for r in slotless)
    # No group trained twice; trained fates match the trainer and the ledger.
    trained_ids = [gid for chunk in trainer.chunks for gid in chunk.group_ids]
    assert len(set(trained_ids)) == len(trained_ids)
    assert sorted(trained_ids) == sorted(r.group_id for r in fates if r.fate == "trained")
    closed_selected = sum(rec.selected for rec in ledger.history)
    open_selected = sum(rec.selected for rec in ledger.pending())
    assert len(trained_ids) == closed_selected + open_selected
    assert trainer.finished == [rec.step for rec in ledger.history]
    if error is not None:
        return
    # Completed run: every dispatched prompt ends in exactly one terminal place.
    terminal = Counter(
        r.prompt_uid
        for r in fates
        if r.fate in ("trained", "evicted", "aborted", "pending") or r.resolution in TERMINAL_RESOLUTIONS
    )
    dispatched = {call.uid for call in rollouts.calls}
    assert set(called) == reserved  # a completed run cancels nothing
    assert set(terminal) == dispatched and all(n == 1 for n in terminal.values())
    assert len(dispatched) + summary.unused_prompts == sc["n_prompts"]
    assert summary.stop_reason == "exhausted"
    assert controller.ctx.capacity.in_use == 0


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_schedules_keep_every_invariant(sc):
    check_invariants(sc, *run_scenario(sc))
