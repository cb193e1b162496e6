"""Invariant fuzzing of the real controller against the simulator, run to completion in virtual time.

Hypothesis draws sampler (in_order, ready_first, windowed, weight_fifo without dynamic sampling) × knobs ×
dynamic-sampling rate (difficulty, starting skill, learning speed) × failure
rates (infra, data, stragglers) × latency (lengths, tails, slots, training and sync time) × on_dropped_prompt ×
streaming chunk sizes × budgets × data size. Every run must:
- balance the ledger at every close: selected + charged == P, or, for a closes-short sampler's last step at the
  end of data, selected >= floor and selected + charged + unfilled == P; the groups handed to the step equal
  its selected count;
- give every reserved slot (dispatched attempt) exactly one fate, and every dispatched prompt (uid, epoch)
  exactly one terminal fate when the run completes — at max_steps too, where a prompt backing off before a
  retry gets a slot-less ``pending`` line;
- complete (max_steps or the end of data) or fail with a named error — never hang: each run has a virtual-time
  bound far above its length, and reaching it fails the test; ``ControllerStalled`` is named only for weight_fifo
  (its bucket mismatch), a bug for every other sampler;
- say ``trained`` only for groups whose step's optimizer step ran (a step selected but never stepped leaves its
  groups ``pending``, saying so), with the in-memory counts equal to the records;
- train no group twice (trained fates are unique and equal the groups selected in the ledger);
- account every generated token: the simulated engine's count of what it handed back equals the controller's
  generated tokens, and equals the tokens of the fate records (every one of them settled by the end, a failed
  run's too);
- keep staleness (step − start version) >= 0, <= max_lookahead_versions for in_order and <= the window for
  windowed; ready_first is unbounded for stragglers by design, its excess over the admission window is
  recorded as a hypothesis event (``pytest --hypothesis-show-statistics`` reports the tail).

:func:`classify` runs one scenario and names its outcome (``bench/fuzz.py`` counts them). The CI tier runs 300
examples; the slow tier (``-m slow``) 100,000.
"""

from __future__ import annotations

from collections import Counter

import pytest
from fakes.settings import controller_settings, failure_settings
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from groupwise.config import sampler_config
from groupwise.controller.fate_records import TERMINAL_RESOLUTIONS, FateRecord
from groupwise.controller.settings import ControllerSettings
from groupwise.controller.train_pump import ControllerStalled
from groupwise.sim.simulation import simulate_async
from groupwise.sim.virtual_time import SimulationTimeout
from groupwise.sim.workload import SimWorkload

BOUND_S = 1.0e9  # virtual seconds; the largest drawn run needs well under 10^6


@st.composite
def scenarios(draw):
    sampler = draw(st.sampled_from(["in_order", "ready_first", "windowed", "weight_fifo"]))
    window = draw(st.integers(0, 3))
    P = draw(st.integers(1, 6))
    G = draw(st.integers(2, 4))
    knobs = {
        "in_order": {"max_lookahead_versions": window},
        "ready_first": {"max_staleness_versions": window},
        "windowed": {"max_staleness_versions": window, "sample_freshest_first": draw(st.booleans())},
        "weight_fifo": {"max_staleness_versions": window},
    }[sampler]
    workload = SimWorkload(
        group_size=G,
        seed=draw(st.integers(0, 2**16)),
        rollout_slots=draw(st.integers(1, 24)),
        length_median_tokens=draw(st.floats(1.0, 60.0)),
        length_p99_over_p50=draw(st.floats(1.0, 20.0)),
        prefill_s=draw(st.sampled_from([0.0, 0.05, 0.5])),
        per_token_s=draw(st.sampled_from([0.0, 0.001, 0.01, 0.1])),
        train_s_per_token=draw(st.sampled_from([0.0, 0.0001, 0.001, 0.01])),
        weight_sync_s=draw(st.sampled_from([0.0, 0.5, 5.0])),
        weight_sync_drains=draw(st.booleans()),
        infra_failure_rate=draw(st.sampled_from([0.0, 0.0, 0.05, 0.3])),
        data_failure_rate=draw(st.sampled_from([0.0, 0.0, 0.05, 0.3])),
        straggler_rate=draw(st.sampled_from([0.0, 0.1, 0.5])),
        straggler_factor=draw(st.floats(1.0, 20.0)),
        difficulty_spread=draw(st.floats(0.0, 4.0)),
        learning_rate_groups=draw(st.sampled_from([5.0, 50.0, 1e9])),
        initial_success_logit=draw(st.floats(-4.0, 4.0)),
        num_prompts=draw(st.integers(1, 40)),
    )
    needed = P * (window + 1) if sampler != "windowed" else P
    cfg = controller_settings(
        prompts_per_step=P,
        group_size=G,
        sampler=sampler_config(sampler, **knobs),
        min_groups_for_streaming_train=draw(st.integers(1, P)),
        max_inflight_prompts=draw(st.integers(1, 12)),
        max_buffered_rollouts=needed + draw(st.integers(0, 6)),
        dynamic_sampling=draw(st.booleans()) and sampler != "weight_fifo",  # refused together
        failure=failure_settings(
            on_dropped_prompt=draw(st.sampled_from(["shrink", "replace"])),
            max_replacement_attempts=draw(st.integers(1, 4)),
            replacement_reserve_prompts=draw(st.integers(1, 8)),
            min_step_batch_fraction=draw(st.sampled_from([0.25, 0.5, 1.0])),
            max_infra_attempts_per_prompt=draw(st.integers(1, 3)),
            max_data_attempts_per_prompt=draw(st.integers(1, 2)),
            backoff_base_s=0.5,
            max_backoff_s=4.0,
            max_skipped_prompts=draw(st.sampled_from([0, 3, 10_000])),
            max_consecutive_dropped_prompts=draw(st.sampled_from([0, 3, 10_000])),
        ),
        max_steps=draw(st.integers(1, 8)),
    )
    max_epochs = draw(st.sampled_from([1, 2, None]))
    return cfg, workload, max_epochs


def run_scenario(cfg: ControllerSettings, workload: SimWorkload, max_epochs: int | None):
    fates: list[FateRecord] = []
    closes: list[tuple[int, int, int, int]] = []
    trained_ids: list[int] = []
    staleness: list[int] = []

    def on_step_end(step, metrics, groups):
        # What the controller reports at the moment the step closes: (step, selected, charged, unfilled).
        charged, unfilled = metrics["accounting/dropped_groups"], metrics["accounting/unfilled_groups"]
        closes.append((step, len(groups), int(charged), int(unfilled)))
        trained_ids.extend(g.group_id for g in groups)
        staleness.extend(step - g.start_version for g in groups)

    run = simulate_async(cfg, workload, max_epochs=max_epochs, on_step_end=on_step_end, on_fate=fates.append,
                         max_virtual_seconds=BOUND_S)  # fmt: skip
    return run, fates, closes, trained_ids, staleness


def check_ends(cfg, run) -> None:
    """The run ended: completed, or a named error — never the virtual-time bound, a stall only for weight_fifo."""
    assert not isinstance(run.error, SimulationTimeout), f"the run hung: {run.error}"
    # A stall is weight_fifo's documented hazard (its version buckets); with any other sampler it is a bug.
    assert not isinstance(run.error, ControllerStalled) or cfg.sampler.name == "weight_fifo", run.error


def check_records(cfg, workload, max_epochs, run, fates, closes, trained_ids, staleness) -> None:
    """What the run says happened is what happened: ledger at every close, trained fates, staleness bounds."""
    P, controller = cfg.prompts_per_step, run.controller
    ledger = controller.ledger
    # The ledger balances at every close (as reported then, and as recorded in its history; a failure may
    # interrupt the run between a close and its report).
    history = [(r.step, r.selected, r.charged, r.unfilled) for r in ledger.history]
    assert closes == history[: len(closes)]
    assert len(closes) == len(history) or (run.error is not None and len(closes) == len(history) - 1)
    for index, (_, selected, charged, unfilled) in enumerate(closes):
        if unfilled:
            assert controller.ctx.accounting.closes_short_at_exhaustion and index == len(closes) - 1
            assert selected >= ledger.floor and selected + charged + unfilled == P
        else:
            assert selected + charged == P
    # ``trained`` only after the step's optimizer step: exactly the groups of the steps the learner stepped (a run
    # may fail after a step's optimizer step and before its report); a step selected but never stepped leaves its
    # groups pending, saying so; the in-memory counts agree with the records. No group trained twice.
    stepped = run.parts.trainer.curve.latest_version  # optimizer steps that ran
    trained_fates = [r.group_id for r in fates if r.fate == "trained"]
    assert len(trained_fates) == len(set(trained_fates)) == controller.fates["trained"]
    assert set(trained_ids) <= set(trained_fates) and all(r.step < stepped for r in fates if r.fate == "trained")
    records = [*ledger.history, *ledger.pending()]
    assert len(trained_fates) == sum(r.selected for r in records if r.step < stepped)
    never_stepped = [r for r in fates if r.fate == "pending" and "optimizer step never ran" in r.detail]
    assert len(never_stepped) == sum(r.selected for r in records if r.step >= stepped)
    # Staleness bounds per sampler.
    assert all(s >= 0 for s in staleness)
    window = cfg.sampler.window
    if cfg.sampler.name in ("in_order", "windowed", "weight_fifo"):
        assert max(staleness, default=0) <= window
    elif staleness:
        event(f"ready_first staleness excess over its window: {max(0, max(staleness) - window)}")


def check_accounting(cfg, workload, max_epochs, run, fates, closes, trained_ids, staleness) -> None:
    """Nothing is lost: one fate per reserved slot; in a completed run one terminal fate per dispatched prompt."""
    controller = run.controller
    # Exactly one fate per reserved slot (slot-less lines: prompts backing off at the stop).
    fate_ids = Counter(record.group_id for record in fates if record.group_id is not None)
    assert all(r.fate == "pending" and r.start_version is None for r in fates if r.group_id is None)
    assert set(fate_ids) == set(range(controller.ctx.buffer.next_slot_id))
    assert all(n == 1 for n in fate_ids.values())
    # Every generated token is accounted: the engine's count = the controller's = the fate records' (all settled).
    generation = controller.fates.generation.run
    assert run.parts.rollouts.counters.generated_tokens == generation.generated_tokens
    assert sum(r.tokens for r in fates) == sum(generation.tokens.values()) == generation.generated_tokens
    if run.error is not None:
        event(f"named failure: {type(run.error).__name__}")
        return
    # A completed run: every dispatched prompt (uid, epoch) ends in exactly one terminal fate.
    terminal = Counter(
        (r.prompt_uid, r.epoch)
        for r in fates
        if r.fate in ("trained", "evicted", "aborted", "pending") or r.resolution in TERMINAL_RESOLUTIONS
    )
    dispatched = {(r.prompt_uid, r.epoch) for r in fates}
    assert all(n == 1 for n in terminal.values())
    # Including a prompt backing off before a retry when the run stops at max_steps (a slot-less pending line).
    assert set(terminal) == dispatched, dispatched - set(terminal)
    if any(r.group_id is None for r in fates):
        event("prompt backing off at the stop: slot-less pending line")
    assert run.stop_reason in ("max_steps", "exhausted")
    if run.stop_reason == "exhausted":  # every prompt of every epoch dispatched or counted unused; nothing held
        assert len(dispatched) + controller.rollout_pump.unused_prompts == workload.num_prompts * max_epochs
        assert controller.ctx.capacity.in_use == 0
    event(f"completed: {run.stop_reason}")


def check_invariants(cfg, workload, max_epochs, *observed) -> None:
    check_ends(cfg, observed[0])
    check_records(cfg, workload, max_epochs, *observed)
    check_accounting(cfg, workload, max_epochs, *observed)


def classify(scenario) -> str:
    """The outcome of one scenario, for ``bench/fuzz.py``: ``completed``, ``clean error`` (a named failure),
    ``traceback`` (any other exception), ``hang`` (the virtual-time bound, or a stall of a sampler that must not
    stall), ``false record`` (check_records failed) or ``data lost`` (check_accounting failed)."""
    cfg, workload, max_epochs = scenario
    try:
        observed = run_scenario(cfg, workload, max_epochs)
    except Exception:  # noqa: BLE001 — an unexpected exception is the finding
        return "traceback"
    try:
        check_ends(cfg, observed[0])
    except AssertionError:
        return "hang"
    for check, finding in ((check_records, "false record"), (check_accounting, "data lost")):
        try:
            check(cfg, workload, max_epochs, *observed)
        except AssertionError:
            return finding
    return "completed" if observed[0].error is None else "clean error"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_simulated_runs_keep_every_invariant(scenario):
    cfg, workload, max_epochs = scenario
    check_invariants(cfg, workload, max_epochs, *run_scenario(cfg, workload, max_epochs))


@pytest.mark.slow
@settings(max_examples=100_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_simulated_runs_keep_every_invariant_at_scale(scenario):
    cfg, workload, max_epochs = scenario
    check_invariants(cfg, workload, max_epochs, *run_scenario(cfg, workload, max_epochs))
