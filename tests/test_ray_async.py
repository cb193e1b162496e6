"""The async controller on the Ray runtime, on a local 2-CPU Ray cluster (one per test session) and a tiny model.

Invariants pinned:
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
  the resumed run audits clean.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from ray_cases import ASYNC_FAILURE, ASYNC_STEPS, assert_contract, build, metrics_of, tiny_config, trained_uids_per_step

pytest.importorskip("ray")

from groupwise.cli.run_prompts import training_uids  # noqa: E402
from groupwise.run.audit import audit_run  # noqa: E402
from groupwise.run.checkpoint import load_checkpoint  # noqa: E402
from groupwise.run.fates_file import read_fates  # noqa: E402
from groupwise.runtime.async_run import run_async  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.numerics]


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
        reward={"function": "scripted_rewards:kill_once_reward", "kwargs": {"kill_flag": str(flag)}},
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


def streamed_config(root: Path, name: str, max_steps: int, **sections):
    return tiny_config(
        root, name, backend="ray", mode="async", run={"max_steps": max_steps},
        generation={"continuous_batching": True, "max_new_tokens": 8, "micro_batch_groups": 2},
        model={"tiny": {"max_position_embeddings": 64}},
        **{"async": {"partial_rollouts": "continue", **sections.pop("async", {})}}, **sections,
    )  # fmt: skip


def test_an_async_run_on_streamed_workers_keeps_the_contract(ray_cluster, tmp_path):
    from groupwise.runtime.ray.session import ray_clients
    from groupwise.runtime.ray.stream_client import RayStreamedRollouts

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
    reward = {"function": "scripted_rewards:slow_marker_reward"}
    checkpoint = {"every": 1, "keep_last": 10, "save_final": False}
    sections = {
        "reward": reward,
        "checkpoint": checkpoint,  # attempts run ahead of the step being trained
        "async": {
            "partial_rollouts": "continue",
            "max_buffered_rollouts": 12,
            "sampler": {"name": "ready_first", "max_staleness_versions": 2},
        },
    }
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
