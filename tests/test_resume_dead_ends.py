"""No dead end at the start of a run: every state a failed start or a crash leaves can be continued.

Invariants pinned here (``groupwise train`` in process, a tiny random model):
- a run killed during its first checkpoint write (only ``checkpoints/.tmp-step_1-*`` on disk) is refused by a
  plain restart with a pointer to ``--resume``, and ``--resume`` starts it again from step 0: events.log says so,
  the partial checkpoint, metrics, fates and train data of the earlier attempt are gone, and the run trains
  exactly what a fresh run trains (same train data) with every prompt's fate recorded once (audit passes);
- ``--resume`` on a run name that does not exist yet starts that run fresh;
- ``--resume`` with ``run.name: null`` is one message (exit 2) naming run.name, and creates nothing;
- a failed start (a checkpoint that does not fit) leaves no new run directory behind;
- a save that fails because the disk is full (torch's ``unexpected pos`` text or ``OSError(ENOSPC)``) ends the run
  with exit 1 and says the disk is full, which checkpoint was kept (untouched, no partial directory left) and that
  ``--resume`` continues; after space is freed ``--resume`` does continue to the end.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

import groupwise.run.checkpoint as checkpoint
from groupwise.cli.main import main
from groupwise.run.metrics import read_metrics

TINY_MODEL = ("{source: tiny, tiny: {num_layers: 1, hidden_size: 16, num_heads: 2, intermediate_size: 16, "
              "max_position_embeddings: 32}}")


def write_config(tmp_path: Path, name: str | None = "t", max_steps: int = 2) -> Path:
    text = (
        f"model: {TINY_MODEL}\n"
        f"run: {{name: {'null' if name is None else name}, output_dir: {tmp_path / 'runs'}, max_steps: {max_steps}}}\n"
        "data: {task: addition, addition: {num_eval: 4}}\n"
        "grpo: {num_prompts_per_step: 2, num_generations_per_prompt: 2, dynamic_sampling: {enabled: false}}\n"
        "generation: {max_new_tokens: 4}\n"
        "logging: {tensorboard: false, progress: false}\n"
        "eval: {at_start: false, at_end: false}\n"
        "checkpoint: {every: 1, save_final: false}\n"
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def metric_steps(run_dir: Path) -> list[int]:
    return [record["step"] for record in read_metrics(run_dir / "metrics.jsonl")]


def test_a_run_killed_in_its_first_checkpoint_write_resumes_from_step_0(tmp_path, capsys, monkeypatch):
    config = write_config(tmp_path)
    run_dir = tmp_path / "runs" / "t"

    def die_mid_write(directory, state):  # SIGKILL after the first piece hit the disk: no cleanup runs
        (directory / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(checkpoint, "_write_pieces", die_mid_write)
    monkeypatch.setattr(checkpoint.shutil, "rmtree", lambda *args, **kwargs: None)
    with pytest.raises(KeyboardInterrupt):
        main(["train", str(config)])
    monkeypatch.undo()
    assert [p.name for p in (run_dir / "checkpoints").iterdir()][0].startswith(".tmp-step_1-")
    assert metric_steps(run_dir) == [1] and (run_dir / "train_data" / "step_1.jsonl").exists()

    assert main(["train", str(config)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["train", str(config), "--resume"]) == 0
    events = (run_dir / "events.log").read_text(encoding="utf-8")
    assert "holds no complete checkpoint, so the run starts again from step 0" in events
    assert "1 partial checkpoint(s)" in events
    assert metric_steps(run_dir) == [1, 2]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_1", "step_2"]
    assert main(["audit", str(run_dir)]) == 0

    fresh = write_config(tmp_path, name="fresh")
    assert main(["train", str(fresh)]) == 0
    for step in (1, 2):
        again = (run_dir / "train_data" / f"step_{step}.jsonl").read_text(encoding="utf-8")
        assert again == (tmp_path / "runs" / "fresh" / "train_data" / f"step_{step}.jsonl").read_text(encoding="utf-8")


def test_resume_on_a_run_that_does_not_exist_starts_it(tmp_path):
    config = write_config(tmp_path, name="new", max_steps=1)
    assert main(["train", str(config), "--resume"]) == 0
    run_dir = tmp_path / "runs" / "new"
    assert "run started" in (run_dir / "events.log").read_text(encoding="utf-8")
    assert metric_steps(run_dir) == [1]


def test_resume_without_a_run_name_is_one_message_and_creates_nothing(tmp_path, capsys):
    assert main(["train", str(write_config(tmp_path, name=None)), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "run.name" in err and "--resume needs the name of the run" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_a_failed_start_leaves_no_new_run_directory(tmp_path, capsys):
    other = write_config(tmp_path, name="other", max_steps=1)
    assert main(["train", str(other)]) == 0
    saved = tmp_path / "runs" / "other" / "checkpoints" / "step_1"
    config = write_config(tmp_path, name="fresh")
    # a checkpoint of another model (more layers) cannot be loaded into this one
    bigger = config.read_text().replace("num_layers: 1", "num_layers: 2")
    config.write_text(bigger, encoding="utf-8")
    assert main(["train", str(config), "--resume-from", str(saved)]) == 2
    err = capsys.readouterr().err
    assert f"cannot resume from {saved}" in err and "Traceback" not in err
    assert not (tmp_path / "runs" / "fresh").exists()


@pytest.mark.parametrize(
    "error",
    [RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 470"),
     OSError(errno.ENOSPC, "No space left on device")],
    ids=["torch-zip-writer", "enospc"],
)
def test_a_full_disk_says_so_keeps_the_last_checkpoint_and_resume_continues(tmp_path, capsys, monkeypatch, error):
    config = write_config(tmp_path, max_steps=3)
    run_dir = tmp_path / "runs" / "t"
    real_write = checkpoint._write_pieces

    def full_at_step_2(directory, state):
        if directory.name.startswith(".tmp-step_2-"):
            (directory / "model.safetensors").write_bytes(b"partial")
            raise error
        real_write(directory, state)

    monkeypatch.setattr(checkpoint, "_write_pieces", full_at_step_2)
    assert main(["train", str(config)]) == 1
    err = capsys.readouterr().err
    kept = run_dir / "checkpoints" / "step_1"
    assert "the disk is full: writing checkpoint step 2 failed" in err
    assert f"kept {kept} (the newest complete checkpoint)" in err and "--resume" in err
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_1"]
    checkpoint.verify_checkpoint(kept)
    monkeypatch.undo()  # space freed
    assert main(["train", str(config), "--resume"]) == 0
    assert metric_steps(run_dir) == [1, 2, 3]
    assert json.loads((run_dir / "checkpoints" / "step_3" / "trainer_state.json").read_text())["step"] == 3
