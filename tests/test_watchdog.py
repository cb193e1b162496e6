"""The stall watchdog of real runs: a run never waits without bound on a call that does not return.

Pinned:
- ``watch_progress`` raises ``RunStalled`` once the progress marker has not changed for ``timeout_s`` (measured from
  its last change, within one poll), after logging the state it was given; ``run_watched`` returns the main
  coroutine's result when it finishes first, and cancels it (its cleanup runs) when the watchdog fires;
- an async run (embedded runtime, tiny model) whose generation never returns stops with ``RunStalled`` within
  seconds of ``runtime.stall_timeout_s``; events.log holds the controller's state (trainer version, dispatch index,
  gate window, slots in flight, buffer length, per-start-version ready/slots, spare pool); every in-flight attempt
  ends ``pending``; no ``final/`` is written;
- a sync run whose generation round never returns stops the same way, naming the step and the round's prompts;
- ``groupwise train`` of a run with a verifier that never returns exits 1 with ``RunStalled`` and no traceback;
  as a real process too, sync and async, when the stuck verifier is busy in torch kernels (its thread cannot be
  stopped: the process must not abort in interpreter teardown, exit 134);
- ``runtime.stall_timeout_s`` must exceed ``async.rollout_failure.max_backoff_s`` (a config error otherwise).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from fakes import run_virtual
from test_sync_trainer import tiny_config

from groupwise.cli.main import main
from groupwise.config import ConfigError, config_from_dict
from groupwise.run.fates_file import read_fates
from groupwise.runtime.async_run import run_async
from groupwise.runtime.sync_run import run_sync
from groupwise.runtime.watchdog import RunStalled, run_watched, watch_progress
from groupwise.trainer.builder import build_session


def test_the_watchdog_fires_one_timeout_after_the_last_change_and_cancels_the_run():
    changes = {"value": 0}
    logged: list[str] = []
    cleaned = []

    async def work():
        try:
            for _ in range(5):  # progress at t = 10, 20, 30, 40, 50, then silence
                await asyncio.sleep(10.0)
                changes["value"] += 1
            await asyncio.sleep(10_000.0)
        finally:
            cleaned.append(asyncio.get_running_loop().time())

    async def main_():
        watchdog = watch_progress(lambda: changes["value"], 30.0, lambda: "state-line", logged.append, poll_s=1.0)
        await run_watched(work(), watchdog)

    with pytest.raises(RunStalled, match=r"nothing progressed for 30 s \(runtime.stall_timeout_s\).*state-line"):
        run_virtual(main_, timeout=1_000.0)
    assert len(cleaned) == 1 and 80.0 <= cleaned[0] <= 81.0  # 50 + 30, within one poll
    assert len(logged) == 1 and logged[0].startswith("stall watchdog:") and "state-line" in logged[0]

    async def quick():
        await asyncio.sleep(1.0)
        return "done"

    async def main_quick():
        return await run_watched(quick(), watch_progress(lambda: 0, 30.0, str, logged.append, poll_s=1.0))

    assert run_virtual(main_quick) == "done"


def never_answer(session):
    """The engine never returns from a generation call (until the test releases it)."""
    release = threading.Event()

    def generate(requests, sampling):
        release.wait()
        raise RuntimeError("released by the test")

    session.engine.generate = generate
    return release


def watchdog_config(tmp_path, mode, **sections):
    cfg = tiny_config(tmp_path, run={"name": mode, "max_steps": 2}, eval={"at_start": False, "at_end": False},
                      grpo={"dynamic_sampling": {"enabled": False}})  # fmt: skip
    data = cfg.model_dump(by_alias=True)
    data["mode"] = mode
    data["grpo"]["dynamic_sampling"] = {"enabled": False}
    data["runtime"] = {"stall_timeout_s": 1.0}
    if mode == "async":
        data["async"] = {"sampler": {"name": "ready_first", "max_staleness_versions": 1}, "max_buffered_rollouts": 8,
                         "rollout_failure": {"backoff_base_s": 0.1, "max_backoff_s": 0.5}}  # fmt: skip
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return config_from_dict(data)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_generator_that_never_answers_stops_the_run_with_its_state_logged(tmp_path, mode):
    session = build_session(watchdog_config(tmp_path, mode))
    release = never_answer(session)
    begin = time.monotonic()
    try:
        with pytest.raises(RunStalled, match=r"nothing progressed for 1 s \(runtime.stall_timeout_s\)"):
            run_async(session) if mode == "async" else run_sync(session)
        assert time.monotonic() - begin < 15.0
    finally:
        release.set()
    events = (session.run_dir.path / "events.log").read_text()
    assert "stall watchdog:" in events
    if mode == "async":
        for field in ("trainer_v=0", "dispatch_index=", "gate_window=1", "inflight=", "buffer_len=",
                      "per_start_weight={0: '0 ready/", "spare_pool="):  # fmt: skip
            assert field in events, field
        lines = read_fates(session.run_dir.fates_path)
        assert lines and all(line["fate"] == "pending" for line in lines)
        assert len({line["group_id"] for line in lines}) == len(lines)
    else:
        assert "sync step 0 (next group id 4): a round of 4 prompt(s) being generated (addition/train/" in events
    assert not (session.run_dir.path / "final").exists()


def test_train_with_a_verifier_that_never_returns_exits_1(tmp_path, capsys):
    cfg = watchdog_config(tmp_path, "sync", reward={"function": "scripted_rewards:waits_forever"})
    path = tmp_path / "stuck.yaml"
    path.write_text(cfg.to_yaml())
    assert main(["train", str(path)]) == 1
    err = capsys.readouterr().err
    assert "the run failed: RunStalled: nothing progressed for 1 s" in err and "Traceback" not in err


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_stalled_process_exits_1_while_the_stuck_call_runs_in_torch(tmp_path, mode):
    import os
    import subprocess
    import sys
    from pathlib import Path

    failure = {"async": {"rollout_failure": {"backoff_base_s": 0.1, "max_backoff_s": 0.5}}} if mode == "async" else {}
    cfg = watchdog_config(tmp_path, mode, reward={"function": "scripted_rewards:spins_in_torch"}, **failure)
    path = tmp_path / "spinning.yaml"
    path.write_text(cfg.to_yaml())
    tests = str(Path(__file__).resolve().parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "groupwise.cli", "train", str(path)], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert "the run failed: RunStalled" in done.stderr
    assert "terminate called" not in done.stderr and "Traceback" not in done.stderr
    assert done.returncode == 1, done.stderr[-2000:]


def test_the_stall_timeout_must_exceed_the_longest_backoff():
    data = {"mode": "async", "model": {"source": "tiny"}, "loss": {"importance_sampling": True},
            "runtime": {"stall_timeout_s": 30.0}}  # fmt: skip
    with pytest.raises(ConfigError, match=r"runtime.stall_timeout_s must exceed async.rollout_failure.max_backoff_s"):
        config_from_dict(data)
    data["async"] = {"rollout_failure": {"max_backoff_s": 10.0}}
    assert config_from_dict(data).runtime.stall_timeout_s == 30.0
