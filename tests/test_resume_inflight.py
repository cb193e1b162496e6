"""Resume keeps in-flight tokens: a running attempt saved with its progress continues after ``--resume``.

Invariants pinned:
- controller: a snapshot saves, per running attempt, what its rollout client reports (``progress(group_id)``); a
  restore under the same sampler reserves those attempts again under their own group ids and start versions, in
  dispatch order among the restored ready groups, writes no ``requeued`` fate for them, and hands each its
  progress (``rollout(..., resume=...)``) when it is dispatched first; the continued groups train with their
  original start version (staleness counts from their oldest token), and the fates of both halves audit clean;
  restoring into another sampler starts them over (``requeued``) with a note;
- embedded runtime (real engine, continuous batching, partial rollouts): with weights that do not change (lr 1e-30:
  every update rounds away), a run checkpointed while attempts were generating and then resumed produces, for
  every attempt, the same completion tokens as an uninterrupted run, with logprobs within 1e-4; the tokens
  continued instead of generated again are counted in ``rollout/resumed_tokens`` and in ``events.log``, and the
  run audits clean.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from fakes import RecordingTrainer, ScriptedRollouts, make_loader, make_prompts, run_virtual
from test_async_resume import N_PROMPTS, SCENARIOS, G, as_lines, latencies, settings
from test_sync_trainer import tiny_config

from groupwise.cli.run_prompts import training_uids
from groupwise.config import config_from_dict
from groupwise.controller.controller import build_controller
from groupwise.run.async_checkpoint import ItemDecoder, encode_item
from groupwise.run.audit import audit_fates, audit_run
from groupwise.run.checkpoint import load_checkpoint, save_checkpoint


class ProgressRollouts(ScriptedRollouts):
    """Scripted rollouts that report progress (virtual seconds generated so far) and continue from it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.started: dict[int, tuple[float, float]] = {}  # group id -> (start time, seconds already done)
        self.resumed: list[tuple[int, dict]] = []
        self.resumed_tokens = 0

    def progress(self, group_id: int) -> dict | None:
        if group_id not in self.started:
            return None
        start, done = self.started[group_id]
        return {"done": done + asyncio.get_running_loop().time() - start}

    async def fetch_progress(self) -> dict[int, dict]:
        return {group_id: self.progress(group_id) for group_id in self.started}

    async def resume(self, prompt, group_id, attempt, start_version, progress):
        self.resumed.append((group_id, progress))
        self.resumed_tokens += 1
        return await self.rollout(prompt, group_id, attempt, start_version, progress["done"])

    async def rollout(self, prompt, group_id, attempt, start_version, done=0.0):
        self.started[group_id] = (asyncio.get_running_loop().time(), done)
        outcome = self.outcome(prompt.prompt.uid, attempt)
        saved = self.script.get(prompt.prompt.uid)
        # Only the time not yet generated is left to wait for.
        self.script[prompt.prompt.uid] = [type(outcome)(max(0.0, outcome.latency - done), outcome.rewards,
                                                        outcome.fail)] * (attempt + 1)  # fmt: skip
        try:
            return await super().rollout(prompt, group_id, attempt, start_version)
        finally:
            self.started.pop(group_id, None)
            if saved is None:
                self.script.pop(prompt.prompt.uid, None)
            else:
                self.script[prompt.prompt.uid] = saved


def _first_part(scenario, tmp_path):
    k = scenario["snapshot_after"]
    loader, fates, saved, controller = make_loader(N_PROMPTS), [], {}, None
    rollouts = ProgressRollouts(G, script=latencies(0, scenario["script"]))

    def snapshot(step, metrics, groups):
        if step + 1 == k:
            saved["controller"] = controller.state_dict(encode_item, rollouts.progress)
            saved["loader"] = loader.state_dict()
            saved["fates_cut"] = len(fates)

    controller = build_controller(settings(scenario, max_steps=k), loader, rollouts, RecordingTrainer(),
                                  on_step_end=snapshot, on_fate=fates.append)  # fmt: skip
    run_virtual(controller.run)
    path = save_checkpoint(tmp_path, k, {"trainer": {"loader": saved["loader"]}, "extra": saved}, keep_last=1)
    return load_checkpoint(path)["extra"], fates[: saved["fates_cut"]]


def _resume(scenario, loaded):
    loader = make_loader(N_PROMPTS)
    loader.load_state_dict(loaded["loader"])
    fates, trainer = [], RecordingTrainer()
    rollouts = ProgressRollouts(G, script=latencies(0, scenario["script"]))
    controller = build_controller(
        settings(scenario, start_step=scenario["snapshot_after"]), loader, rollouts, trainer, on_fate=fates.append,
        state=loaded["controller"], decode=ItemDecoder(make_prompts(N_PROMPTS)),
    )  # fmt: skip
    return controller, rollouts, fates, trainer


def test_running_attempts_continue_in_place_after_a_resume(tmp_path):
    scenario = SCENARIOS["ready_first_spares"]
    loaded, first_fates = _first_part(scenario, tmp_path)
    saved = loaded["controller"]
    running = [s for s in saved["inflight_slots"] if s["progress"] is not None]
    assert running and all(s["group_id"] is not None and s["progress"]["done"] > 0 for s in running)
    controller, rollouts, fates, trainer = _resume(scenario, loaded)
    assert controller.continued_attempts() == [s["progress"] for s in running]
    assert not [r for r in fates if r.resolution == "requeued"]
    buffer = controller.ctx.buffer
    ready_ids = {g["group"]["group_id"] for g in saved["buffer"]["groups"]}
    reserved = {s["group_id"]: s["start_version"] for s in running}
    assert len(buffer) == len(ready_ids) + len(reserved) and buffer.ready_count == len(ready_ids)
    assert buffer.next_slot_id == saved["buffer"]["next_slot_id"]
    run_virtual(controller.run)
    assert sorted(rollouts.resumed, key=lambda pair: pair[0]) == sorted(
        (s["group_id"], s["progress"]) for s in running
    )
    trained = {g.group_id: g.start_version for chunk in trainer.chunks for g in chunk.groups}
    assert {gid: trained[gid] for gid in reserved if gid in trained} == {
        gid: version for gid, version in reserved.items() if gid in trained
    } and set(reserved) & set(trained)
    report = audit_fates(as_lines(first_fates + fates), [p.uid for p in make_prompts(N_PROMPTS)])
    assert report.ok, report.format()


def test_another_sampler_starts_the_running_attempts_over(tmp_path):
    scenario = SCENARIOS["ready_first_spares"]
    loaded, _ = _first_part(scenario, tmp_path)
    running = [s for s in loaded["controller"]["inflight_slots"] if s["progress"] is not None]
    other = {**scenario, "sampler": "windowed", "knobs": {"max_staleness_versions": 1}}
    controller, rollouts, fates, _ = _resume(other, loaded)
    assert controller.continued_attempts() == []
    assert sorted(r.group_id for r in fates if r.resolution == "requeued") == sorted(s["group_id"] for s in running)
    assert any(f"{len(running)} in-flight attempt(s) start again" in note for note in controller.resume_notes)


# --- the embedded runtime --------------------------------------------------------------------------------------


def _streamed_config(tmp_path: Path, name: str, max_steps: int, **async_section) -> dict:
    data = tiny_config(
        tmp_path,
        run={"name": name, "max_steps": max_steps},
        eval={"at_start": False, "at_end": False},
        checkpoint={"every": 1, "keep_last": 10, "save_final": False},
        logging={"progress": False, "tensorboard": False},
        generation={"max_new_tokens": 24, "continuous_batching": True},
        optimizer={"lr": 1e-30},  # every update rounds away: the weights do not change
        model={"tiny": {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64,
                        "max_position_embeddings": 64}},
    ).model_dump(by_alias=True)  # fmt: skip
    data["mode"] = "async"
    data["grpo"]["dynamic_sampling"] = {"enabled": False}
    data["loss"]["importance_sampling"] = True
    data["async"] = {
        "sampler": {"name": "ready_first", "max_staleness_versions": 2},
        "max_buffered_rollouts": 12,
        "max_inflight_prompts": 8,
        "partial_rollouts": "continue",
        **async_section,
    }
    return data


def _completions_by_attempt(run_dir: Path) -> dict[tuple[str, int], list]:
    """(prompt uid, group id) -> the trained completions' token ids, from train_data."""
    out: dict = {}
    for path in sorted((run_dir / "train_data").glob("step_*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            out.setdefault((row["prompt_uid"], row["group_id"]), []).append(
                (row["completion_index"], row["completion_ids"], row["generation_logprobs"])
            )
    return out


@pytest.mark.slow
def test_a_resumed_run_continues_in_flight_attempts_with_the_same_tokens(tmp_path, monkeypatch):
    import time

    from groupwise.generation.stream_slots import SlotRows
    from groupwise.run.metrics import read_metrics
    from groupwise.runtime.async_run import run_async
    from groupwise.trainer.builder import build_session

    step = SlotRows.step

    def slow_step(self):  # generation slower than training, so every step boundary finds attempts mid-generation
        time.sleep(0.01)
        return step(self)

    monkeypatch.setattr(SlotRows, "step", slow_step)
    full = build_session(config_from_dict(_streamed_config(tmp_path, "full", 6)))
    run_async(full)
    cut = build_session(config_from_dict(_streamed_config(tmp_path, "cut", 3)))
    run_async(cut)
    state = load_checkpoint(cut.run_dir.path / "checkpoints" / "step_3")["extra"]["controller"]
    kept = sum(len(r["token_ids"]) for s in state["inflight_slots"] if s["progress"]
               for r in s["progress"]["rows"] if r)  # fmt: skip
    assert kept > 0, "the checkpoint must hold attempts that were mid-generation"
    resumed = build_session(config_from_dict(_streamed_config(tmp_path, "cut", 6)), resume=True)
    run_async(resumed)
    run_dir = resumed.run_dir.path
    metrics = read_metrics(run_dir / "metrics.jsonl")
    assert sum(m.get("rollout/resumed_tokens", 0) for m in metrics) == kept
    assert f"with {kept} generated token(s) kept" in (run_dir / "events.log").read_text()
    report = audit_run(run_dir, training_uids)
    assert report.ok, report.format()
    # Weights never change, so an attempt's tokens depend only on its seed: compare per prompt attempt.
    uninterrupted = {uid: rows for (uid, _), rows in _completions_by_attempt(full.run_dir.path).items()}
    continued = {s["prompt"]["uid"] for s in state["inflight_slots"] if s["progress"]}
    both = [(uid, rows) for (uid, _), rows in _completions_by_attempt(run_dir).items() if uid in uninterrupted]
    assert {uid for uid, _ in both} & continued, "a continued attempt must be trained in both runs"
    for uid, rows in both:
        expected = sorted(uninterrupted[uid])
        assert [(i, ids) for i, ids, _ in sorted(rows)] == [(i, ids) for i, ids, _ in expected], uid
        for (_, _, got), (_, _, want) in zip(sorted(rows), expected, strict=True):
            assert max((abs(a - b) for a, b in zip(got, want, strict=True)), default=0.0) < 1e-4

