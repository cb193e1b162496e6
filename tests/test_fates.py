"""fates.jsonl: the writer, the reader, the rollback a resume does, and the fates the sync and async trainers write.

Invariants pinned:
- lines come back in write order with every field; a torn last line (a kill mid-write) is skipped with one
  plain logged warning line (no Python UserWarning), any other bad line is an error naming its line number; a line
  without every field or with an unknown fate is refused;
- `rollback(offset)` cuts exactly the lines written after `offset` (a torn fragment included) and nothing else;
  a file shorter than the offset is reported, not padded;
- interim lines (a retry, a requeue at resume, a sync carry) are exactly the ones that do not settle a prompt;
- a sync step writes one line per generated group: trained (carried-in included), carried or discarded surplus,
  filtered zero-variance groups; a group with reward variance that is none of these is a loud accounting error;
- a sync run killed after its step-2 checkpoint (lines of a half-done step 3 on disk) and resumed writes exactly
  the fates file of an uninterrupted run, whose audit is clean with P trained groups per step;
- carried groups that fill a whole sync step are trained without a new generation round (found by the chaos
  bench), each `carried` line followed by that group's `trained`, `carried` or end-of-run `pending` line;
- the async controller stamps every fate record with the loader epoch of its prompt.
"""

from __future__ import annotations

import json
import warnings

import pytest
from fakes import RecordingTrainer, ScriptedRollouts, make_prompts, run_virtual
from fakes.settings import controller_settings
from test_sync_trainer import run, tiny_config

from groupwise.cli.run_prompts import training_uids
from groupwise.config import sampler_config
from groupwise.controller.controller import build_controller
from groupwise.data.loader import PromptLoader
from groupwise.run.audit import audit_run
from groupwise.run.fates_file import LINE_FIELDS, FatesWriter, is_interim, read_fates, write_sync_step_fates
from groupwise.types import Completion, Group, Prompt


def line(group_id: int, fate: str = "trained", **kw) -> dict:
    base = {
        "group_id": group_id, "prompt_uid": f"p{group_id}", "epoch": 0, "attempt": 0, "start_version": 0,
        "fate": fate, "step": 0, "resolution": None, "detail": "", "mode": "async", "tokens": 0,
    }  # fmt: skip
    return {**base, **kw}


def test_lines_round_trip_and_a_torn_tail_is_skipped(tmp_path, caplog):
    path = tmp_path / "fates.jsonl"
    writer = FatesWriter(path)
    written = [line(0), line(1, "filtered", resolution="replaced"), line(2, "pending", step=None)]
    for entry in written:
        writer.write(entry)
    with path.open("a") as handle:
        handle.write('{"group_id": 3, "prompt_uid": "p3", "ep')  # the writer died mid-line
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the torn line is a logged line, never a Python UserWarning
        assert read_fates(path) == written
    (message,) = [r.getMessage() for r in caplog.records if r.name == "groupwise.run.journal"]
    assert message == (f"warning: {path}: ignoring its torn last line 4 (39 characters cut mid-write, e.g. by a "
                       "killed run)")
    path.write_text(json.dumps(written[0]) + "\nnot json\n" + json.dumps(written[1]) + "\n")
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        read_fates(path)


def test_write_refuses_an_incomplete_line_or_an_unknown_fate(tmp_path):
    writer = FatesWriter(tmp_path / "fates.jsonl")
    incomplete = {k: v for k, v in line(0).items() if k != "epoch"}
    with pytest.raises(ValueError, match=r"missing \['epoch'\]"):
        writer.write(incomplete)
    with pytest.raises(ValueError, match="unknown fate"):
        writer.write(line(0, "lost"))
    assert not (tmp_path / "fates.jsonl").exists()


def test_rollback_cuts_exactly_what_was_written_after_the_offset(tmp_path):
    path = tmp_path / "fates.jsonl"
    writer = FatesWriter(path)
    assert writer.offset() == 0
    kept = [line(0), line(1)]
    for entry in kept:
        writer.write(entry)
    offset = writer.offset()
    for i in range(2, 5):
        writer.write(line(i))
    with path.open("a") as handle:
        handle.write('{"group_id": 5')
    result = writer.rollback(offset)
    assert (result.dropped_lines, result.missing_bytes) == (3, 0)
    assert read_fates(path) == kept and path.stat().st_size == offset
    assert writer.rollback(offset).dropped_bytes == 0  # idempotent
    short = writer.rollback(offset + 100)
    assert short.missing_bytes == 100 and read_fates(path) == kept


@pytest.mark.parametrize(
    ("fate", "resolution", "interim"),
    [
        ("failed", "retried", True),
        ("pending", "requeued", True),
        ("carried", None, True),
        ("failed", "charged", False),
        ("failed", "replaced", False),
        ("pending", None, False),
        ("filtered", "replaced", False),
        ("aborted", "uncharged", False),
        ("trained", None, False),
        ("discarded", None, False),
    ],
)
def test_interim_lines_are_the_ones_that_do_not_settle_a_prompt(fate, resolution, interim):
    assert is_interim(line(0, fate, resolution=resolution)) is interim


def group(group_id: int, rewards: list[float]) -> Group:
    completions = [Completion((1,), (-0.1,), "x", "stop", 0) for _ in rewards]
    return Group(group_id, Prompt(uid=f"p{group_id}", answer=""), (1,), completions, rewards, rewards)


@pytest.mark.parametrize("carry", [True, False])
def test_a_sync_step_gives_every_generated_group_one_line(tmp_path, carry):
    writer = FatesWriter(tmp_path / "fates.jsonl")
    carried_in = group(0, [0.0, 1.0])
    generated = [group(1, [1.0, 1.0]), group(2, [0.0, 1.0]), group(3, [0.0, 0.0]), group(4, [1.0, 0.0])]
    trained, surplus, filtered = [carried_in, generated[1]], [generated[3]], [generated[0], generated[2]]
    write_sync_step_fates(writer, 7, generated, trained, surplus, carry, filtered)
    got = {(entry["group_id"], entry["fate"], entry["step"]) for entry in read_fates(writer.path)}
    surplus_fate = "carried" if carry else "discarded"
    assert got == {(0, "trained", 7), (2, "trained", 7), (4, surplus_fate, 7), (1, "filtered", 7), (3, "filtered", 7)}
    assert all(entry["mode"] == "sync" and set(entry) == set(LINE_FIELDS) for entry in read_fates(writer.path))
    with pytest.raises(AssertionError, match=r"group\(s\) \[4\] were generated but are neither trained"):
        write_sync_step_fates(writer, 8, generated, trained, [], carry, filtered)


def test_sync_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_fates(tmp_path):
    common = {
        "eval": {"at_start": False, "at_end": False},
        "checkpoint": {"every": 1, "keep_last": 2, "save_final": False},
        "logging": {"progress": False, "tensorboard": False},
    }
    surplus = {"dynamic_sampling": {"max_gen_rounds": 6, "min_step_batch_fraction": 0.25, "surplus": "carry"}}
    straight = run(tiny_config(tmp_path, run={"name": "straight", "max_steps": 4}, grpo=surplus, **common))
    first = run(tiny_config(tmp_path, run={"name": "killed", "max_steps": 2}, grpo=surplus, **common))
    # The process then trained part of step 3 and died before its checkpoint: its fate lines are on disk.
    for i, entry in enumerate(read_fates(first.fates.path)[:3]):
        first.fates.write(line(900 + i, prompt_uid=entry["prompt_uid"], step=2))
    resumed = run(tiny_config(tmp_path, run={"name": "killed", "max_steps": 4}, grpo=surplus, **common), resume=True)
    assert read_fates(resumed.fates.path) == read_fates(straight.fates.path)
    report = audit_run(resumed.run_dir.path, training_uids)
    assert report.ok, report.format()
    trained_steps = [entry["step"] for entry in read_fates(resumed.fates.path) if entry["fate"] == "trained"]
    assert {s: trained_steps.count(s) for s in set(trained_steps)} == {0: 4, 1: 4, 2: 4, 3: 4}
    fates = {entry["fate"] for entry in read_fates(straight.fates.path)}
    assert {"trained", "filtered"} <= fates  # the scripted reward makes some groups zero-variance


def test_carried_groups_that_fill_a_step_train_without_a_round_and_keep_their_fates(tmp_path):
    from groupwise.run.metrics import read_metrics

    ds = {"batch_multiplier": 3.0, "surplus": "carry", "max_gen_rounds": 6, "min_step_batch_fraction": 0.25}
    no_eval = {"at_start": False, "at_end": False}
    session = run(tiny_config(tmp_path, run={"max_steps": 4}, eval=no_eval, grpo={"dynamic_sampling": ds}))
    assert session.state.step == 4
    rounds = [r["ds/gen_rounds"] for r in read_metrics(session.run_dir.metrics_path) if "ds/gen_rounds" in r]
    assert 0.0 in rounds  # a step made only of carried groups
    lines = read_fates(session.fates.path)
    for i, entry in enumerate(lines):
        if entry["fate"] == "carried":
            later = [x["fate"] for x in lines[i + 1 :] if x["group_id"] == entry["group_id"]]
            assert later and later[0] in ("trained", "carried", "pending"), entry
    report = audit_run(session.run_dir.path, training_uids)
    assert report.ok, report.format()


def test_async_fate_records_carry_the_loader_epoch():
    prompts = make_prompts(6)
    records = []
    controller = build_controller(
        controller_settings(
            prompts_per_step=3, group_size=2, sampler=sampler_config("in_order", max_lookahead_versions=1),
            dynamic_sampling=False, max_buffered_rollouts=8,
        ),  # fmt: skip
        PromptLoader(prompts, seed=1, shuffle=True, max_epochs=2),
        ScriptedRollouts(2),
        RecordingTrainer(),
        on_fate=records.append,
    )
    run_virtual(controller.run)
    trained = [(r.epoch, r.prompt_uid) for r in records if r.fate == "trained"]
    assert sorted(trained) == sorted((epoch, p.uid) for epoch in (0, 1) for p in prompts)
