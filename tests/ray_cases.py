"""What the Ray runtime tests share: a tiny config on either runtime, building a session, and the checks of a run.

Not a test module: ``tests/test_ray_runtime.py`` (sync, placement, learner ranks) and ``tests/test_ray_async.py``
(the controller contract, worker kills, continuous batching) import it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from groupwise.cli.run_prompts import training_uids
from groupwise.config import config_from_dict
from groupwise.run.audit import audit_run
from groupwise.run.metrics import read_metrics
from groupwise.trainer.builder import build_session

P = 4  # prompts per step
SYNC_STEPS = 3
ASYNC_STEPS = 3
ASYNC_FAILURE = {"backoff_base_s": 0.05, "max_backoff_s": 0.1, "max_replacement_attempts": 8,
                 "replacement_reserve_prompts": 4}  # fmt: skip


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
        from groupwise.runtime.ray.session import build_ray_session

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
