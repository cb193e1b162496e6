"""``groupwise audit`` on ``train_data``: the step files agree with ``fates.jsonl``, and the per-token weight versions
the files carry (``version_spans``) respect the sampler's staleness bound.

Invariants pinned (on crafted run directories, and on a real resumed run):
- a clean directory passes: a file per step with trained fates, holding exactly those groups with G rows each,
  spans covering each completion, versions between the group's start version and the trainer's;
- a step file with no trained fates (left by a step a resume undid), a file whose groups differ from the fates, a
  group with too few rows, and a step whose metrics line exists but whose file does not are violations; a step
  with neither file nor metrics line (the run stopped inside it) is not;
- spans that do not cover the completion, a token from a version after the trainer's, or before the group's
  ``start_version``, are violations;
- a token older than the bound fails for the schedules that bound staleness (``windowed`` and ``weight_fifo``:
  ``max_staleness_versions``; ``in_order``: ``max_lookahead_versions``; sync without carried surplus: 0), while
  ``ready_first`` (no selection bound) only reports the largest staleness;
- a run with ``logging.train_data: false`` is not checked;
- ``--resume`` from an earlier checkpoint removes the train_data files of the steps it undid, and the audit of the
  resumed run passes (before, ``step_3.jsonl`` stayed behind and the audit said OK).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from groupwise.cli.main import main
from groupwise.config import config_from_dict
from groupwise.run.rundir import RunDir
from groupwise.run.train_data_audit import audit_train_data

G = 2


def cfg_of(mode: str = "async", sampler: dict | None = None, **sections):
    data = {"model": {"source": "tiny"}, "mode": mode, "grpo": {"num_prompts_per_step": 2,
                                                              "num_generations_per_prompt": G}, **sections}  # fmt: skip
    if mode == "async":
        data["async"] = {"sampler": sampler or {"name": "windowed", "max_staleness_versions": 1}}
    return config_from_dict(data)


def trained(group_id: int, step: int) -> dict:
    return {"group_id": group_id, "prompt_uid": f"p{group_id}", "epoch": 0, "attempt": 0, "start_version": 0,
            "fate": "trained", "step": step, "resolution": None, "detail": "", "mode": "async", "tokens": 0}


def row(group_id: int, spans: list[list[int]], start_version: int, tokens: int | None = None) -> dict:
    count = sum(n for _, n in spans) if tokens is None else tokens
    return {"group_id": group_id, "completion_ids": list(range(count)), "start_version": start_version,
            "version_spans": spans}


def write_run(tmp_path: Path, files: dict[int, list[dict]], logged_steps: list[int]) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.train_data_dir.mkdir(parents=True)
    for step, rows in files.items():
        run.train_data_path(step).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    run.metrics_path.write_text("".join(json.dumps({"step": s, "loss/total": 0.0}) + "\n" for s in logged_steps))
    return run


def clean(tmp_path: Path) -> tuple[RunDir, list[dict]]:
    """Steps 1..3 (trained by versions 0..2); step 3's group 2 started at version 1 and continued under 2."""
    files = {
        1: [row(0, [[0, 3]], 0), row(0, [[0, 1]], 0)],
        2: [row(1, [[1, 2]], 1), row(1, [[0, 1], [1, 2]], 0)],
        3: [row(2, [[1, 2], [2, 3]], 1), row(2, [[2, 1]], 2)],
    }
    return write_run(tmp_path, files, [1, 2, 3]), [trained(0, 0), trained(1, 1), trained(2, 2)]


def test_a_clean_run_passes_and_reports_its_largest_staleness(tmp_path):
    run, lines = clean(tmp_path)
    audit = audit_train_data(run, lines, cfg_of())
    assert audit is not None and audit.ok, audit.format_lines()
    assert (audit.files, audit.rows, audit.bound, audit.max_staleness) == (3, 6, 1, 1)


def test_a_step_file_without_trained_fates_and_a_lost_step_are_violations(tmp_path):
    run, lines = clean(tmp_path)
    extra = run.train_data_path(4)
    extra.write_text(json.dumps(row(3, [[3, 1]], 3)) + "\n" + json.dumps(row(3, [[3, 1]], 3)) + "\n")
    audit = audit_train_data(run, lines, cfg_of())
    assert audit.extra_files == ["step_4.jsonl"] and not audit.ok
    extra.unlink()
    run.train_data_path(3).unlink()
    audit = audit_train_data(run, lines, cfg_of())
    assert audit.missing_files == ["step 3"]
    run.metrics_path.write_text("".join(json.dumps({"step": s, "loss/total": 0.0}) + "\n" for s in (1, 2)))
    assert audit_train_data(run, lines, cfg_of()).ok  # stopped inside step 3: no metrics line, no file


def test_groups_that_differ_from_the_fates_are_violations(tmp_path):
    run, lines = clean(tmp_path)
    lines[2] = trained(5, 2)
    audit = audit_train_data(run, lines, cfg_of())
    assert audit.group_mismatches == ["step 3 (only in the file: [2], only in fates: [5])"]
    run, lines = clean(tmp_path / "short")
    run.train_data_path(1).write_text(json.dumps(row(0, [[0, 3]], 0)) + "\n")
    assert audit_train_data(run, lines, cfg_of()).group_mismatches == ["step 1 (groups without 2 rows: [0])"]


@pytest.mark.parametrize(("bad", "kind"), [
    (row(1, [[1, 2]], 1, tokens=3), "bad_spans"),   # spans cover 2 of 3 tokens
    (row(1, [[0, 1]], 1), "bad_spans"),             # a token before the group's start version
    (row(1, [[1, 1], [2, 1]], 1), "future_tokens"),  # step 2 is trained by version 1
])  # fmt: skip
def test_spans_that_do_not_describe_the_tokens_are_violations(tmp_path, bad, kind):
    run, lines = clean(tmp_path)
    run.train_data_path(2).write_text(json.dumps(row(1, [[1, 2]], 1)) + "\n" + json.dumps(bad) + "\n")
    audit = audit_train_data(run, lines, cfg_of())
    assert len(getattr(audit, kind)) == 1 and audit.violations == 1, audit.format_lines()
    assert getattr(audit, kind)[0].startswith("step 2 line 2")


@pytest.mark.parametrize(("mode", "sampler", "sections", "bound"), [
    ("async", {"name": "windowed", "max_staleness_versions": 1}, {}, 1),
    ("async", {"name": "weight_fifo", "max_staleness_versions": 1}, {"grpo": None}, 1),
    ("async", {"name": "in_order", "max_lookahead_versions": 1}, {}, 1),
    ("async", {"name": "ready_first", "max_staleness_versions": 1}, {}, None),
    ("sync", None, {}, 0),
])  # fmt: skip
def test_a_token_older_than_the_bound_fails_where_the_schedule_bounds_staleness(tmp_path, mode, sampler, sections,
                                                                               bound):
    if "grpo" in sections:  # weight_fifo cannot run with dynamic sampling
        sections = {"grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": G,
                             "dynamic_sampling": {"enabled": False}}}  # fmt: skip
    cfg = cfg_of(mode, sampler, **sections)
    run, lines = clean(tmp_path)
    # step 3 (trainer version 2) trains a group that started at version 0: staleness 2
    run.train_data_path(3).write_text(json.dumps(row(2, [[0, 1], [2, 2]], 0)) + "\n"
                                      + json.dumps(row(2, [[2, 1]], 0)) + "\n")
    audit = audit_train_data(run, lines, cfg)
    assert audit.bound == bound and audit.max_staleness == 2
    if bound is None:
        assert audit.ok
    else:
        assert f"step 3 line 1 (staleness 2 > {bound})" in audit.too_stale and not audit.ok
        assert len(audit.too_stale) == (1 if bound else 2)  # sync: the fixture's staleness-1 row (step 2) too


def test_a_run_without_train_data_is_not_checked(tmp_path):
    run, lines = clean(tmp_path)
    assert audit_train_data(run, lines, cfg_of(logging={"train_data": False})) is None


def test_a_resume_from_an_earlier_checkpoint_removes_the_undone_steps_train_data(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(
        "model: {source: tiny, tiny: {num_layers: 1, hidden_size: 16, num_heads: 2, intermediate_size: 16, "
        "max_position_embeddings: 32}}\n"
        f"run: {{name: t, output_dir: {tmp_path / 'runs'}, max_steps: 3}}\n"
        "data: {task: addition, addition: {num_eval: 4}}\n"
        "grpo: {num_prompts_per_step: 2, num_generations_per_prompt: 2, dynamic_sampling: {enabled: false}}\n"
        "generation: {max_new_tokens: 4}\n"
        "logging: {tensorboard: false, progress: false}\n"
        "eval: {at_start: false, at_end: false}\n"
        "checkpoint: {every: 1, keep_last: 3, save_final: false}\n", encoding="utf-8")
    assert main(["train", str(config)]) == 0
    run = tmp_path / "runs" / "t"
    shutil.rmtree(run / "checkpoints" / "step_3")
    assert main(["train", str(config), "run.max_steps=2", "--resume"]) == 0
    assert sorted(p.name for p in (run / "train_data").iterdir()) == ["step_1.jsonl", "step_2.jsonl"]
    assert "removed 1 train_data file(s) of steps after 2" in (run / "events.log").read_text(encoding="utf-8")
    capsys.readouterr()
    assert main(["audit", str(run)]) == 0
    assert "train_data: 2 step file(s), 8 row(s)" in capsys.readouterr().out
