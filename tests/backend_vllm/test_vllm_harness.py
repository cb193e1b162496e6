"""A harness run on the vLLM backend: the endpoint's requests sampled by ``vllm.LLM`` in batches.

Invariants pinned:
- a 3-step sync run of a chat harness (a plain ``openai`` SDK loop of two requests, the second extending the first)
  on a tiny random policy served by vLLM completes; every trained row is exactly the sequence its session's log
  replays to (``groupwise audit --replay-sessions``), the fates pass the audit, each session is one sequence with
  nothing retokenized, and vLLM's recorded logprobs of the served tokens equal the learner's within 1e-4 on average.
"""

from __future__ import annotations

from pathlib import Path

import openai
from vllm_tier import vllm_marks

from groupwise.cli.main import main
from groupwise.cli.run_prompts import training_uids
from groupwise.config import config_from_dict
from groupwise.harness.session import HarnessSession
from groupwise.run.audit import audit_run
from groupwise.run.metrics import read_metrics

pytestmark = vllm_marks()


def talks(session: HarnessSession) -> float:
    """Two requests, the second extending the first; a reward that differs within a group."""
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    first = client.chat.completions.create(model=session.model, messages=session.messages).choices[0].message
    follow = [*session.messages, {"role": "assistant", "content": first.content}, {"role": "user", "content": "More?"}]
    client.chat.completions.create(model=session.model, messages=follow)
    return float(session.sample_index % 2)


def test_a_harness_run_on_vllm_trains_exactly_the_tokens_served(tmp_path, capsys):
    from groupwise.runtime.sessions import build_run_session
    from groupwise.runtime.sync_run import run_sync

    cfg = config_from_dict(
        {
            "run": {"name": "vllm-harness", "output_dir": str(tmp_path / "runs"), "seed": 1, "max_steps": 3},
            "model": {
                "source": "tiny",
                "tiny": {
                    "num_layers": 1,
                    "hidden_size": 64,
                    "num_heads": 2,
                    "intermediate_size": 128,
                    "max_position_embeddings": 256,
                },
            },
            "data": {"task": "addition", "addition": {"max_digits": 2, "num_eval": 8}},
            "episode": {
                "harness": f"{Path(__file__).resolve()}:talks",
                "chat_template": "plain",
                "max_turns": 2,
                "max_tokens": 64,
                "max_observation_tokens": 32,
            },
            "generation": {"backend": "vllm", "max_new_tokens": 6, "vllm": {"kv_cache_gib": 1}},
            "grpo": {
                "num_prompts_per_step": 2,
                "num_generations_per_prompt": 4,
                "dynamic_sampling": {"enabled": False},
            },
            "eval": {"at_start": False, "every": 0, "num_prompts": 8},
            "checkpoint": {"every": 0},
            "logging": {"progress": False, "tensorboard": False},
        }
    )
    session = build_run_session(cfg)
    try:
        run_sync(session)
    finally:
        session.close()
    run_dir = session.run_dir.path
    steps = [m for m in read_metrics(run_dir / "metrics.jsonl") if "loss/total" in m]
    assert [m["step"] for m in steps] == [1, 2, 3]
    for metrics in steps:
        assert metrics["harness/sequences_mean"] == 1.0 and metrics["harness/retokenized_tokens"] == 0
        assert metrics["harness/requests_mean"] == 2.0 and metrics["mismatch/logprob_abs_diff"] < 1e-4
    report = audit_run(run_dir, training_uids)
    assert report.ok, report.format()
    assert main(["audit", "--replay-sessions", str(run_dir)]) == 0, capsys.readouterr().out
