"""Training runs on the vLLM backend: the default job (``examples/addition.yaml`` / ``addition_async.yaml``, 20 steps,
a smaller evaluation) on the shipped tiny model, on CPU, embedded.

Invariants pinned:
- a 20-step sync run (``vllm.LLM``) completes: 20 steps trained, the fates pass ``groupwise audit``, every step
  writes ``waste/*`` and ``mismatch/*``; every trained token was sampled under the learner's weights, and vLLM's
  recorded logprobs equal the learner's within 1e-4 per token on average (float32: ``mismatch/logprob_abs_diff``),
  so the importance weights are 1 to that precision;
- a 20-step async run with continuous batching and partial rollouts (``AsyncLLM``, pause keep / reload / resume)
  completes with the audit passing and ``waste/*``, ``mismatch/*`` written, the tokens' mean staleness within the
  step's maximum (whether a load lands mid-row is timing; the stream tier pins a row continued under new weights),
  and some steps trained on-policy tokens (their gap is reported; with the KV cache kept across a load it is not
  bounded by rounding);
- on Ray (where ray is installed), a short async run with partial rollouts runs vLLM's stream inside the
  generation worker actor (weights loaded into it after every step): it completes, the audit passes, and
  ``waste/*``, ``mismatch/*`` are written;
- each run's engine is shut down when its session closes (another engine can be built in the process next).
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from vllm_tier import TINY_MODEL, vllm_marks

from groupwise.cli.run_prompts import training_uids
from groupwise.config import load_config
from groupwise.run.audit import audit_run

pytestmark = vllm_marks()
ROOT = TINY_MODEL.parents[1]
STEPS = 20


def _overrides(tmp_path, name: str, steps: int = STEPS) -> list[str]:
    return [
        f"run.name={name}", f"run.output_dir={tmp_path / 'runs'}", f"run.max_steps={steps}",
        f"model.path={TINY_MODEL}", "generation.backend=vllm", "generation.vllm.kv_cache_gib=1",
        "eval.num_prompts=32", "eval.every=0", "checkpoint.every=10", "logging.progress=false",
        "logging.tensorboard=false",
    ]  # fmt: skip


def _train(cfg):
    from groupwise.runtime.async_run import run_async
    from groupwise.runtime.sessions import build_run_session
    from groupwise.runtime.sync_run import run_sync

    session = build_run_session(cfg)
    try:
        (run_sync if cfg.mode == "sync" else run_async)(session)
    finally:
        session.close()
    return session


def _step_metrics(run_dir) -> list[dict]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if "loss/total" in line]


def _check_run(session, steps_run: int = STEPS) -> list[dict]:
    assert session.state.step == steps_run
    report = audit_run(session.run_dir.path, training_uids)
    assert report.ok, report.format()
    steps = _step_metrics(session.run_dir.path)
    assert [m["step"] for m in steps] == list(range(1, steps_run + 1))
    for metrics in steps:
        assert metrics["waste/tokens"] >= 0 and metrics["waste/generated_tokens"] >= 0
        assert 0.0 <= metrics["mismatch/on_policy_fraction"] <= 1.0
    assert steps[-1]["waste/cumulative_generated_tokens"] > 0
    return steps


def test_a_sync_run_on_vllm(tmp_path):
    cfg = load_config(ROOT / "examples" / "addition.yaml", _overrides(tmp_path, "vllm-sync"))
    steps = _check_run(_train(cfg))
    for metrics in steps:
        assert metrics["mismatch/on_policy_fraction"] == 1.0
        assert metrics["mismatch/logprob_abs_diff"] < 1e-4
        assert abs(metrics["loss/is_weight_mean"] - 1.0) < 1e-4


def test_an_async_run_with_partial_rollouts_on_vllm(tmp_path):
    overrides = [*_overrides(tmp_path, "vllm-async"), "generation.continuous_batching=true",
                 "async.partial_rollouts=continue", "async.partial_rollout_kv=keep"]  # fmt: skip
    cfg = load_config(ROOT / "examples" / "addition_async.yaml", overrides)
    steps = _check_run(_train(cfg))
    # Whether a weight load lands in the middle of some row here depends on timing (it did in most runs, not in all);
    # test_vllm_stream.py's pause/keep/resume test pins the versions of a row continued under new weights.
    assert all(0 <= m["staleness/token_mean"] <= m["staleness/max"] for m in steps)
    on_policy = [m for m in steps if m["mismatch/on_policy_fraction"] > 0]
    assert on_policy and all(m["mismatch/kl_k3"] >= 0.0 and m["mismatch/logprob_abs_diff"] < 1.0 for m in on_policy)


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed in this environment")
def test_an_async_run_with_partial_rollouts_on_ray(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # a throwaway local cluster: no token to generate
    overrides = [*_overrides(tmp_path, "vllm-ray", steps=6), "runtime.backend=ray",
                 "generation.continuous_batching=true", "async.partial_rollouts=continue",
                 "async.partial_rollout_kv=keep"]  # fmt: skip
    cfg = load_config(ROOT / "examples" / "addition_async.yaml", overrides)
    steps = _check_run(_train(cfg), steps_run=6)
    assert all(m["weight_version"] == m["step"] for m in steps)
