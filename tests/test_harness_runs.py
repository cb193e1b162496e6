"""Harness sessions in whole runs: what trains is what was served, and a harness that fails is a fate, never a 0.

Invariants pinned:
- each way a harness can fail — it raises, returns something that is not a number or None, never calls the
  endpoint, runs past ``episode.harness_timeout_s``, or (a command) exits non-zero — fails its group with an error
  naming the harness, the prompt, the sample and what happened, charged with the tokens its sessions were served;
- a harness command gets the endpoint in ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` and the session on stdin, and
  reports its reward on its last line of output or in ``$GROUPWISE_REWARD_FILE``; one past its deadline is killed
  with everything it started (its process group);
- plain and ``async`` harness functions train in a sync run and in an async run on the generation stream (with
  partial rollouts: a request in flight across a weight load keeps each token's version): every
  trained row is exactly the sequence its session's log replays to (``groupwise audit --replay-sessions`` passes,
  and finds a row that was tampered with), the learner's tokens are the served ones, and ``harness/*`` is logged;
- an async run whose harness fails on one prompt skips that prompt with its fate and trains on; the audit passes;
- an async harness run killed in the middle of a checkpoint resumes losing and doubling nothing, its in-flight
  sessions started again;
- config mistakes about a harness are reported by ``config check`` before any model loads, naming each key.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from test_episode_runs import TINY, episode_config, killed_in_a_checkpoint_then_resumed
from test_episodes import EOS, TOKENIZER, ScriptedGenerator, chars

from groupwise.cli.main import main
from groupwise.episodes.template import PLAIN_CHAT_TEMPLATE
from groupwise.episodes.tool_formats import TOOL_FORMATS
from groupwise.harness.endpoint import EndpointSettings
from groupwise.harness.launch import HarnessSpec
from groupwise.harness.live import SessionLimits
from groupwise.harness.render import RequestRenderer
from groupwise.harness.runner import HarnessError, HarnessRunner, HarnessSettings
from groupwise.harness.session import HarnessSession
from groupwise.run.metrics import read_metrics
from groupwise.runtime.async_run import run_async
from groupwise.runtime.sync_run import run_sync
from groupwise.trainer.builder import build_session
from groupwise.types import Prompt, SamplingParams, cost_of

PROMPT = Prompt("game/0", "3", messages=({"role": "user", "content": "Guess 1 to 5."},))


def ask(session: HarnessSession) -> str:
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    reply = client.chat.completions.create(model=session.model, messages=session.messages, max_tokens=4)
    return reply.choices[0].message.content or ""


def raises(session: HarnessSession) -> float:
    ask(session)
    raise ValueError("the agent crashed")


def not_a_number(session: HarnessSession) -> object:
    ask(session)
    return "high"


def never_calls(session: HarnessSession) -> float:
    return 1.0


def hangs(session: HarnessSession) -> float:
    ask(session)
    time.sleep(30)
    return 1.0


def talks(session: HarnessSession) -> float | None:
    """Two requests, the second extending the first; its reward depends on the sample (a group with signal)."""
    client = openai.OpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    first = client.chat.completions.create(model=session.model, messages=session.messages).choices[0].message
    follow = [*session.messages, {"role": "assistant", "content": first.content}, {"role": "user", "content": "More?"}]
    client.chat.completions.create(model=session.model, messages=follow)
    return float(session.sample_index % 2)


async def talks_async(session: HarnessSession) -> float:
    client = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    stream = await client.chat.completions.create(model=session.model, messages=session.messages, stream=True)
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
    return float((len(text) + session.sample_index) % 2)


def fails_on_game_1(session: HarnessSession) -> float:
    if session.prompt.uid.endswith("/1"):
        raise RuntimeError("this game is broken")
    return talks(session) or 0.0


def runner(spec: HarnessSpec, timeout_s: float = 10.0) -> HarnessRunner:
    renderer = RequestRenderer(TOKENIZER, PLAIN_CHAT_TEMPLATE, TOOL_FORMATS["hermes"])
    return HarnessRunner(
        HarnessSettings(
            spec, renderer, SessionLimits(4, 200, 8, 64, 512), timeout_s, EndpointSettings(), batch_window_s=0.01
        )
    )


def run_group(spec: HarnessSpec, timeout_s: float = 10.0, **settings: Any):
    """One group of 2 sessions of ``spec`` on a fake generator; ``settings`` replace the harness settings' own."""
    harness = runner(spec, timeout_s)
    harness.settings = dataclasses.replace(harness.settings, **settings)
    generator = ScriptedGenerator(lambda context, seed: chars("ok") + [EOS])
    try:
        [outcome] = harness.run_groups(generator, SamplingParams(max_new_tokens=8), [PROMPT], [1], 2)
    finally:
        harness.close()
    return outcome


@pytest.mark.parametrize(
    ("function", "timeout_s", "says", "served"),
    [
        (raises, 30.0, "it raised ValueError: the agent crashed", 6),
        (not_a_number, 30.0, "it returned 'high' of type str, not a number or None", 6),
        (never_calls, 30.0, "it never called the endpoint", 0),
        (hangs, 2.0, "it ran past episode.harness_timeout_s=2 s and was stopped", 6),
    ],
)
def test_a_failing_harness_fails_its_group_with_a_fate_never_a_zero(function, timeout_s, says, served):
    outcome = run_group(HarnessSpec("test-harness", function=function), timeout_s=timeout_s)
    assert isinstance(outcome, HarnessError)
    assert str(outcome) == f"harness 'test-harness' failed (prompt 'game/0', sample 0): {says}"
    assert cost_of(outcome).tokens == served  # 3 tokens served to each of the 2 sessions that asked


AGENT = """
import json, os, sys, urllib.request
session = json.load(sys.stdin)
assert os.environ["OPENAI_API_KEY"] == session["api_key"]
body = json.dumps({"model": session["model"], "messages": session["messages"]}).encode()
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
                                 headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
reply = json.load(urllib.request.urlopen(request))["choices"][0]["message"]["content"]
MODE
"""


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("print('thinking...'); print(len(reply) + session['sample_index'])", [2.0, 3.0]),
        ("open(os.environ['GROUPWISE_REWARD_FILE'], 'w').write('0.5'); print('ignored')", [0.5, 0.5]),
    ],
)
def test_a_harness_command_reports_its_reward_on_its_last_line_or_in_its_reward_file(tmp_path, mode, expected):
    script = tmp_path / "agent.py"
    script.write_text(AGENT.replace("MODE", mode))
    outcome = run_group(HarnessSpec("agent.py", command=(sys.executable, str(script))))
    assert not isinstance(outcome, HarnessError), outcome
    assert [result.reward for result in outcome] == expected
    assert all(result.session.counts.served_tokens == 3 for result in outcome)


def test_a_failing_or_stuck_command_is_named_and_killed_with_its_process_group(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text("import sys; print('bad input', file=sys.stderr); sys.exit(3)")
    outcome = run_group(HarnessSpec("fails.py", command=(sys.executable, str(script))))
    assert isinstance(outcome, HarnessError) and "its command exited with status 3" in str(outcome)
    assert "bad input" in str(outcome)
    pids = tmp_path / "pids"
    stuck = tmp_path / "stuck.py"
    stuck.write_text(
        f"import subprocess, time\nchild = subprocess.Popen(['sleep', '60'])\n"
        f"open({str(pids)!r}, 'a').write(str(child.pid) + '\\n')\ntime.sleep(60)\n"
    )
    started = time.monotonic()
    outcome = run_group(HarnessSpec("stuck.py", command=(sys.executable, str(stuck))), timeout_s=1.5)
    assert isinstance(outcome, HarnessError) and "ran past episode.harness_timeout_s=1.5 s" in str(outcome)
    assert time.monotonic() - started < 10
    time.sleep(0.2)
    for pid in pids.read_text().split():
        assert not _alive(int(pid)), "the harness's own child was left running"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def harness_config(tmp_path: Path, mode: str = "sync", harness: str = "test_harness_runs:talks", **sections):
    """The episode runs' tiny config (guess-the-number prompts, plain template), its episodes driven by ``harness``."""
    episode = {
        "environment": None,
        "kwargs": {},
        "harness": harness,
        "harness_timeout_s": 60,
        **sections.pop("episode", {}),
    }
    return episode_config(tmp_path, mode, episode=episode, **sections)


def check_run(run_dir: Path, steps: list[int], capsys) -> None:
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if "loss/total" in r]
    assert [r["step"] for r in records] == steps
    for record in records:
        rows = [
            json.loads(x) for x in (run_dir / "train_data" / f"step_{record['step']}.jsonl").read_text().splitlines()
        ]
        served = sum(
            len(c["token_ids"])
            for r in rows
            if r["episode"]
            for e in r["episode"]["harness"]["log"]
            for c in e["choices"]
        )
        assert record["perf/train_tokens"] == served
        assert record["harness/sequences_mean"] == 1.0 and record["harness/retokenized_tokens"] == 0
    assert main(["audit", "--replay-sessions", str(run_dir)]) == 0, capsys.readouterr().out
    assert "0 mismatch(es)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("mode", "harness", "sections"),
    [
        ("sync", "test_harness_runs:talks", {}),
        (
            "async",
            "test_harness_runs:talks_async",
            {
                "generation": {"max_new_tokens": 4, "continuous_batching": True},
                "async": {
                    "sampler": {"name": "ready_first", "max_staleness_versions": 1},
                    "max_buffered_rollouts": 4,
                    "max_inflight_prompts": 4,
                    "partial_rollouts": "continue",
                },
            },
        ),
    ],
    ids=["sync", "async-stream-partial-rollouts"],
)
def test_a_run_trains_exactly_the_tokens_its_sessions_were_served(tmp_path, capsys, mode, harness, sections):
    session = build_session(harness_config(tmp_path, mode, harness, eval={"at_start": False}, **sections))
    try:
        (run_sync if mode == "sync" else run_async)(session)
    finally:
        session.close()
    run_dir = session.run_dir.path
    check_run(run_dir, [1, 2], capsys)
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [2]  # held-out evaluation runs the harness too
    path = run_dir / "train_data" / "step_1.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows[0]["completion_ids"][-1] = (rows[0]["completion_ids"][-1] + 1) % 40  # a row that was not served
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["audit", "--replay-sessions", str(run_dir)]) == 1
    assert "the trained ids are not the ids the log served" in capsys.readouterr().out


ASYNC = {
    "sampler": {"name": "in_order", "max_lookahead_versions": 1},
    "max_buffered_rollouts": 8,
    "max_inflight_prompts": 8,
    "rollout_failure": {"replacement_reserve_prompts": 4, "max_replacement_attempts": 16},
}


def test_an_async_run_skips_a_prompt_whose_harness_fails_and_trains_on(tmp_path, capsys):
    from groupwise.run.fates_file import read_fates

    skipping = {
        **ASYNC,
        "rollout_failure": {**ASYNC["rollout_failure"], "max_skipped_prompts": 4, "backoff_base_s": 0.0},
    }
    cfg = harness_config(
        tmp_path,
        "async",
        "test_harness_runs:fails_on_game_1",
        eval={"at_start": False, "at_end": False},
        **{"async": skipping},
    )
    session = build_session(cfg)
    try:
        run_async(session)
    finally:
        session.close()
    failed = [line for line in read_fates(session.run_dir.fates_path) if line["fate"] == "failed"]
    assert failed and all(line["prompt_uid"].endswith("/1") for line in failed)
    assert "harness 'test_harness_runs:fails_on_game_1' failed" in failed[0]["detail"]
    assert main(["audit", str(session.run_dir.path)]) == 0, capsys.readouterr().out
    check_run(session.run_dir.path, [1, 2], capsys)


def test_an_async_harness_run_killed_mid_checkpoint_resumes_losing_and_doubling_nothing(tmp_path, monkeypatch, capsys):
    from groupwise.cli.run_prompts import training_uids
    from groupwise.run.audit import audit_run

    def config(max_steps: int):
        return harness_config(
            tmp_path,
            "async",
            run={"name": "resume", "max_steps": max_steps},
            eval={"at_start": False, "at_end": False},
            checkpoint={"every": 1, "keep_last": 3, "save_final": False},
            generation={"max_new_tokens": 4, "continuous_batching": True},
            **{"async": ASYNC},
        )

    resumed = killed_in_a_checkpoint_then_resumed(config, monkeypatch)
    resumed.close()
    run_dir = resumed.run_dir.path
    report = audit_run(run_dir, training_uids)
    assert report.ok, report.format()
    check_run(run_dir, [1, 2, 3, 4], capsys)


def test_harness_mistakes_are_refused_before_any_model_loads(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(
        json.dumps(
            {
                "model": {"source": "tiny"},
                "data": {"task": "addition"},
                "episode": {"harness": "no_such_module:run", "environment": "calculator", "harness_timeout_s": 5},
            }
        )
    )
    assert main(["config", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "episode.harness" in err and "episode.environment and episode.harness are both set" in err
    path.write_text(
        json.dumps(
            {"model": {"source": "tiny"}, "data": {"task": "addition"}, "episode": {"harness": "no_such_module:run"}}
        )
    )
    assert main(["config", "check", str(path)]) == 2
    assert "cannot import module 'no_such_module'" in capsys.readouterr().err
    path.write_text(
        json.dumps(
            {
                "model": {"source": "tiny"},
                "data": {"task": "addition"},
                "episode": {"harness_command": ["no-such-agent-program", "--go"]},
            }
        )
    )
    assert main(["config", "check", str(path)]) == 2
    assert "its program 'no-such-agent-program' is neither on PATH nor a file here" in capsys.readouterr().err
    path.write_text(
        json.dumps(
            {
                "model": {"source": "tiny"},
                "data": {"task": "addition"},
                "episode": {"environment": "calculator", "endpoint": {"port": 8123}},
            }
        )
    )
    assert main(["config", "check", str(path)]) == 2
    assert "episode.endpoint.port has no effect with episode.environment" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("mode", "sections"),
    [
        ("sync", {"model": {"source": "tiny", "tiny": TINY, "lora": {"enabled": True, "rank": 4}}}),
        ("sync", {"learner": {"num_ranks": 2, "sharding": "ddp"}}),
        pytest.param(
            "async",
            {
                "runtime": {"backend": "ray"},
                "async": {
                    "sampler": {"name": "ready_first", "max_staleness_versions": 1},
                    "max_buffered_rollouts": 4,
                    "max_inflight_prompts": 4,
                },
            },
            marks=pytest.mark.ray,
        ),
    ],
    ids=["lora", "two-learner-ranks", "ray"],
)
def test_sessions_train_with_lora_learner_ranks_and_on_ray(request, tmp_path, capsys, mode, sections):
    from groupwise.cli.run_prompts import training_uids
    from groupwise.run.audit import audit_run
    from groupwise.runtime.sessions import build_run_session

    if "runtime" in sections:
        pytest.importorskip("ray")
        request.getfixturevalue("ray_cluster")
    harness = f"{Path(__file__).resolve()}:talks"  # a file path: a Ray worker imports it wherever it runs
    session = build_run_session(
        harness_config(tmp_path, mode, harness, eval={"at_start": False, "at_end": False}, **sections)
    )
    try:
        (run_sync if mode == "sync" else run_async)(session)
    finally:
        session.close()
    check_run(session.run_dir.path, [1, 2], capsys)
    report = audit_run(session.run_dir.path, training_uids)
    assert report.ok, report.format()
