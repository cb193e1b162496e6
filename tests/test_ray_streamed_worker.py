"""A Ray generation worker with continuous batching, called from threads as Ray calls a threaded actor (no cluster).

Invariants pinned (a real tiny model and engine in this process; ``GenerationWorker`` is the actor's class):
- groups submitted by concurrent calls share one generation stream and come back with the tokens the
  batch-per-call worker gives each (logprobs within 1e-5: batch shapes differ); the stream took later calls'
  groups in while earlier ones decoded (``joins`` ≥ 1);
- ``load_weights`` is accepted while a generation call runs (another thread of the actor): with
  ``partial_rollouts: continue`` it returns while that call's rows are still generating, the call's completions
  carry version 0 tokens then version 1 tokens, and the group's ``start_version`` is its oldest token's; with
  ``off`` it returns only once the running rows finished, and every completion has one version;
- ``progress`` during a call reports, by group id, a prefix of each sample's final tokens; a resumed call given
  that progress returns the uninterrupted tokens; ``cancel_groups`` ends a running call with ``GroupCancelled`` in
  the group's place, carrying its cost (at least the tokens it held when cancelled, and some seconds), and frees
  its rows (the stream goes on serving); a returned group's ``gen_seconds`` is the stream's time for it.
"""

from __future__ import annotations

import threading
import time

import pytest
from test_streamed_runtime import assert_same_groups
from test_sync_trainer import tiny_config

from groupwise.data.loader import LoadedPrompt
from groupwise.runtime.inflight import prefixes_from
from groupwise.types import cost_of

pytest.importorskip("ray")
from groupwise.runtime.ray.actors import GenerationWorker  # noqa: E402
from groupwise.runtime.ray.stream_worker import GroupCancelled  # noqa: E402
from groupwise.trainer.builder import build_components, frozen_copy  # noqa: E402

pytestmark = pytest.mark.numerics


def _cfg(tmp_path, partial: str = "off", continuous: bool = True):
    data = {"max_new_tokens": 48, "continuous_batching": continuous, "micro_batch_groups": 4}
    cfg = tiny_config(tmp_path, generation=data, model={"tiny": {"num_layers": 1, "hidden_size": 32, "num_heads": 2,
                      "intermediate_size": 64, "max_position_embeddings": 64}})  # fmt: skip
    return cfg.model_copy(update={"async_": cfg.async_.model_copy(update={"partial_rollouts": partial})})


def _items(cfg, n: int) -> list[LoadedPrompt]:
    prompts = build_components(cfg).task.train_prompts()[:n]
    return [LoadedPrompt(prompt=p, epoch=0, index_in_epoch=i) for i, p in enumerate(prompts)]


def _in_thread(fn, *args):
    out: dict[str, object] = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as error:  # noqa: BLE001 — handed to the test
            out["value"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _when_decoding(worker, steps: int = 3) -> None:
    deadline = time.monotonic() + 60
    while worker.stream.stream.steps < steps:
        assert time.monotonic() < deadline, "the stream never decoded"
        time.sleep(0.001)


def test_concurrent_calls_share_the_stream_and_give_the_batch_per_call_tokens(tmp_path):
    cfg = _cfg(tmp_path)
    worker, items = GenerationWorker(cfg, 0), _items(cfg, 6)
    calls = []
    for i, item in enumerate(items):
        calls.append(_in_thread(worker.generate_group_outcomes, [item], [i], [0]))
        if i == 1:
            _when_decoding(worker, 2)  # the later calls join a running decode loop
    for thread, _ in calls:
        thread.join(60)
    got = [out["value"][0] for _, out in calls]
    assert worker.stream.stream.joins >= 1
    assert all(g.gen_seconds > 0 for g in got)  # the stream's time, split among the rows each step ran
    assert sum(g.gen_seconds for g in got) <= worker.stream.stream.busy_seconds
    reference = GenerationWorker(_cfg(tmp_path, continuous=False), 0)
    expected = reference.generate_group_outcomes(items, list(range(len(items))), [0] * len(items))
    assert_same_groups(got, expected)


@pytest.mark.parametrize("partial", ["continue", "off"])
def test_weights_load_while_a_call_runs(tmp_path, partial):
    cfg = _cfg(tmp_path, partial)
    worker, items = GenerationWorker(cfg, 0), _items(cfg, 4)
    new = frozen_copy(worker.engine.model)
    for tensor in new.state_dict().values():
        tensor.mul_(0.5)
    thread, out = _in_thread(worker.generate_group_outcomes, items, list(range(4)), [0] * 4)
    _when_decoding(worker)
    assert worker.load_weights(new.state_dict(), 1) == 1
    still_running = thread.is_alive()
    thread.join(60)
    groups = out["value"]
    versions = [set(c.token_versions) for g in groups for c in g.completions]
    if partial == "continue":
        assert still_running, "the load must not wait for the running call"
        assert {0, 1} in versions
        assert all(g.start_version == 0 and g.end_version == 1 for g in groups)
    else:
        assert all(v == {0} for v in versions)


def test_progress_resume_and_cancel(tmp_path):
    cfg = _cfg(tmp_path)
    worker, items = GenerationWorker(cfg, 0), _items(cfg, 2)
    full, second = worker.generate_group_outcomes(items, [0, 10], [0, 0])
    thread, out = _in_thread(worker.generate_group_outcomes, items[:1], [1], [0])
    _when_decoding(worker, worker.stream.stream.steps + 2)
    with worker.stream.stream.paused():
        progress = worker.progress()
    assert set(progress) == {1}
    rows = progress[1]["rows"]
    for row, c in zip(rows, full.completions, strict=True):
        assert row is None or tuple(row["token_ids"]) == c.token_ids[: len(row["token_ids"])]
    thread.join(60)
    prefixes, why = prefixes_from(progress[1], worker.rollouts.request_for(items[0], 0), worker.rollouts.sampling)
    assert why is None and any(p is not None for p in prefixes)
    resumed = worker.generate_group_outcomes(items[:1], [2], [0], [prefixes])[0]
    assert [c.token_ids for c in resumed.completions] == [c.token_ids for c in full.completions]

    thread, out = _in_thread(worker.generate_group_outcomes, items[1:], [3], [0])
    _when_decoding(worker, worker.stream.stream.steps + 2)
    with worker.stream.stream.paused():
        held = worker.stream.stream.progress()
    worker.cancel_groups([3])
    thread.join(60)
    (cancelled,) = out["value"]  # in the group's place, with what it cost until its rows left the stream
    assert isinstance(cancelled, GroupCancelled)
    at_cancel = sum(len(row.token_ids) for rows in held.values() for row in rows if row is not None)
    assert cost_of(cancelled).tokens >= at_cancel > 0 and cost_of(cancelled).seconds > 0
    deadline = time.monotonic() + 60
    while worker.stream.stream.progress():  # the stream drops the cancelled rows at its next token boundary
        assert time.monotonic() < deadline, "the cancelled group kept its rows"
        time.sleep(0.001)
    assert worker.progress() == {}
    again = worker.generate_group_outcomes(items[1:], [4], [0])[0]  # the stream goes on serving
    assert [c.token_ids for c in again.completions] == [c.token_ids for c in second.completions]
