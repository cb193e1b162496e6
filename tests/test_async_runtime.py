"""The async controller on the embedded runtime, with the real engine and learner.

Invariants pinned:
- sync ≡ async: with `in_order`, `max_lookahead_versions: 0`, full-batch chunks, dynamic sampling off and one
  group per generation call, async trains the same groups in the same order as sync and the parameters after
  N steps are bit-identical on CPU (bit-exact: the same batches through the same kernels, on one intra-op
  thread in both modes);
- an async run with dynamic sampling writes one metrics line per step whose accounting balances
  (groups trained + dropped = P) and whose train_data rows are aligned with their completions.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from test_sync_trainer import tiny_config

from groupwise.config import config_from_dict
from groupwise.run.fates_file import read_fates
from groupwise.run.metrics import read_metrics
from groupwise.runtime.async_run import run_async
from groupwise.runtime.sync_run import run_sync
from groupwise.trainer.builder import build_session

pytestmark = pytest.mark.numerics


def _trained_order(run_dir):
    order = []
    for step in range(1, 100):
        path = run_dir / "train_data" / f"step_{step}.jsonl"
        if not path.exists():
            break
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        order.append([(r["prompt_uid"], r["completion_ids"]) for r in rows])
    return order


def test_async_in_order_lookahead_zero_equals_sync(tmp_path):
    # The async runtime halves the intra-op threads for its two concurrent threads; on one thread both modes
    # run the same kernels with the same float summation order (conftest restores the count afterwards).
    torch.set_num_threads(1)
    common = {
        "eval": {"at_start": False, "at_end": False},
        "generation": {"max_new_tokens": 4, "micro_batch_groups": 1},
        "grpo": {"dynamic_sampling": {"enabled": False}},
        "loss": {"importance_sampling": True},
    }
    sync = build_session(tiny_config(tmp_path, run={"name": "sync", "max_steps": 3}, **common))
    run_sync(sync)
    data = tiny_config(tmp_path, run={"name": "async", "max_steps": 3}, **common).model_dump(by_alias=True)
    data["mode"] = "async"
    data["async"] = {
        "sampler": {"name": "in_order", "max_lookahead_versions": 0},
        "min_groups_for_streaming_train": None,
        "max_buffered_rollouts": 4,
        "max_inflight_prompts": 4,
        "rollout_failure": {"on_dropped_prompt": "shrink"},
    }
    session = build_session(config_from_dict(data))
    run_async(session)
    sync_order, async_order = _trained_order(sync.run_dir.path), _trained_order(session.run_dir.path)
    assert len(sync_order) == 3
    assert async_order == sync_order
    sync_params, async_params = sync.policy.model.state_dict(), session.policy.model.state_dict()
    for name, tensor in sync_params.items():
        assert torch.equal(async_params[name], tensor), name


def ready_first_async(data: dict) -> dict:
    """A dumped sync tiny config turned into an async ready_first run with dynamic sampling and spare prompts."""
    data["mode"] = "async"
    data["grpo"]["dynamic_sampling"] = {"enabled": True}
    data["async"] = {
        "sampler": {"name": "ready_first", "max_staleness_versions": 1},
        "max_buffered_rollouts": 8,
        "max_inflight_prompts": 8,
        "rollout_failure": {"replacement_reserve_prompts": 4, "max_replacement_attempts": 8},
    }
    return data


def test_async_dynamic_sampling_run_accounts_every_step(tmp_path):
    cfg = tiny_config(tmp_path, run={"name": "a", "max_steps": 3}, eval={"at_start": False, "at_end": False})
    session = build_session(config_from_dict(ready_first_async(cfg.model_dump(by_alias=True))))
    summary = run_async(session)
    records = [r for r in read_metrics(session.run_dir.metrics_path) if "loss/total" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    P = cfg.grpo.num_prompts_per_step
    for record in records:
        assert record["ds/groups_trained"] + record["accounting/dropped_groups"] == P
        assert record["staleness/max"] <= 1 + summary.steps_trained  # ready_first: bounded admission only
        rows = [json.loads(x) for x in session.run_dir.train_data_path(record["step"]).read_text().splitlines()]
        assert len({r["group_id"] for r in rows}) == record["ds/groups_trained"]
        for r in rows:  # the scripted reward recomputed from the row's own completion
            a, b = (int(x) for x in r["prompt_uid"].rsplit("/", 1)[1].split("+"))
            assert r["raw_reward"] == (float(b % 2 == 0) if a % 3 == 0 else float(r["completion_ids"][0] % 2))
            # zero-variance groups never reach training
            assert a % 3 != 0


def test_a_reward_failure_fails_only_its_own_prompt(tmp_path):
    cfg = tiny_config(tmp_path, run={"name": "r", "max_steps": 3}, eval={"at_start": False, "at_end": False})
    data = cfg.model_dump(by_alias=True)
    data["mode"] = "async"
    data["reward"] = {"function": "scripted_rewards:fails_on_answers_ending_in"}
    data["grpo"]["dynamic_sampling"] = {"enabled": False}
    data["generation"]["micro_batch_groups"] = 16  # every waiting prompt shares one engine call
    data["async"] = {
        "sampler": {"name": "ready_first", "max_staleness_versions": 1},
        "max_buffered_rollouts": 16,
        "max_inflight_prompts": 16,
        "rollout_failure": {"max_skipped_prompts": 1000, "min_step_batch_fraction": 0.25,
                            "max_data_attempts_per_prompt": 1, "replacement_reserve_prompts": 4},
    }  # fmt: skip
    session = build_session(config_from_dict(data))
    run_async(session)
    lines = read_fates(session.run_dir.fates_path)
    answers = {p.uid: p.answer for p in session.task.train_prompts()}
    failed = [line for line in lines if line["fate"] == "failed"]
    assert failed, "the scripted verifier never raised: pick prompts whose answers end in 7"
    for line in failed:  # each failure is its own prompt's, and says so
        assert answers[line["prompt_uid"]].endswith("7"), line
        named = set(re.findall(r"addition/train/\d+\+\d+", line["detail"]))
        assert named == {line["prompt_uid"]} and "answers ending in 7" in line["detail"], line
    trained = [line for line in lines if line["fate"] == "trained"]
    assert len(trained) == 3 * cfg.grpo.num_prompts_per_step
    assert not any(answers[line["prompt_uid"]].endswith("7") for line in trained)
