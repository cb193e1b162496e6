"""The Ray runtime end to end on a local 2-CPU Ray cluster (one per test session), on a tiny model.

Invariants pinned:
- sync mode on Ray with one generation worker trains bit-identical parameters to the embedded runtime, with the
  same per-step metrics and evaluation (Ray is only a placement, never a change of the algorithm), even when the
  worker is killed mid-round (the replacement regenerates the round with the same seeds); bit-exact because the
  actors run the same batches on the same machine with the test's thread count (conftest exports it as
  ``OMP_NUM_THREADS``, which Ray keeps);
- the controller contract holds on both runtimes (parametrised): every step trains exactly P groups, every
  dispatched attempt has one fate, the metrics lines carry the same keys, the fate counts are equal, and
  (in_order, no lookahead) both runtimes train the same prompts in the same steps; a verifier that raises for some
  prompts fails exactly those prompts on both runtimes (each failed fate names its own prompt, never a batch mate);
- killing a generation worker mid-group: the run completes, the lost groups are redispatched and counted
  (``rollout/redispatches`` = the failed-and-retried fates), one replacement worker is counted
  (``rollout/worker_restarts``), and no group is lost or trained twice;
- with continuous batching (one call per group on threaded, streamed workers) and partial rollouts, an async run
  keeps the same contract, every trained row's logprobs align with its tokens, and token staleness is at most
  group staleness; (slow tier) a checkpoint taken while groups run on the workers saves their tokens so far, and
  a resume continues them: the kept tokens are counted in ``rollout/resumed_tokens`` and ``events.log``, and
  the resumed run audits clean;
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
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from groupwise.cli.commands import run_train  # noqa: E402
from groupwise.cli.run_prompts import training_uids  # noqa: E402
from groupwise.config import config_from_dict  # noqa: E402
from groupwise.run.audit import audit_run  # noqa: E402
from groupwise.run.checkpoint import latest_checkpoint, load_checkpoint  # noqa: E402
from groupwise.run.fates_file import read_fates  # noqa: E402
from groupwise.run.metrics import read_metrics  # noqa: E402
from groupwise.runtime.async_run import run_async  # noqa: E402
from groupwise.runtime.sync_run import run_sync  # noqa: E402
from groupwise.trainer.builder import build_session, load_policy_from_config  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.numerics]

P = 4  # prompts per step
SYNC_STEPS = 3
ASYNC_STEPS = 3
ASYNC_FAILURE = {"backoff_base_s": 0.05, "max_backoff_s": 0.1, "max_replacement_attempts": 8,
                 "replacement_reserve_prompts": 4}  # fmt: skip


def kill_once_reward(prompt, completion, kill_flag: str = "") -> float:
    """``scripted_rewards.marker_reward``, except that the first call to find ``kill_flag`` claims it and kills its
    own process (SIGKILL): a generation worker lost mid-group, while scoring a batch it has generated."""
    if kill_flag:
        try:
            os.rename(kill_flag, kill_flag + ".claimed")
        except FileNotFoundError:
            pass
        else:
            os.kill(os.getpid(), signal.SIGKILL)
    from scripted_rewards import marker_reward

    return marker_reward(prompt, completion)


def tiny_config(root: Path, name: str, *, backend: str = "embedded", mode: str = "sync", **sections):
    data = {
        "mode": mode,
        "run": {"name": name, "output_dir": str(root / "runs"), "seed": 5, "max_steps": SYNC_STEPS},
        "model": {
            "source": "tiny",
            "tiny": {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64,
                     "max_position_embeddings": 32},
        },
        "data": {"task": "addition", "addition": {"min_digits": 1, "max_digits": 2, "num_eval": 8}},
        "generation": {"max_new_tokens": 4},
        "grpo": {"num_prompts_per_step": P, "num_generations_per_prompt": 4},
        "reward": {"function": "scripted_rewards:marker_reward"},
        "logging": {"progress": False, "tensorboard": False},
        "eval": {"at_start": False, "at_end": False},
        "runtime": {"backend": backend},
    }  # fmt: skip
    if mode == "sync":
        data["grpo"]["dynamic_sampling"] = {"max_gen_rounds": 6, "min_step_batch_fraction": 0.25}
    else:
        data["async"] = {
            "sampler": {"name": "in_order", "max_lookahead_versions": 0},
            "max_inflight_prompts": 8,
            "max_buffered_rollouts": 8,
            "rollout_failure": dict(ASYNC_FAILURE),
        }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return config_from_dict(data)


def build(cfg, **kwargs):
    if cfg.runtime.backend == "ray":
        from groupwise.runtime.ray_session import build_ray_session

        return build_ray_session(cfg, startup_timeout_s=120, **kwargs)
    return build_session(cfg, **kwargs)


def params(session) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().cpu().clone() for name, tensor in session.policy.model.state_dict().items()}


def metrics_of(session) -> list[dict]:
    return read_metrics(session.run_dir.path / "metrics.jsonl")


def trained_uids_per_step(run_dir: Path) -> list[list[str]]:
    steps = sorted(run_dir.glob("train_data/step_*.jsonl"), key=lambda p: int(p.stem.split("_")[1]))
    out = []
    for path in steps:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        out.append(list(dict.fromkeys(row["prompt_uid"] for row in rows)))
    return out


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
        reward={"function": "test_ray_runtime:kill_once_reward", "kwargs": {"kill_flag": str(flag)}},
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
        torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(final)(input_ids=ids).logits, want,
                                   rtol=0, atol=1e-5)
        base = load_policy_from_config(session.cfg).model
        got = PeftModel.from_pretrained(base, final / "adapter")(input_ids=ids).logits
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert trained_uids_per_step(session.run_dir.path) == trained_uids_per_step(embedded.run_dir.path)
    assert [m.get("loss/total") for m in metrics_of(session)] == [m.get("loss/total") for m in metrics_of(embedded)]


def learner_dies_after_first_step(monkeypatch) -> None:
    from groupwise.runtime.ray_session import RaySession

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


# --- async mode: the controller contract on both runtimes ------------------------------------------------------


@pytest.fixture(scope="module")
def async_runs(ray_cluster, tmp_path_factory):
    runs = {}
    for backend in ("embedded", "ray"):
        root = tmp_path_factory.mktemp(f"async-{backend}")
        # A verifier that raises for some prompts: each failure must stay its own prompt's on both runtimes.
        reward = {"function": "scripted_rewards:fails_on_answers_ending_in", "kwargs": {"digits": "37"}}
        failure = {"max_skipped_prompts": 100, "min_step_batch_fraction": 0.25}
        cfg = tiny_config(root, "contract", backend=backend, mode="async", run={"max_steps": ASYNC_STEPS},
                          reward=reward, **{"async": {"rollout_failure": {**ASYNC_FAILURE, **failure}}})  # fmt: skip
        session = build(cfg)
        try:
            runs[backend] = (session, run_async(session))
        finally:
            if backend == "ray":
                session.close()
    return runs


def assert_contract(session, summary) -> None:
    """Steps balance, every trained group is in exactly one step's train data, every loss has a resolution."""
    assert summary.stop_reason == "max_steps" and summary.steps_trained == ASYNC_STEPS
    ledger = summary.ledger_history
    assert [record.selected + record.charged for record in ledger] == [P] * ASYNC_STEPS
    assert summary.step_sizes == [record.selected for record in ledger]
    assert summary.fates["trained"] == sum(summary.step_sizes)
    uids = trained_uids_per_step(session.run_dir.path)
    assert [len(step) for step in uids] == summary.step_sizes
    flat = [uid for step in uids for uid in step]
    assert len(flat) == len(set(flat)), "a prompt was trained twice"
    for (fate, resolution), count in summary.fates.by_resolution.items():
        assert fate in ("trained", "pending") or resolution is not None, (fate, count)
    # fates.jsonl against the dataset: nothing lost or trained twice
    audit = audit_run(session.run_dir.path, training_uids)
    assert audit.ok, audit.format()


@pytest.mark.parametrize("backend", ["embedded", "ray"])
def test_controller_contract_holds_on_both_runtimes(async_runs, backend):
    session, summary = async_runs[backend]
    assert_contract(session, summary)
    failed = [line for line in read_fates(session.run_dir.fates_path) if line["fate"] == "failed"]
    assert failed
    for line in failed:  # a reward failure fails only the prompt whose completion raised it, and says so
        named = set(re.findall(r"addition/train/\d+\+\d+", line["detail"]))
        assert named == {line["prompt_uid"]} and "verifier cannot parse" in line["detail"], line
    lines = metrics_of(session)
    assert all(line["rollout/redispatches"] == 0 and line["rollout/worker_restarts"] == 0 for line in lines)


def test_both_runtimes_emit_the_same_metrics_and_fates(async_runs):
    (embedded, embedded_summary), (on_ray, ray_summary) = async_runs["embedded"], async_runs["ray"]
    assert [set(m) for m in metrics_of(on_ray)] == [set(m) for m in metrics_of(embedded)]
    assert ray_summary.fates.as_dict() == embedded_summary.fates.as_dict()
    # in_order without lookahead: each step's prompts are fixed by dispatch, whatever the generation timing
    ray_steps, embedded_steps = trained_uids_per_step(on_ray.run_dir.path), trained_uids_per_step(embedded.run_dir.path)
    assert [sorted(step) for step in ray_steps] == [sorted(step) for step in embedded_steps]


def test_killed_generation_worker_is_replaced_and_its_groups_redispatched(ray_cluster, tmp_path):
    flag = tmp_path / "kill-a-worker"
    flag.touch()
    cfg = tiny_config(
        tmp_path, "killed", backend="ray", mode="async", run={"max_steps": ASYNC_STEPS},
        reward={"function": "test_ray_runtime:kill_once_reward", "kwargs": {"kill_flag": str(flag)}},
    )  # fmt: skip
    session = build(cfg)
    try:
        summary = run_async(session)
    finally:
        session.close()
    assert not flag.exists() and flag.with_name(flag.name + ".claimed").exists(), "no worker was killed"
    assert_contract(session, summary)
    lines = metrics_of(session)
    retried = summary.fates.by_resolution[("failed", "retried")]
    assert retried >= 1  # the killed batch's groups, each dispatched again
    assert sum(line["rollout/redispatches"] for line in lines) == retried == summary.fates["failed"]
    assert sum(line["rollout/worker_restarts"] for line in lines) == 1
    events = (session.run_dir.path / "events.log").read_text()
    assert "generation worker 0 died" in events and "generation worker 1 started in place of worker 0" in events


# --- continuous batching -----------------------------------------------------------------------------------------


def slow_marker_reward(prompt, completion) -> float:
    """``scripted_rewards.marker_reward`` after 50 ms: groups are still being scored on the workers (their rows done,
    their calls running) whenever a step ends, so every checkpoint finds attempts to keep."""
    import time

    from scripted_rewards import marker_reward

    time.sleep(0.05)
    return marker_reward(prompt, completion)


def streamed_config(root: Path, name: str, max_steps: int, **sections):
    return tiny_config(
        root, name, backend="ray", mode="async", run={"max_steps": max_steps},
        generation={"continuous_batching": True, "max_new_tokens": 8, "micro_batch_groups": 2},
        model={"tiny": {"max_position_embeddings": 64}},
        **{"async": {"partial_rollouts": "continue", **sections.pop("async", {})}}, **sections,
    )  # fmt: skip


def test_an_async_run_on_streamed_workers_keeps_the_contract(ray_cluster, tmp_path):
    from groupwise.runtime.ray_session import ray_clients
    from groupwise.runtime.ray_stream_client import RayStreamedRollouts

    session = build(streamed_config(tmp_path, "streamed", ASYNC_STEPS))
    try:
        assert isinstance(ray_clients(session).rollouts, RayStreamedRollouts)
        summary = run_async(session)
    finally:
        session.close()
    assert_contract(session, summary)
    for line in metrics_of(session):
        assert line["rollout/resumed_tokens"] == 0 and line["rollout/redispatches"] == 0
        assert 0 <= line["staleness/token_mean"] <= line["staleness/mean"]
    for path in session.run_dir.path.glob("train_data/step_*.jsonl"):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert rows and all(len(r["completion_ids"]) == len(r["generation_logprobs"]) for r in rows)


@pytest.mark.slow
def test_a_checkpoint_on_ray_keeps_running_attempts_and_a_resume_continues_them(ray_cluster, tmp_path):
    reward = {"function": "test_ray_runtime:slow_marker_reward"}
    checkpoint = {"every": 1, "keep_last": 10, "save_final": False}
    sections = {"reward": reward, "checkpoint": checkpoint,  # attempts run ahead of the step being trained
                "async": {"partial_rollouts": "continue", "max_buffered_rollouts": 12,
                          "sampler": {"name": "ready_first", "max_staleness_versions": 2}}}
    cut = build(streamed_config(tmp_path, "cut", 2, **sections))
    try:
        run_async(cut)
    finally:
        cut.close()
    state = load_checkpoint(cut.run_dir.path / "checkpoints" / "step_2")["extra"]["controller"]
    kept = sum(len(r["token_ids"]) for s in state["inflight_slots"] if s["progress"]
               for r in s["progress"]["rows"] if r)  # fmt: skip
    assert kept > 0, "the checkpoint must hold the workers' running attempts"
    resumed = build(streamed_config(tmp_path, "cut", 4, **sections), resume=True)
    try:
        summary = run_async(resumed)
    finally:
        resumed.close()
    assert summary.stop_reason == "max_steps"
    run_dir = resumed.run_dir.path
    assert sum(line.get("rollout/resumed_tokens", 0) for line in metrics_of(resumed)) == kept
    assert f"with {kept} generated token(s) kept" in (run_dir / "events.log").read_text()
    audit = audit_run(run_dir, training_uids)
    assert audit.ok, audit.format()


# --- placement --------------------------------------------------------------------------------------------------


def test_unplaceable_run_fails_at_once_naming_the_key(ray_cluster, tmp_path):
    from groupwise.runtime.ray_errors import UnschedulableError

    cfg = tiny_config(tmp_path, "too-big", backend="ray", runtime={"ray": {"learner_cpus": 64}})
    with pytest.raises(UnschedulableError, match=r"learner asks for 64 CPU.*runtime\.ray\.learner_cpus"):
        build(cfg)
    assert not (tmp_path / "runs" / "too-big").exists()


def test_actor_that_never_starts_times_out_by_name(ray_cluster):
    from groupwise.runtime.ray_cluster import wait_until_started
    from groupwise.runtime.ray_errors import UnschedulableError

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

    ranks = {"learner": {"num_ranks": 2, "collective_timeout_s": 30},
             "runtime": {"backend": "ray", "ray": {"learner_cpus": 0.25, "cpus_per_generation_worker": 0.25}}}
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
