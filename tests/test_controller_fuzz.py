"""Randomised controller runs (hypothesis) over drop / filter / failure / latency schedules, samplers and failing steps.

Samplers: in_order, ready_first, windowed, weight_fifo (dynamic sampling off: it is refused with it), a custom gated
sampler with the gated defaults, and a custom gated sampler that closes short at exhaustion and keeps the spare pool;
with and without dynamic sampling, shrink and replace, streaming and full-batch chunks; the trainer's optimizer step
fails (NonFiniteTrainingError) at a drawn step in some runs. Invariants pinned:
- the run ends — completes, or fails with a named error: StepBelowFloorError (too many losses in one step), the
  injected NonFiniteTrainingError, and for weight_fifo only ControllerStalled / RolloutExhaustedError (its bucket
  mismatch, a documented hazard) — within a bounded virtual time; a hang at the end of data is a TimeoutError;
- records: the ledger balances at every close (selected + charged == P; a closes-short sampler's last step has
  selected >= floor); ``trained`` fates are exactly the groups of steps whose optimizer step ran, and the groups of
  a step that never got it are ``pending`` saying so; no group is trained twice; one finish_step per closed step;
- accounting: every reserved slot (dispatched attempt) has exactly one fate record; in a completed run every
  dispatched prompt ends in exactly one terminal place, and with the unused spares every loader prompt is
  accounted for.

:func:`classify` runs one scenario and names its outcome (``bench/fuzz.py`` counts them); the CI tier runs 250
examples, the slow tier (``-m slow``) 5,000.
"""

from __future__ import annotations

from collections import Counter

import pytest
from fakes import Outcome, RecordingTrainer, ScriptedRollouts, make_loader, run_virtual
from fakes.settings import controller_settings, failure_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from groupwise.config import sampler_config
from groupwise.controller.controller import build_controller
from groupwise.controller.fate_records import TERMINAL_RESOLUTIONS, FateRecord
from groupwise.controller.ledger import StepBelowFloorError
from groupwise.controller.train_pump import ControllerStalled, RolloutExhaustedError
from groupwise.trainer.finite import NonFiniteTrainingError

G = 2
KINDS = ["ok", "ok", "ok", "zero", "data", "infra"]
SAMPLERS = ["in_order", "ready_first", "windowed", "weight_fifo", "custom", "custom_closes_short"]
CLOSES_SHORT = ("windowed", "custom_closes_short")
HAZARD_ERRORS = {"weight_fifo": (ControllerStalled, RolloutExhaustedError)}


@st.composite
def scenarios(draw):
    sampler = draw(st.sampled_from(SAMPLERS))
    window = draw(st.integers(0, 2))
    P = draw(st.integers(1, 4))
    n_prompts = P * draw(st.integers(1, 5)) + draw(st.sampled_from([0, 0, 1]))  # sometimes a partial last batch
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
        "weight_fifo": {"max_staleness_versions": window},
        "custom": {"target": "fakes.samplers:PlainReadyFirst", "kwargs": {"window": window}},
        "custom_closes_short": {"target": "fakes.samplers:GatedClosesShort", "kwargs": {"window": window}},
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
        ds=draw(st.booleans()) and sampler != "weight_fifo",
        mode=draw(st.sampled_from(["shrink", "replace"])),
        replacements=draw(st.integers(1, 3)),
        reserve=draw(st.integers(1, 4)),
        fraction=draw(st.sampled_from([0.25, 0.5, 1.0])),
        data_attempts=draw(st.integers(1, 2)),
        infra_attempts=draw(st.integers(1, 3)),
        chunk_latency=float(draw(st.integers(0, 2))),
        failing_step=draw(st.sampled_from([None, None, None, 0, 1, 2])),
    )


class FailingTrainer(RecordingTrainer):
    """The optimizer step of ``failing_step`` is non-finite (the learner's guard raises)."""

    def __init__(self, failing_step: int | None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.failing_step = failing_step

    async def finish_step(self, step: int) -> dict[str, float]:
        if step == self.failing_step:
            raise NonFiniteTrainingError(f"optimizer step {step}: the loss is nan (injected by the fuzz)")
        return await super().finish_step(step)


def named_errors(sc) -> tuple[type[BaseException], ...]:
    """The errors a scenario may legitimately end with."""
    return (StepBelowFloorError, NonFiniteTrainingError, *HAZARD_ERRORS.get(sc["sampler"], ()))


def run_scenario(sc):
    cfg = controller_settings(
        prompts_per_step=sc["P"],
        group_size=G,
        sampler=sampler_config("custom" if sc["sampler"].startswith("custom") else sc["sampler"], **sc["knobs"]),
        min_groups_for_streaming_train=sc["min_stream"],
        max_buffered_rollouts=sc["capacity"],
        max_inflight_prompts=sc["inflight"],
        dynamic_sampling=sc["ds"],
        failure=failure_settings(
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
    trainer = FailingTrainer(sc["failing_step"], chunk_latency=sc["chunk_latency"])
    controller = build_controller(cfg, make_loader(sc["n_prompts"]), rollouts, trainer, on_fate=fates.append)
    try:
        summary = run_virtual(controller.run, timeout=100_000.0)
        error = None
    except named_errors(sc) as exc:  # legitimate, named outcomes
        summary, error = None, exc
    return controller, rollouts, trainer, fates, summary, error


def check_records(sc, controller, rollouts, trainer, fates, summary, error):
    """What the run says happened is what happened: ledger, trained fates, steps."""
    P, ledger = sc["P"], controller.ledger
    for rec in ledger.history:  # every closed step balanced (short only for a closes-short sampler's last step)
        if rec.unfilled:
            assert sc["sampler"] in CLOSES_SHORT and rec is ledger.history[-1]
            assert rec.selected >= ledger.floor and rec.selected + rec.charged + rec.unfilled == P
        else:
            assert rec.selected + rec.charged == P
    # No group trained twice; trained fates are exactly the groups of steps whose optimizer step ran, and the
    # groups of a step that never got it are pending, saying so.
    trained_ids = [gid for chunk in trainer.chunks for gid in chunk.group_ids]
    assert len(set(trained_ids)) == len(trained_ids)
    stepped = [gid for chunk in trainer.chunks if chunk.step in trainer.finished for gid in chunk.group_ids]
    assert sorted(stepped) == sorted(r.group_id for r in fates if r.fate == "trained")
    never_stepped = {r.group_id for r in fates if r.fate == "pending" and "optimizer step never ran" in r.detail}
    assert never_stepped == set(trained_ids) - set(stepped)
    closed_selected = sum(rec.selected for rec in ledger.history)
    open_selected = sum(rec.selected for rec in ledger.pending())
    assert len(trained_ids) == closed_selected + open_selected
    closed = [rec.step for rec in ledger.history]
    # One finish_step per closed step; a run that stopped may have closed its last step without stepping it (its
    # optimizer step failed, or another error stopped the run first).
    assert trainer.finished == closed or (error is not None and trainer.finished == closed[:-1])
    if isinstance(error, NonFiniteTrainingError):
        assert closed[-1] == sc["failing_step"] and not any(r.step == closed[-1] for r in fates if r.fate == "trained")


def check_accounting(sc, controller, rollouts, trainer, fates, summary, error):
    """Nothing is lost: one fate per reserved slot, one terminal fate per dispatched prompt, every prompt counted."""
    reserved = set(range(controller.ctx.buffer.next_slot_id))
    called = [call.group_id for call in rollouts.calls]
    assert len(set(called)) == len(called) and set(called) <= reserved
    fate_ids = Counter(r.group_id for r in fates if r.group_id is not None)
    assert set(fate_ids) == reserved and all(n == 1 for n in fate_ids.values())
    # Slot-less lines: only a prompt backing off before a retry when the run stopped, after its failed/retried line.
    retried = {r.prompt_uid for r in fates if r.fate == "failed" and r.resolution == "retried"}
    slotless = [r for r in fates if r.group_id is None]
    assert all(r.fate == "pending" and r.start_version is None and r.prompt_uid in retried for r in slotless)
    if error is not None:
        return
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


def check_invariants(*run) -> None:
    check_records(*run)
    check_accounting(*run)


def classify(sc) -> str:
    """The outcome of one scenario, for ``bench/fuzz.py``: ``completed``, ``clean error``, ``traceback`` (an
    unexpected exception), ``hang``, ``false record`` (check_records failed) or ``data lost`` (check_accounting)."""
    try:
        run = run_scenario(sc)
    except TimeoutError:
        return "hang"
    except Exception:  # noqa: BLE001 — an unexpected exception is the finding
        return "traceback"
    for check, finding in ((check_records, "false record"), (check_accounting, "data lost")):
        try:
            check(sc, *run)
        except AssertionError:
            return finding
    return "completed" if run[-1] is None else "clean error"


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_schedules_keep_every_invariant(sc):
    check_invariants(sc, *run_scenario(sc))


@pytest.mark.slow
@settings(max_examples=5_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_schedules_keep_every_invariant_at_scale(sc):
    check_invariants(sc, *run_scenario(sc))
