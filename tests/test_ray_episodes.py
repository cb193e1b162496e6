"""Multi-turn episodes on the Ray runtime: the generation workers run the episodes, the run keeps its contract.

Invariants pinned:
- an async run of the ``guess_number`` environment with its generation on a Ray worker (turns in rounds) trains
  every step, every trained row replays into a fresh environment to its recorded reward with its environment
  tokens as ``env_spans``, the trained tokens are the model's, and the audit finds every prompt accounted for once.
"""

from __future__ import annotations

import pytest
from test_episode_runs import check_rows, episode_config

from groupwise.cli.run_prompts import training_uids
from groupwise.episodes.record import EpisodeRecord
from groupwise.run.audit import audit_run
from groupwise.run.metrics import read_metrics
from groupwise.runtime.async_run import run_async
from groupwise.runtime.sessions import build_run_session

pytest.importorskip("ray")
pytestmark = pytest.mark.ray


def test_an_async_episode_run_on_ray_keeps_the_contract(ray_cluster, tmp_path):
    cfg = episode_config(
        tmp_path, "async", eval={"at_start": False, "at_end": False}, runtime={"backend": "ray"},
        **{"async": {"sampler": {"name": "ready_first", "max_staleness_versions": 1}, "max_buffered_rollouts": 4,
                     "max_inflight_prompts": 4, "partial_rollouts": "off"}},
    )  # fmt: skip
    session = build_run_session(cfg)
    try:
        run_async(session)
    finally:
        session.close()
    records = [r for r in read_metrics(session.run_dir.metrics_path) if "loss/total" in r]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        rows = check_rows(session, record["step"])
        assert record["perf/train_tokens"] == sum(EpisodeRecord.from_dict(r["episode"]).model_tokens for r in rows)
    report = audit_run(session.run_dir.path, training_uids)
    assert report.ok, report.format()
