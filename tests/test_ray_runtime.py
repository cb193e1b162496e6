"""The Ray runtime end to end on a local 2-CPU Ray cluster (one per test session), on a tiny model: sync mode, LoRA,
learner failures and ranks, placement. The async controller on Ray is ``tests/test_ray_async.py``.

Invariants pinned:
- sync mode on Ray with one generation worker trains bit-identical parameters to the embedded runtime, with the
  same per-step metrics and evaluation (Ray is only a placement, never a change of the algorithm), even when the
  worker is killed mid-round (the replacement regenerates the round with the same seeds); bit-exact because the
  actors run the same batches on the same machine with the test's thread count (conftest exports it as
  ``OMP_NUM_THREADS``, which Ray keeps);
- LoRA on Ray trains bit-identical adapter weights to embedded on the same prompts, and its ``final/`` loads
  merged (transformers) and as an adapter (peft);
- a dead learner ends the run with a clear error and a valid last checkpoint, and resuming from it on Ray gives
  the same parameters as an uninterrupted embedded run;
- two learner ranks (learner.num_ranks) on Ray train the embedded one-learner run's parameters (1e-5), and a
  killed rank actor ends the run within 60 s with LearnerRankDied naming it;
- requests the cluster cannot place fail at once (naming the key to change), and an actor that never starts
  fails after the timeout, naming it — never a silent hang.
"""

from __future__ import annotations

import argparse
import time

import pytest
import torch
from ray_cases import SYNC_STEPS, build, metrics_of, params, tiny_config, trained_uids_per_step

ray = pytest.importorskip("ray")

from groupwise.cli.commands import run_train  # noqa: E402
from groupwise.cli.run_prompts import training_uids  # noqa: E402
from groupwise.run.audit import audit_run  # noqa: E402
from groupwise.run.checkpoint import latest_checkpoint, load_checkpoint  # noqa: E402
from groupwise.runtime.sync_run import run_sync  # noqa: E402
from groupwise.trainer.builder import load_policy_from_config  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.numerics]


# --- sync mode ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded_sync(tmp_path_factory):
    root = tmp_path_factory.mktemp("embedded")
    session = build(tiny_config(root, "straight", eval={"at_end": True, "num_prompts": 8}))
    run_sync(session)
    return session


def test_sync_on_ray_trains_the_same_parameters_as_embedded(ray_cluster, embedded_sync, tmp_path):
    """Also when the generation worker is killed mid-round: its replacement regenerates with the same seeds."""
    flag = tmp_path / "kill-a-worker"
    flag.touch()
    cfg = tiny_config(
        tmp_path, "straight", backend="ray", eval={"at_end": True, "num_prompts": 8},
        reward={"function": "scripted_rewards:kill_once_reward", "kwargs": {"kill_flag": str(flag)}},
    )  # fmt: skip
    session = build(cfg)
    try:
        run_sync(session)
        trained = params(session)
        initial = load_policy_from_config(session.cfg).model.state_dict()
    finally:
        session.close()
    reference = params(embedded_sync)
    assert any(not torch.equal(initial[name], reference[name]) for name in reference), "training changed nothing"
    for name, tensor in reference.items():
        assert torch.equal(trained[name], tensor), name
    ray_metrics, embedded_metrics = metrics_of(session), metrics_of(embedded_sync)
    assert [m["step"] for m in ray_metrics] == [m["step"] for m in embedded_metrics]
    assert any("eval/accuracy" in m for m in ray_metrics), "the final evaluation (on a generation worker) is missing"
    for key in ("reward/unfiltered_mean", "loss/total", "ds/groups_generated", "weight_version", "eval/accuracy"):
        assert [m.get(key) for m in ray_metrics] == [m.get(key) for m in embedded_metrics], key
    assert trained_uids_per_step(session.run_dir.path) == trained_uids_per_step(embedded_sync.run_dir.path)
    assert not flag.exists(), "no worker was killed"
    audit = audit_run(session.run_dir.path, training_uids)
    assert audit.ok, audit.format()
    events = (session.run_dir.path / "events.log").read_text()
    assert "generation worker 0 died" in events and "generation worker 1 started in place of worker 0" in events


@pytest.mark.slow  # ~70 s: a Ray learner and worker start with peft on two shared cores
def test_lora_on_ray_trains_the_same_adapter_as_embedded_and_saves_both_finals(ray_cluster, tmp_path):
    """The learner actor publishes merged weights (workers keep plain models), checkpoints the adapter, and the
    driver writes ``final/`` as a merged model plus ``adapter/`` — the same files as the embedded runtime."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from groupwise.model.lora import trained_state_dict

    lora = {"model": {"lora": {"enabled": True, "rank": 4}}, "optimizer": {"lr": 1e-2}, "run": {"max_steps": 2}}
    embedded = build(tiny_config(tmp_path / "embedded", "lora", **lora))
    run_sync(embedded)
    session = build(tiny_config(tmp_path / "ray", "lora", backend="ray", **lora))
    try:
        run_sync(session)
        adapter = session.policy.model.state_dict()
    finally:
        session.close()
    reference = trained_state_dict(embedded.policy.model)
    assert adapter.keys() == reference.keys() and all(".lora_" in name for name in adapter)
    for name, tensor in reference.items():
        assert torch.equal(adapter[name], tensor), name
    ids = torch.tensor([[1, 20, 21, 22]])
    with torch.no_grad():
        want = embedded.policy.model(input_ids=ids).logits
        final = session.run_dir.final_dir
        torch.testing.assert_close(
            AutoModelForCausalLM.from_pretrained(final)(input_ids=ids).logits, want, rtol=0, atol=1e-5
        )
        base = load_policy_from_config(session.cfg).model
        got = PeftModel.from_pretrained(base, final / "adapter")(input_ids=ids).logits
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert trained_uids_per_step(session.run_dir.path) == trained_uids_per_step(embedded.run_dir.path)
    assert [m.get("loss/total") for m in metrics_of(session)] == [m.get("loss/total") for m in metrics_of(embedded)]


def learner_dies_after_first_step(monkeypatch) -> None:
    from groupwise.runtime.ray.session import RaySession

    real_end_step = RaySession.end_step

    def end_step_then_kill_learner(self, step, metrics, rows):
        real_end_step(self, step, metrics, rows)
        if step == 0:
            ray.kill(self.learner.handle)

    monkeypatch.setattr(RaySession, "end_step", end_step_then_kill_learner)


def test_learner_failure_ends_the_run_with_a_valid_checkpoint(
    ray_cluster, embedded_sync, tmp_path, monkeypatch, capsys
):
    cfg = tiny_config(tmp_path, "straight", backend="ray", checkpoint={"every": 1})
    config_file = tmp_path / "run.yaml"
    config_file.write_text(cfg.to_yaml())
    learner_dies_after_first_step(monkeypatch)
    args = argparse.Namespace(file=str(config_file), overrides=[], resume=False, resume_from=None)
    assert run_train(args) == 1
    err = capsys.readouterr().err
    assert "learner actor died" in err and "--resume" in err
    run_dir = tmp_path / "runs" / "straight"
    kept = latest_checkpoint(run_dir)
    assert kept is not None and kept.name == "step_1" and kept.name in err
    assert load_checkpoint(kept)["trainer"]["step"] == 1
    monkeypatch.undo()
    resumed = build(cfg, resume=True)
    try:
        assert resumed.state.step == 1
        run_sync(resumed)
        final = params(resumed)
    finally:
        resumed.close()
    for name, tensor in params(embedded_sync).items():
        assert torch.equal(final[name], tensor), name


# --- placement --------------------------------------------------------------------------------------------------


def test_unplaceable_run_fails_at_once_naming_the_key(ray_cluster, tmp_path):
    from groupwise.runtime.ray.errors import UnschedulableError

    cfg = tiny_config(tmp_path, "too-big", backend="ray", runtime={"ray": {"learner_cpus": 64}})
    with pytest.raises(UnschedulableError, match=r"learner asks for 64 CPU.*runtime\.ray\.learner_cpus"):
        build(cfg)
    assert not (tmp_path / "runs" / "too-big").exists()


def test_actor_that_never_starts_times_out_by_name(ray_cluster):
    from groupwise.runtime.ray.cluster import wait_until_started
    from groupwise.runtime.ray.errors import UnschedulableError

    @ray.remote(num_cpus=3)  # more than the 2-CPU cluster has: Ray keeps it pending for ever
    class Stuck:
        def ready(self) -> bool:
            return True

    stuck = Stuck.remote()
    try:
        with pytest.raises(UnschedulableError, match="stuck worker did not start within 1 s"):
            wait_until_started({"stuck worker": stuck.ready.remote()}, timeout_s=1.0)
    finally:
        ray.kill(stuck)


@pytest.mark.slow  # two learner rank actors and a generation worker start on two shared cores
def test_two_learner_ranks_on_ray_train_and_a_killed_rank_ends_the_run_by_name(ray_cluster, embedded_sync, tmp_path):
    from groupwise.runtime.learner_ranks import LearnerRankDied
    from groupwise.runtime.sync_run import train_steps

    ranks = {
        "learner": {"num_ranks": 2, "collective_timeout_s": 30},
        "runtime": {"backend": "ray", "ray": {"learner_cpus": 0.25, "cpus_per_generation_worker": 0.25}},
    }
    session = build(tiny_config(tmp_path, "ranks", checkpoint={"every": 1}, **ranks))
    try:
        train_steps(session, SYNC_STEPS)  # one generation worker: the embedded run's rows, so its parameters
        for name, tensor in params(embedded_sync).items():
            assert float((params(session)[name] - tensor).norm() / tensor.norm()) <= 1e-5, name
        assert session.learner.version == SYNC_STEPS
        ray.kill(session.learner_peers[0])
        started = time.monotonic()
        with pytest.raises(LearnerRankDied, match="learner rank 1 of 2"):
            train_steps(session, SYNC_STEPS + 1)
        assert time.monotonic() - started < 60
    finally:
        session.close()
