"""A run writes only inside its run directory: symbolic links in it are refused, never followed.

Invariants pinned:
- ``train --resume`` on a run directory holding a link (``fates.jsonl`` pointing at a file elsewhere, a linked
  ``checkpoints/`` or ``train_data/step_1.jsonl``) exits 2 before any model loads, naming ``run.name`` and the
  link, and the file the link points at is unchanged (before: ``--resume`` emptied and rewrote it);
- every run-file writer refuses a link at its path instead of writing through it: fates lines appended, a fates
  rollback (before: it truncated the outside file), a train_data file, an ``events.log`` line, an atomic text write
  (which replaces the link itself, leaving its target alone);
- the run directory itself may be a link (to put runs on another disk): it is followed, and the run writes inside
  its target;
- ``groupwise report`` refuses a linked ``plots/`` instead of writing plots through it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from groupwise.cli.main import main
from groupwise.run.fates_file import FatesWriter
from groupwise.run.journal import LinkedRunFileError, append_line
from groupwise.run.jsonl import write_rows_jsonl
from groupwise.run.metrics import MetricsWriter
from groupwise.run.rundir import RunDir, write_text_atomic

OUTSIDE = "a file that is not the run's\n"


def write_config(tmp_path: Path, output_dir: Path | None = None) -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(
        "model: {source: tiny, tiny: {num_layers: 1, hidden_size: 16, num_heads: 2, intermediate_size: 16, "
        "max_position_embeddings: 32}}\n"
        f"run: {{name: t, output_dir: {output_dir or tmp_path / 'runs'}, max_steps: 1}}\n"
        "data: {task: addition, addition: {num_eval: 4}}\n"
        "grpo: {num_prompts_per_step: 2, num_generations_per_prompt: 2, dynamic_sampling: {enabled: false}}\n"
        "generation: {max_new_tokens: 4}\n"
        "logging: {tensorboard: false, progress: false}\n"
        "eval: {at_start: false, at_end: false}\n"
        "checkpoint: {every: 1, save_final: false}\n", encoding="utf-8")
    return config


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished 1-step run, copied by each test that tampers with it."""
    tmp_path = tmp_path_factory.mktemp("finished")
    assert main(["train", str(write_config(tmp_path))]) == 0
    return tmp_path / "runs" / "t"


def copy_run(finished: Path, tmp_path: Path) -> Path:
    import shutil

    run = tmp_path / "runs" / "t"
    shutil.copytree(finished, run, symlinks=True)
    return run


@pytest.mark.parametrize("linked", ["fates.jsonl", "train_data/step_1.jsonl", "checkpoints"])
def test_resume_refuses_a_run_directory_holding_a_link(finished_run, tmp_path, capsys, linked):
    run = copy_run(finished_run, tmp_path)
    outside = tmp_path / "elsewhere"
    target = run / linked
    if target.is_dir():
        import shutil

        shutil.move(str(target), outside)
    else:
        outside.write_text(OUTSIDE, encoding="utf-8")
        target.unlink()
    target.symlink_to(outside)
    before = sorted(p.name for p in run.iterdir())
    code = main(["train", str(write_config(tmp_path)), "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert "run.name" in err and "symbolic links" in err and f"{target} -> {outside}" in err
    if outside.is_file():
        assert outside.read_text(encoding="utf-8") == OUTSIDE
    assert sorted(p.name for p in run.iterdir()) == before


def test_no_writer_follows_a_link_at_its_path(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text(OUTSIDE, encoding="utf-8")
    run = RunDir(tmp_path / "run")
    run.train_data_dir.mkdir(parents=True)
    for path in (run.fates_path, run.events_path, run.train_data_path(1), run.config_path):
        path.symlink_to(outside)
    fates = FatesWriter(run.fates_path)
    with pytest.raises(LinkedRunFileError, match="is a symbolic link"):
        fates.rollback(0)
    with pytest.raises(LinkedRunFileError):
        append_line(run.fates_path, json.dumps({"x": 1}) + "\n")
    with pytest.raises(LinkedRunFileError):
        write_rows_jsonl(run.train_data_path(1), {"group_id": [0], "x": [1]})
    with pytest.raises(LinkedRunFileError):
        MetricsWriter(run, tensorboard=False).event("an event")
    write_text_atomic(run.config_path, "run: {}\n")  # replaces the link, never writes through it
    assert not run.config_path.is_symlink() and run.config_path.read_text() == "run: {}\n"
    assert outside.read_text(encoding="utf-8") == OUTSIDE


def test_a_run_directory_that_is_itself_a_link_is_followed(tmp_path, capsys):
    disk = tmp_path / "bigger-disk" / "t"
    disk.mkdir(parents=True)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "t").symlink_to(disk, target_is_directory=True)
    assert main(["train", str(write_config(tmp_path))]) == 0
    assert (disk / "fates.jsonl").is_file() and (disk / "train_data" / "step_1.jsonl").is_file()
    capsys.readouterr()
    assert main(["audit", str(tmp_path / "runs" / "t")]) == 0


def test_report_refuses_a_linked_plots_directory(finished_run, tmp_path, capsys):
    run = copy_run(finished_run, tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (run / "plots").symlink_to(outside, target_is_directory=True)
    assert main(["report", str(run)]) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert list(outside.iterdir()) == []
