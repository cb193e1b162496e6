"""Lossless async resume: the controller snapshot, the async checkpoint, and `groupwise train --resume` (issue 8).

Invariants pinned:
- every piece of the async checkpoint state survives the real atomic checkpoint writer and a restore into a fresh
  controller: sampler dispatch cursor and stamping flag, READY buffered groups with versions and stamps (holding
  their capacity permits), spare pool, open steps' ledger entries (a loss charged to a future step), open steps'
  tallies, failure budgets, fate counts and run counters; unsettled dispatch slots are re-dispatched first under
  their stamps (their running attempt gets a `pending`/`requeued` fate), prompts waiting at the gate go back to
  the loader front;
- resuming after k steps continues with the same cursor and ledger: `in_order` trains the same prompts per step
  as an uninterrupted run, stamps continue from the restored cursor, and for every sampler the fates of the first
  part (cut at the snapshot, as a resume cuts fates.jsonl) plus the resumed part audit clean — no prompt trained
  twice, none dispatched without a fate;
- a sampler without a readable dispatch cursor (custom) restarts its cursor at the resumed step, gets its unsettled
  prompts back at the loader front, and tops each restored step up to exactly P with the restored charges;
- a checkpoint of another P is refused with a message naming both values, a snapshot missing any key (the
  five-key format of version 0.1.0 included) is refused before anything is restored; another sampler drops the buffered
  groups with `evicted` fates, a note, and sends every unsettled prompt back to the loader;
- a crash during an async checkpoint write leaves the previous checkpoint as the one resumed; the resumed run's
  metrics continue without gaps and its fates audit clean; `groupwise train CONFIG --resume` continues an async
  run from the CLI.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from fakes import Outcome, RecordingTrainer, ScriptedRollouts, make_loader, make_prompts, run_virtual
from fakes.settings import controller_settings, failure_settings
from test_sync_trainer import tiny_config

from groupwise.cli.run_prompts import training_uids
from groupwise.config import sampler_config
from groupwise.controller.controller import build_controller
from groupwise.controller.settings import ControllerSettings
from groupwise.controller.snapshot import sampler_stamps
from groupwise.run.async_checkpoint import ItemDecoder, encode_item
from groupwise.run.audit import audit_fates, audit_run
from groupwise.run.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

G = 2
ZERO = (1.0, 1.0)
N_PROMPTS = 18


def latencies(seed: int, script: dict[str, list[Outcome]]) -> dict[str, list[Outcome]]:
    rng = random.Random(seed)
    out = {f"p{i}": [Outcome(latency=rng.choice([0.5, 1.0, 2.0, 4.0]))] for i in range(N_PROMPTS)}
    out.update(script)
    return out


SCENARIOS = {
    # A zero-variance group of step 1 finishes before step 0 closes: its loss is charged to the open step 1.
    "in_order_charge": dict(
        sampler="in_order",
        knobs={"max_lookahead_versions": 1},
        failure=failure_settings(min_step_batch_fraction=0.5),
        snapshot_after=1,
        script={
            **{f"p{i}": [Outcome(latency=3.0)] for i in range(3)},
            "p3": [Outcome(latency=1.0)],
            "p4": [Outcome(latency=0.5, rewards=ZERO)],
            "p5": [Outcome(latency=8.0)],
        },
    ),
    # Spares in the pool, a data failure retried before the snapshot, zero-variance groups replaced.
    "ready_first_spares": dict(
        sampler="ready_first",
        knobs={"max_staleness_versions": 1},
        failure=failure_settings(
            on_dropped_prompt="replace",
            replacement_reserve_prompts=3,
            max_replacement_attempts=4,
            min_step_batch_fraction=0.5,
            max_data_attempts_per_prompt=2,
        ),
        snapshot_after=2,
        script={
            "p1": [Outcome(latency=0.5, fail="data"), Outcome(latency=1.0)],
            "p2": [Outcome(latency=1.0, rewards=ZERO)],
            "p7": [Outcome(latency=1.0, rewards=ZERO)],
            "p4": [Outcome(latency=9.0)],
        },
    ),
    # Ungated production, losses charged to nobody, the last step may close short.
    "windowed": dict(
        sampler="windowed",
        knobs={"max_staleness_versions": 1},
        failure=failure_settings(min_step_batch_fraction=0.5),
        snapshot_after=2,
        script={"p3": [Outcome(latency=1.0, rewards=ZERO)], "p6": [Outcome(latency=6.0)]},
    ),
}


def settings(scenario: dict, **kw) -> ControllerSettings:
    return controller_settings(
        prompts_per_step=3,
        group_size=G,
        sampler=sampler_config(scenario["sampler"], **scenario["knobs"]),
        failure=scenario["failure"],
        dynamic_sampling=True,
        max_buffered_rollouts=12,
        **kw,
    )


def first_part(scenario: dict, tmp_path: Path, seed: int = 0):
    """Run until the snapshot step; save the snapshot with the real checkpoint writer and load it back."""
    k = scenario["snapshot_after"]
    loader, fates, saved = make_loader(N_PROMPTS), [], {}
    controller = None

    def snapshot(step, metrics, groups):
        if step + 1 == k:
            saved["controller"] = controller.state_dict(encode_item)
            saved["loader"] = loader.state_dict()
            saved["fates_cut"] = len(fates)

    trainer = RecordingTrainer()
    controller = build_controller(
        settings(scenario, max_steps=k),
        loader,
        ScriptedRollouts(G, script=latencies(seed, scenario["script"])),
        trainer,
        on_step_end=snapshot,
        on_fate=fates.append,
    )
    run_virtual(controller.run)
    path = save_checkpoint(tmp_path, k, {"trainer": {"loader": saved["loader"]}, "extra": saved}, keep_last=1)
    loaded = load_checkpoint(path)["extra"]
    assert loaded["controller"] == saved["controller"]  # lossless through the atomic writer
    return loaded, fates[: saved["fates_cut"]], trainer


def resume(scenario: dict, loaded: dict, seed: int = 0, **kw):
    k = scenario["snapshot_after"]
    loader = make_loader(N_PROMPTS)
    loader.load_state_dict(loaded["loader"])
    fates, trainer = [], RecordingTrainer()
    controller = build_controller(
        settings(scenario, start_step=k, **kw),
        loader,
        ScriptedRollouts(G, script=latencies(seed, scenario["script"])),
        trainer,
        on_fate=fates.append,
        state=loaded["controller"],
        decode=ItemDecoder(make_prompts(N_PROMPTS)),
    )
    return controller, loader, fates, trainer


def as_lines(records) -> list[dict]:
    return [{**r.as_dict(), "mode": "async"} for r in records]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_piece_of_the_snapshot_round_trips_into_a_fresh_controller(name, tmp_path):
    scenario = SCENARIOS[name]
    loaded, _, _ = first_part(scenario, tmp_path)
    saved = loaded["controller"]
    controller, loader, fates, _ = resume(scenario, loaded)
    ctx = controller.ctx
    assert ctx.sampler.dispatch_index == saved["dispatch_index"]
    assert sampler_stamps(ctx.sampler) == saved["stamps"] == (scenario["sampler"] == "in_order")
    assert ctx.buffer.state_dict() == saved["buffer"]
    assert ctx.capacity.in_use == len(saved["buffer"]["groups"])  # restored groups hold their permits
    assert ctx.ledger.state_dict() == saved["ledger"]
    assert ctx.tally.state_dict() == saved["tally"]
    assert ctx.budgets.state_dict() == saved["budgets"]
    again = controller.state_dict(encode_item)
    assert again["spare_pool"] == saved["spare_pool"] and again["counters"] == saved["counters"]
    # Unsettled slots wait to be re-dispatched first; their interrupted attempts are over.
    assert again["inflight_slots"] == [
        {**slot, "group_id": None, "start_version": None} for slot in saved["inflight_slots"]
    ]
    requeued = [r for r in fates if r.resolution == "requeued"]
    assert sorted(r.group_id for r in requeued) == sorted(
        s["group_id"] for s in saved["inflight_slots"] if s["group_id"] is not None
    )
    assert all(r.fate == "pending" and r.epoch == 0 for r in requeued)
    assert ctx.fates.total == saved["fates"]["total"] + len(requeued)
    # Prompts of a batch still at the gate are back at the loader front, in order.
    front = [entry["uid"] for entry in loader.state_dict()["returned"]]
    assert front == [entry["uid"] for entry in saved["inflight_prompts"]]


def test_the_scenarios_exercise_what_they_claim(tmp_path):
    charge, _, _ = first_part(SCENARIOS["in_order_charge"], tmp_path / "a")
    state = charge["controller"]
    assert [(r["step"], r["charged"]) for r in state["ledger"]["open"]] == [(1, 1)]
    assert {s["target_step"] for s in state["inflight_slots"]} == {1}
    assert [g["target_step"] for g in state["buffer"]["groups"]] == [1]
    spares, _, _ = first_part(SCENARIOS["ready_first_spares"], tmp_path / "b")
    state = spares["controller"]
    assert state["spare_pool"]["items"] and state["budgets"]["data_retries"] == 1
    assert state["counters"]["admitted_batches"] >= 3


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_resume_after_k_steps_loses_and_repeats_nothing(name, tmp_path):
    scenario = SCENARIOS[name]
    loaded, first_fates, first_trainer = first_part(scenario, tmp_path)
    controller, _, resumed_fates, second = resume(scenario, loaded)
    summary = run_virtual(controller.run)
    assert summary.steps_trained > 0 and summary.first_step == scenario["snapshot_after"]
    report = audit_fates(as_lines(first_fates + resumed_fates), [p.uid for p in make_prompts(N_PROMPTS)])
    assert report.ok, report.format()
    trained = [uid for part in (first_trainer, second) for uids in part.uids_per_step().values() for uid in uids]
    assert len(trained) == len(set(trained)) == report.epochs[0].counts["trained"]


def test_in_order_resume_equals_continuing_and_stamps_continue(tmp_path):
    scenario = SCENARIOS["in_order_charge"]
    full = RecordingTrainer()
    rollouts = ScriptedRollouts(G, script=latencies(0, scenario["script"]))
    run_virtual(build_controller(settings(scenario), make_loader(N_PROMPTS), rollouts, full).run)
    loaded, _, first = first_part(scenario, tmp_path)
    controller, _, _, second = resume(scenario, loaded)
    run_virtual(controller.run)
    assert {**first.uids_per_step(), **second.uids_per_step()} == full.uids_per_step()
    assert second.groups_per_step()[1] == 2  # the loss charged before the snapshot still shrinks step 1
    for chunk in second.chunks:  # in_order: each step trains only groups stamped for it, old stamps and new
        assert {g.target_step for g in chunk.groups} == {chunk.step}


def test_without_a_dispatch_cursor_the_restored_steps_are_topped_up_exactly(tmp_path):
    scenario = SCENARIOS["in_order_charge"]
    loaded, first_fates, first = first_part(scenario, tmp_path)
    loaded["controller"]["dispatch_index"] = None  # what a custom sampler without `dispatch_index` saves
    controller, loader, fates, second = resume(scenario, loaded)
    slots = loaded["controller"]["inflight_slots"]
    assert [e["uid"] for e in loader.state_dict()["returned"]][: len(slots)] == [s["prompt"]["uid"] for s in slots]
    run_virtual(controller.run)
    assert second.groups_per_step()[1] == 2  # 1 restored + 1 topped up + 1 charge restored = P
    assert not [r for r in fates if r.fate == "evicted"]  # nothing launched beyond what a step can take
    full = RecordingTrainer()
    rollouts = ScriptedRollouts(G, script=latencies(0, scenario["script"]))
    run_virtual(build_controller(settings(scenario), make_loader(N_PROMPTS), rollouts, full).run)
    assert {**first.uids_per_step(), **second.uids_per_step()} == full.uids_per_step()
    report = audit_fates(as_lines(first_fates + fates), [p.uid for p in make_prompts(N_PROMPTS)])
    assert report.ok, report.format()
    assert all({g.target_step for g in c.groups} == {c.step} for c in second.chunks)


def test_another_prompts_per_step_is_refused(tmp_path):
    loaded, _, _ = first_part(SCENARIOS["in_order_charge"], tmp_path)
    with pytest.raises(ValueError, match=r"prompts_per_step .* = 3 but this run has 4.*num_prompts_per_step=3"):
        build_controller(
            controller_settings(prompts_per_step=4, group_size=G, sampler=sampler_config("in_order"), start_step=1),
            make_loader(N_PROMPTS),
            ScriptedRollouts(G),
            RecordingTrainer(),
            state=loaded["controller"],
            decode=ItemDecoder(make_prompts(N_PROMPTS)),
        )


def test_a_snapshot_without_every_key_is_refused_before_anything_is_restored(tmp_path):
    loaded, _, _ = first_part(SCENARIOS["in_order_charge"], tmp_path)
    state = loaded["controller"]
    old_format = {key: state[key] for key in ("step", "sampler", "buffer", "spare_pool", "inflight_prompts")}
    loader = make_loader(N_PROMPTS)
    with pytest.raises(ValueError, match=r"controller state must have the keys .*written by another groupwise"):
        build_controller(
            settings(SCENARIOS["in_order_charge"], start_step=state["step"]), loader, ScriptedRollouts(G),
            RecordingTrainer(), state=old_format, decode=ItemDecoder(make_prompts(N_PROMPTS)),
        )  # fmt: skip
    assert [item.prompt.uid for item in loader.take(2)] == ["p0", "p1"]  # nothing was pushed back to the loader


def test_another_sampler_drops_the_buffer_with_fates_and_requeues_every_prompt(tmp_path):
    scenario = SCENARIOS["in_order_charge"]
    loaded, first_fates, _ = first_part(scenario, tmp_path)
    saved = loaded["controller"]
    other = {**scenario, "sampler": "ready_first", "knobs": {"max_staleness_versions": 1}}
    controller, loader, fates, _ = resume(other, loaded)
    dropped = [r for r in fates if r.fate == "evicted"]
    assert sorted(r.group_id for r in dropped) == [g["group"]["group_id"] for g in saved["buffer"]["groups"]]
    assert all("differs from this run's 'ready_first'" in r.detail for r in dropped)
    assert any("buffered group(s) dropped" in note for note in controller.resume_notes)
    assert any("open ledger step" in note for note in controller.resume_notes)
    assert controller.ctx.buffer.ready_count == 0 and controller.ctx.capacity.in_use == 0
    front = [entry["uid"] for entry in loader.state_dict()["returned"]]
    assert front == [s["prompt"]["uid"] for s in saved["inflight_slots"]] + [
        e["uid"] for e in saved["inflight_prompts"]
    ]
    run_virtual(controller.run)
    report = audit_fates(as_lines(first_fates + fates), [p.uid for p in make_prompts(N_PROMPTS)])
    assert report.ok, report.format()


# --- the embedded runtime: real tiny model, session checkpoints, CLI -----------------------------------------


def async_config(tmp_path: Path, name: str, max_steps: int):
    data = tiny_config(
        tmp_path,
        run={"name": name, "max_steps": max_steps},
        eval={"at_start": False, "at_end": False},
        checkpoint={"every": 1, "keep_last": 3, "save_final": False},
        logging={"progress": False, "tensorboard": False},
    ).model_dump(by_alias=True)
    data["mode"] = "async"
    data["grpo"]["dynamic_sampling"] = {"enabled": True}
    data["loss"]["importance_sampling"] = True
    data["async"] = {
        "sampler": {"name": "in_order", "max_lookahead_versions": 1},
        "max_buffered_rollouts": 8,
        "max_inflight_prompts": 8,
        "rollout_failure": {"on_dropped_prompt": "replace", "replacement_reserve_prompts": 4},
    }
    return data


def test_crash_during_an_async_checkpoint_write_resumes_the_previous_one(tmp_path, monkeypatch):
    from groupwise.config import config_from_dict
    from groupwise.run import checkpoint
    from groupwise.run.metrics import read_metrics
    from groupwise.runtime.async_run import run_async
    from groupwise.trainer.builder import build_session

    session = build_session(config_from_dict(async_config(tmp_path, "crash", 3)))
    real_write = checkpoint._write_file_synced

    def die_in_step_3(path, data):  # the first piece of step 3 lands, then the write dies
        if ".tmp-step_3" in str(path) and path.name != "trainer_state.json":
            raise RuntimeError("killed mid-checkpoint")
        real_write(path, data)

    monkeypatch.setattr(checkpoint, "_write_file_synced", die_in_step_3)
    with pytest.raises(RuntimeError, match="killed mid-checkpoint"):
        run_async(session)
    monkeypatch.undo()
    run_dir = session.run_dir.path
    assert latest_checkpoint(run_dir).name == "step_2"
    resumed = build_session(config_from_dict(async_config(tmp_path, "crash", 4)), resume=True)
    assert resumed.state.step == 2
    run_async(resumed)
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [1, 2, 3, 4]
    report = audit_run(run_dir, training_uids)
    assert report.ok, report.format()
    assert report.epochs[0].counts["trained"] >= 4 * 3  # P=4 per step, at most one loss per step here
    assert "dropped" in (run_dir / "events.log").read_text()


def test_cli_train_resume_continues_an_async_run(tmp_path):
    import yaml

    from groupwise.cli.main import main

    path = tmp_path / "async.yaml"
    path.write_text(yaml.safe_dump(async_config(tmp_path, "cli", 2)))
    assert main(["train", str(path)]) == 0
    run_dir = tmp_path / "runs" / "cli"
    first = load_checkpoint(run_dir / "checkpoints" / "step_2")["extra"]["controller"]
    assert main(["train", str(path), "run.max_steps=4", "--resume"]) == 0
    last = load_checkpoint(run_dir / "checkpoints" / "step_4")["extra"]["controller"]
    assert first["step"] == 2 and last["step"] == 4
    assert last["dispatch_index"] >= 4 > first["dispatch_index"]  # stamps continued past the restored cursor
    assert all(g["target_step"] >= 4 for g in last["buffer"]["groups"])
    assert main(["audit", str(run_dir)]) == 0
    assert "resumed from" in (run_dir / "events.log").read_text()
