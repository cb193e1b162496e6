"""No async run with continuous batching waits on an answer the generation stream will never give.

Invariants pinned:
- the lost-callback case: continuous batching, ``partial_rollouts: continue`` and the windowed sampler at window 0
  (every sync aborts every attempt in flight, so cancels race finishing requests at token boundaries), P = 4,
  ``max_new_tokens: 3``: the run trains all its steps, every step balanced (trained + dropped = P), audits clean,
  and every aborted attempt is charged some tokens;
- the liveness watch: ``watch_liveness`` raises ``RunStalled`` once a wait named while the generator is idle is
  still named ``bound_s`` later (within one poll), whatever happens between; a wait answered meanwhile, or
  nothing outstanding, never fires it; the state line goes to the log first;
- a real run whose stream loses one request's answer stops with ``RunStalled`` naming the lost answer within
  seconds (not ``runtime.stall_timeout_s``, here 30 min), with the controller's state in events.log, every
  in-flight attempt ``pending`` (``StreamedRollouts.idle_waits`` names it once the stream idles).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from fakes import run_virtual
from test_async_runtime import ready_first_async
from test_sync_trainer import tiny_config

from groupwise.cli.run_prompts import training_uids
from groupwise.config import config_from_dict
from groupwise.run.audit import audit_run
from groupwise.run.fates_file import read_fates
from groupwise.run.metrics import read_metrics
from groupwise.runtime.async_run import run_async
from groupwise.runtime.watchdog import RunStalled, watch_liveness
from groupwise.trainer.builder import build_session

pytestmark = pytest.mark.numerics


def windowed_partial_config(tmp_path, name: str, steps: int, **runtime):
    cfg = tiny_config(tmp_path, run={"name": name, "max_steps": steps}, eval={"at_start": False, "at_end": False},
                      generation={"continuous_batching": True, "max_new_tokens": 3})  # fmt: skip
    data = ready_first_async(cfg.model_dump(by_alias=True))
    data["async"] = {"partial_rollouts": "continue", "sampler": {"name": "windowed", "max_staleness_versions": 0},
                     "max_buffered_rollouts": 16, "max_inflight_prompts": 16}  # fmt: skip
    data["runtime"] = runtime
    return config_from_dict(data)


def test_windowed_partial_rollouts_at_window_0_train_every_step(tmp_path):
    steps = 30
    session = build_session(windowed_partial_config(tmp_path, "w0", steps, stall_timeout_s=60.0))
    summary = run_async(session)
    assert summary.steps_trained == steps
    records = [r for r in read_metrics(session.run_dir.metrics_path) if "loss/total" in r]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert all(r["ds/groups_trained"] + r["accounting/dropped_groups"] == 4 for r in records)
    assert audit_run(session.run_dir.path, training_uids).ok
    aborted = [line for line in read_fates(session.run_dir.fates_path) if line["fate"] == "aborted"]
    assert aborted, "window 0 aborts the attempts in flight at every sync"
    assert summary.fates.generation.totals()["aborted_tokens"] == sum(line["tokens"] for line in aborted)


def watched(waits_at: dict[float, list[str]], bound_s: float = 10.0):
    """Run ``watch_liveness`` over a scripted ``idle_waits`` (the waits named from each time on) for 100 s."""
    logged: list[str] = []

    async def main():
        loop = asyncio.get_running_loop()
        start = loop.time()

        def idle_waits():
            now = loop.time() - start
            return next((w for t, w in sorted(waits_at.items(), reverse=True) if now >= t), [])

        watch = asyncio.ensure_future(watch_liveness(idle_waits, bound_s, lambda: "state-line", logged.append, 0.5))
        done, _ = await asyncio.wait({watch}, timeout=100.0)
        if not done:
            watch.cancel()
            return None
        try:
            watch.result()
        except RunStalled as stalled:
            return loop.time() - start, str(stalled)

    return run_virtual(main), logged


def test_a_wait_named_on_an_idle_generator_for_the_bound_is_a_stall():
    fired, logged = watched({0.0: [], 5.0: ["a"], 9.0: [], 12.0: ["a", "b"]})  # "a" busy at 9-12 s: still lost
    assert fired is not None and 15.0 <= fired[0] <= 15.5
    assert "2 answer(s) awaited from the generator" in fired[1] and "state-line" in fired[1]
    assert len(logged) == 1 and logged[0].startswith("liveness watch:") and "state-line" in logged[0]


def test_answered_waits_and_a_busy_generator_never_fire_it():
    fired, _ = watched({0.0: ["a"], 8.0: ["b"], 16.0: ["c"], 24.0: [], 30.0: ["d"], 39.0: []})
    assert fired is None


def test_a_stream_that_loses_an_answer_stops_the_run_within_seconds(tmp_path, monkeypatch):
    from groupwise.generation.stream import GenerationStream

    real_submit = GenerationStream.submit
    submitted = []

    def submit_losing_the_fifth(self, request, on_done):  # the fifth request's answer is lost
        submitted.append(1)
        return real_submit(self, request, (lambda outcome: None) if len(submitted) == 5 else on_done)

    monkeypatch.setattr(GenerationStream, "submit", submit_losing_the_fifth)
    cfg = tiny_config(tmp_path, run={"name": "lost", "max_steps": 50}, eval={"at_start": False, "at_end": False},
                      generation={"continuous_batching": True})  # fmt: skip
    data = ready_first_async(cfg.model_dump(by_alias=True))
    data["async"]["sampler"] = {"name": "in_order", "max_lookahead_versions": 1}  # its step needs the lost group
    data["runtime"] = {"stall_timeout_s": 1800.0}
    session = build_session(config_from_dict(data))
    begin = time.monotonic()
    with pytest.raises(RunStalled, match=r"1 answer\(s\) awaited from the generator .* for 10 s"):
        run_async(session)
    assert time.monotonic() - begin < 60.0
    events = session.run_dir.events_path.read_text()
    assert "liveness watch:" in events and "inflight=" in events and "trainer_v=" in events
    lines = read_fates(session.run_dir.fates_path)
    last = {line["group_id"]: line for line in lines}
    assert any(line["fate"] == "pending" for line in last.values())  # the attempt whose answer was lost
