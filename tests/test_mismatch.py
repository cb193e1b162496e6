"""The rollout–trainer mismatch metric (``mismatch/*``), for every backend.

Invariants pinned:
- a row's version spans expand to one version per token (padding -1);
- the sums: for gaps ``δ = learner − recorded`` the metric is ``mean |δ|`` and ``mean (exp(δ) − 1 − δ)`` over the
  on-policy tokens only (valid tokens drawn under the learner's version), and the on-policy share of the trained
  tokens;
- the learner counts exactly the tokens of its own version: rows whose tokens come from another version, or whose
  tokens mix versions (a partial rollout), contribute only their tokens of the learner's version;
- a sync run on the built-in engine (which samples from the learner's own weights) reports every token on-policy
  and a gap below 1e-4 (float32 on CPU: the engine's logprobs are the learner's to rounding), k3 below 1e-8;
- a generator whose recorded logprobs are off by a known ``s`` (``fakes.generators:shifted_backend``) reports
  ``|δ| = s`` and k3 ``= exp(−s) − 1 + s`` (to 1e-4 / 1e-6).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from fakes.generators import SHIFT
from test_learner import TINY, make_rows

from groupwise.algo.mismatch import mismatch_stats, on_policy_tokens
from groupwise.batch import RowBatch
from groupwise.config import config_from_dict
from groupwise.model import completion_logprobs, load_policy
from groupwise.rows import span_versions, version_spans
from groupwise.runtime.sync_run import run_sync
from groupwise.trainer.builder import build_session
from groupwise.trainer.learner import Learner, LearnerSettings


def test_the_sums_are_over_on_policy_tokens_only():
    learner = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]])
    recorded = torch.tensor([[-1.1, -2.0, -9.0], [-0.3, -0.5, 0.0]])
    versions = span_versions([((4, 2), (3, 1)), ((4, 2),)], 3)  # a row across a weight load, and a short row
    assert versions.tolist() == [[4, 4, 3], [4, 4, -1]]
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    on_policy = on_policy_tokens(versions, 4, mask)
    assert on_policy.tolist() == [[True, True, False], [True, True, False]]
    stats = mismatch_stats(learner, recorded, on_policy, mask)
    deltas = [0.1, 0.0, -0.2, 0.0]
    assert stats.on_policy_tokens == 4 and stats.scored_tokens == 5
    assert stats.abs_sum == pytest.approx(sum(abs(d) for d in deltas), abs=1e-6)
    assert stats.k3_sum == pytest.approx(sum(math.expm1(d) - d for d in deltas), abs=1e-6)
    metrics = stats.as_metrics()
    assert metrics["mismatch/on_policy_fraction"] == pytest.approx(4 / 5)
    assert metrics["mismatch/logprob_abs_diff"] == pytest.approx(0.3 / 4, abs=1e-6)


def _exact_logprobs(model, rows: RowBatch) -> list[list[float]]:
    with torch.no_grad():
        logprobs, _, _ = completion_logprobs(model, rows.sequence("prompt_ids"), rows.sequence("completion_ids"), 1.0)
    return [logprobs[i, : len(c)].tolist() for i, c in enumerate(rows.sequence("completion_ids"))]


def test_the_learner_counts_only_the_tokens_of_its_own_version():
    model = load_policy("tiny", tiny=TINY, seed=5, device="cpu").model
    cfg = config_from_dict({"model": {"source": "tiny"}})
    learner = Learner(model, LearnerSettings.from_config(cfg))
    base = make_rows(3, groups=2, size=2)
    exact = _exact_logprobs(model, base)
    recorded, versions = [], []
    for index, row in enumerate(exact):
        # row 0: all stale (garbage logprobs); row 1: on-policy, exact + SHIFT; others: first token stale, then exact
        if index == 0:
            recorded.append([lp - 3.0 for lp in row])
            versions.append([-1] * len(row))
        elif index == 1:
            recorded.append([lp - SHIFT for lp in row])
            versions.append([0] * len(row))
        else:
            recorded.append([row[0] + 5.0, *row[1:]])
            versions.append([-1, *[0] * (len(row) - 1)])
    spans = [version_spans(row) for row in versions]
    rows = RowBatch({**base.columns, "generation_logprobs": recorded, "version_spans": spans})
    metrics = learner.train_step(rows)
    lengths = [len(c) for c in rows.sequence("completion_ids")]
    on_policy = lengths[1] + sum(length - 1 for length in lengths[2:])
    assert metrics["mismatch/on_policy_fraction"] == pytest.approx(on_policy / sum(lengths))
    assert metrics["mismatch/logprob_abs_diff"] == pytest.approx(SHIFT * lengths[1] / on_policy, abs=1e-4)


def tiny_run_config(tmp_path, backend: str) -> dict:
    return {
        "mode": "sync",
        "run": {"name": "mismatch", "output_dir": str(tmp_path / "runs"), "seed": 3, "max_steps": 2},
        "model": {"source": "tiny", "tiny": {"num_layers": 1, "hidden_size": 32, "num_heads": 2,
                                             "intermediate_size": 64, "max_position_embeddings": 32}},
        "data": {"task": "addition", "addition": {"min_digits": 1, "max_digits": 1, "num_eval": 8}},
        "generation": {"backend": backend, "max_new_tokens": 4},
        "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 4, "dynamic_sampling": {"enabled": False}},
        "logging": {"progress": False, "tensorboard": False},
        "eval": {"at_start": False, "at_end": False},
    }  # fmt: skip


def _step_metrics(run_dir) -> list[dict]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if "loss/total" in line]


@pytest.mark.parametrize("backend", ["builtin", "fakes.generators:shifted_backend"])
def test_a_sync_run_reports_the_gap_between_its_generator_and_its_learner(tmp_path, backend):
    session = build_session(config_from_dict(tiny_run_config(tmp_path, backend)))
    run_sync(session)
    steps = _step_metrics(session.run_dir.path)
    assert len(steps) == 2
    for metrics in steps:
        assert metrics["mismatch/on_policy_fraction"] == 1.0  # sync, no carried groups: every token is on-policy
        if backend == "builtin":
            assert metrics["mismatch/logprob_abs_diff"] < 1e-4
            assert 0.0 <= metrics["mismatch/kl_k3"] < 1e-8
        else:  # recorded = exact + SHIFT, so δ = −SHIFT on every token
            assert metrics["mismatch/logprob_abs_diff"] == pytest.approx(SHIFT, abs=1e-4)
            assert metrics["mismatch/kl_k3"] == pytest.approx(math.expm1(-SHIFT) + SHIFT, abs=1e-6)
