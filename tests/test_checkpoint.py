"""Checkpoint invariants (invariant 8 in docs/design.md: written atomically, resume equals continuing).

- Round trip: model tensors (tied weights included), optimizer and scheduler state, RNG, trainer JSON and
  extra pieces come back equal; a model loads them strictly; an optimizer resumed from them takes the same
  next step as the uninterrupted one (bit for bit: the same step on identical tensors).
- A crash mid-write (a piece raising) leaves no complete-looking checkpoint and no temp dir;
  ``latest_checkpoint`` skips a leftover ``.tmp-*`` dir, a dir without COMPLETE and a corrupted or
  truncated file, and returns the previous checkpoint; ``load_checkpoint`` refuses those with a clear error.
- ``keep_last`` keeps the newest complete checkpoints at or below the saved step; stale temp dirs go.
- RNG capture → restore reproduces the same python, numpy and torch draws (also through a checkpoint).
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from groupwise.run.checkpoint import (
    CheckpointError,
    capture_rng_state,
    latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from groupwise.run.rundir import RunDir

pytestmark = pytest.mark.numerics


class TiedLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 4)
        self.hidden = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 11, bias=False)
        self.head.weight = self.embed.weight  # tied, as in the tiny Llama policies

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.hidden(self.embed(ids))))


def _train_step(model: TiedLM, optimizer: torch.optim.Optimizer, scheduler) -> None:
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()


def _components(seed: int = 0):
    torch.manual_seed(seed)
    model = TiedLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return model, optimizer, scheduler


@pytest.fixture
def run(tmp_path: Path) -> RunDir:
    return RunDir.create(tmp_path, "exp", "a: 1\n", resume=False)


def _small_state(step: int) -> dict:
    return {"model": {"w": torch.full((3,), float(step))}, "trainer": {"step": step}}


def test_round_trip_restores_everything(run: RunDir) -> None:
    model, optimizer, scheduler = _components()
    _train_step(model, optimizer, scheduler)
    trainer = {"step": 1, "loader": {"epoch": 0, "position": 16}, "carried": [{"group_id": 3, "rewards": [0.0, 1.0]}]}
    extra = {"spare_pool": ["a/1", "a/2"], "buffer": {"ids": torch.arange(4), "versions": (1, 2)}}
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "rng": capture_rng_state(), "trainer": trainer, "extra": extra}
    path = save_checkpoint(run, 1, state, keep_last=2)
    assert path == run.checkpoint_path(1)
    assert sorted(p.name for p in path.rglob("*") if p.is_file()) == [
        "COMPLETE", "buffer.pt", "model.safetensors", "optimizer.pt", "rng.pt", "scheduler.pt", "spare_pool.json",
        "trainer_state.json",
    ]
    loaded = load_checkpoint(path)
    assert loaded["trainer"] == trainer and loaded["extra"]["spare_pool"] == ["a/1", "a/2"]
    buffer = loaded["extra"]["buffer"]
    assert torch.equal(buffer["ids"], torch.arange(4)) and buffer["versions"] == (1, 2)
    original = model.state_dict()
    assert set(loaded["model"]) == set(original)
    assert all(torch.equal(loaded["model"][k], original[k]) for k in original)

    # Resume into fresh components: the next step must equal the uninterrupted run's next step.
    resumed, resumed_opt, resumed_sched = _components(seed=123)
    resumed.load_state_dict(loaded["model"], strict=True)
    resumed_opt.load_state_dict(loaded["optimizer"])
    resumed_sched.load_state_dict(loaded["scheduler"])
    assert resumed.head.weight is resumed.embed.weight
    _train_step(model, optimizer, scheduler)
    _train_step(resumed, resumed_opt, resumed_sched)
    after, after_resumed = model.state_dict(), resumed.state_dict()
    assert all(torch.equal(after[k], after_resumed[k]) for k in after)


def test_views_into_one_buffer_round_trip(run: RunDir) -> None:
    buffer = torch.arange(12.0)
    views = {"first": buffer[:4], "rest": buffer[4:].view(2, 4), "strided": buffer.view(3, 4).t()}
    loaded = load_checkpoint(save_checkpoint(run, 1, {"model": views}, keep_last=1))["model"]
    assert all(torch.equal(loaded[k], v) for k, v in views.items()) and set(loaded) == set(views)


def test_manifest_lists_every_file_with_size_and_hash(run: RunDir) -> None:
    path = save_checkpoint(run, 3, _small_state(3), keep_last=1)
    manifest = json.loads((path / "COMPLETE").read_text())
    assert manifest["step"] == 3
    on_disk = {p.relative_to(path).as_posix(): p.stat().st_size for p in path.rglob("*") if p.name != "COMPLETE"}
    assert {name: entry["size"] for name, entry in manifest["files"].items()} == on_disk


class Explodes:
    def __reduce__(self):
        raise RuntimeError("disk full (simulated)")


def test_crash_mid_write_leaves_the_previous_checkpoint_latest(run: RunDir) -> None:
    save_checkpoint(run, 1, _small_state(1), keep_last=5)
    with pytest.raises(RuntimeError, match="simulated"):
        save_checkpoint(run, 2, {**_small_state(2), "extra": {"boom": Explodes()}}, keep_last=5)
    assert sorted(p.name for p in run.checkpoints_dir.iterdir()) == ["step_1"]
    assert latest_checkpoint(run) == run.checkpoint_path(1)


def test_leftovers_and_corruption_are_skipped(run: RunDir, caplog: pytest.LogCaptureFixture) -> None:
    for step in (1, 2):
        save_checkpoint(run, step, _small_state(step), keep_last=5)
    # A crashed writer's temp dir that even holds a manifest: not a checkpoint name.
    stale = run.checkpoints_dir / ".tmp-step_9-4242"
    stale.mkdir()
    (stale / "COMPLETE").write_text("{}")
    # A step dir without COMPLETE.
    (run.checkpoints_dir / "step_5").mkdir()
    (run.checkpoints_dir / "step_5" / "trainer_state.json").write_text('{"step": 5}')
    # A complete step whose file was corrupted afterwards (same size, one byte flipped).
    corrupted = save_checkpoint(run, 4, _small_state(4), keep_last=5)
    data = bytearray((corrupted / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (corrupted / "model.safetensors").write_bytes(bytes(data))
    # A complete step whose file was truncated.
    truncated = save_checkpoint(run, 3, _small_state(3), keep_last=5)
    (truncated / "trainer_state.json").write_text("{")
    with caplog.at_level(logging.WARNING, logger="groupwise.run.checkpoint"):
        assert latest_checkpoint(run) == run.checkpoint_path(2)
    log = caplog.text
    assert "step 5" in log and "COMPLETE" in log and "step 4" in log and "sha256" in log and "bytes" in log
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(corrupted)
    with pytest.raises(CheckpointError, match="COMPLETE"):
        load_checkpoint(run.checkpoints_dir / "step_5")
    assert not stale.exists()  # removed by the saves after it appeared


def test_keep_last_prunes_older_complete_checkpoints(run: RunDir) -> None:
    for step in range(1, 6):
        save_checkpoint(run, step, _small_state(step), keep_last=2)
    assert sorted(p.name for p in run.checkpoints_dir.iterdir()) == ["step_4", "step_5"]
    assert load_checkpoint(latest_checkpoint(run))["trainer"] == {"step": 5}


def test_rewound_run_keeps_later_steps_and_replaces_a_resaved_step(run: RunDir) -> None:
    for step in (1, 2, 3, 4):
        save_checkpoint(run, step, _small_state(step), keep_last=10)
    save_checkpoint(run, 2, {"trainer": {"step": 2, "again": True}}, keep_last=1)
    assert sorted(p.name for p in run.checkpoints_dir.iterdir()) == ["step_2", "step_3", "step_4"]
    assert load_checkpoint(run.checkpoint_path(2)) == {"trainer": {"step": 2, "again": True}}


def test_bad_state_is_refused_before_anything_is_written(run: RunDir) -> None:
    with pytest.raises(ValueError, match="keep_last"):
        save_checkpoint(run, 1, _small_state(1), keep_last=0)
    with pytest.raises(ValueError, match="unknown checkpoint state keys.*optimiser"):
        save_checkpoint(run, 1, {"optimiser": {}}, keep_last=1)
    with pytest.raises(ValueError, match="JSON round trip"):
        save_checkpoint(run, 1, {"trainer": {"position": (1, 2)}}, keep_last=1)
    with pytest.raises(ValueError, match="weights_only"):
        save_checkpoint(run, 1, {"extra": {"odd": Path("x")}}, keep_last=1)
    assert latest_checkpoint(run) is None
    assert [p.name for p in run.checkpoints_dir.iterdir()] == []


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist(), torch.randint(0, 1000, (2,)).tolist()


def test_rng_capture_restore_repeats_the_draws(run: RunDir) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = capture_rng_state()
    expected = _draws()
    assert _draws() != expected  # the sources really moved on
    restore_rng_state(state)
    assert _draws() == expected
    save_checkpoint(run, 1, {"rng": state}, keep_last=1)
    _draws()
    restore_rng_state(load_checkpoint(run.checkpoint_path(1))["rng"])
    assert _draws() == expected
