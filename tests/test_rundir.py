"""Run directory invariants.

- ``RunDir.create`` makes ``<output_dir>/<name>/`` (or a ``YYYYmmdd-HHMMSS`` name) and writes config.yaml.
- An existing non-empty run dir is refused unless resuming; the error names the dir and ``--resume``.
- Resuming keeps the directory's contents; a changed config is kept beside the new one, not lost.
- Every artifact has one fixed path (the layout other modules and users rely on).
- The edge modules import without torch (the CLI stays fast and ``groupwise.config`` stays torch-free).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from groupwise.run.rundir import RunDir, RunDirError


def test_create_named_run_writes_config(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "runs", "exp1", "mode: sync\n", resume=False)
    assert run.root == tmp_path / "runs" / "exp1"
    assert run.path == run.root
    assert (run.root / "config.yaml").read_text() == "mode: sync\n"
    assert run.resumed is False


def test_unnamed_run_gets_timestamp_and_never_collides(tmp_path: Path) -> None:
    first = RunDir.create(tmp_path, None, "a: 1\n", resume=False)
    second = RunDir.create(tmp_path, None, "a: 2\n", resume=False)
    assert re.fullmatch(r"\d{8}-\d{6}(-\d+)?", first.name)
    assert first.root != second.root
    assert (first.config_path.read_text(), second.config_path.read_text()) == ("a: 1\n", "a: 2\n")


def test_existing_nonempty_run_is_refused_without_resume(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "exp", "x: 1\n", resume=False)
    run.metrics_path.write_text('{"step": 1}\n')
    with pytest.raises(RunDirError) as info:
        RunDir.create(tmp_path, "exp", "x: 1\n", resume=False)
    assert str(run.root) in str(info.value) and "--resume" in str(info.value)
    assert run.metrics_path.read_text() == '{"step": 1}\n'


def test_existing_empty_dir_is_reused(tmp_path: Path) -> None:
    (tmp_path / "exp").mkdir()
    run = RunDir.create(tmp_path, "exp", "x: 1\n", resume=False)
    assert run.config_path.read_text() == "x: 1\n"


def test_resume_keeps_contents_and_old_config(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "exp", "max_steps: 10\n", resume=False)
    run.metrics_path.write_text('{"step": 1}\n')
    resumed = RunDir.create(tmp_path, "exp", "max_steps: 20\n", resume=True)
    assert resumed.resumed is True
    assert resumed.metrics_path.read_text() == '{"step": 1}\n'
    assert resumed.config_path.read_text() == "max_steps: 20\n"
    kept = [p for p in resumed.root.glob("config.*.yaml")]
    assert [p.read_text() for p in kept] == ["max_steps: 10\n"]


def test_resume_with_same_config_keeps_no_copy(tmp_path: Path) -> None:
    RunDir.create(tmp_path, "exp", "a: 1\n", resume=False).metrics_path.write_text("")
    RunDir.create(tmp_path, "exp", "a: 1\n", resume=True)
    assert sorted(p.name for p in (tmp_path / "exp").iterdir()) == ["config.yaml", "metrics.jsonl"]


def test_resume_of_missing_run_starts_fresh(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "new", "a: 1\n", resume=True)
    assert run.resumed is False and run.config_path.is_file()


def test_resume_needs_a_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="run.name"):
        RunDir.create(tmp_path, None, "a: 1\n", resume=True)


@pytest.mark.parametrize("name", ["", "..", "a/b", " padded"])
def test_bad_names_are_rejected(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="run.name"):
        RunDir.create(tmp_path, name, "a: 1\n", resume=False)
    assert not any(tmp_path.iterdir())


def test_artifact_layout(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "exp", "a: 1\n", resume=False)
    relative = {
        "metrics": run.metrics_path,
        "events": run.events_path,
        "train_data": run.train_data_path(7),
        "fates": run.fates_path,
        "checkpoint": run.checkpoint_path(12),
        "tensorboard": run.tensorboard_dir,
        "final": run.final_dir,
        "report": run.report_path,
        "plots": run.plots_dir,
        "sim": run.sim_summary_path,
    }
    assert {k: v.relative_to(run.root).as_posix() for k, v in relative.items()} == {
        "metrics": "metrics.jsonl",
        "events": "events.log",
        "train_data": "train_data/step_7.jsonl",
        "fates": "fates.jsonl",
        "checkpoint": "checkpoints/step_12",
        "tensorboard": "tensorboard",
        "final": "final",
        "report": "report.md",
        "plots": "plots",
        "sim": "sim/summary.json",
    }
    with pytest.raises(ValueError, match="step"):
        run.checkpoint_path(-1)


def test_edge_modules_import_without_torch() -> None:
    code = (
        "import sys, groupwise.run.rundir, groupwise.run.metrics, groupwise.run.metric_keys, groupwise.run.checkpoint,"
        " groupwise.run.report, groupwise.run.audit, groupwise.run.fates_file;"
        "assert 'torch' not in sys.modules, 'torch imported'; assert 'ray' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
