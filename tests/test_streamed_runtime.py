"""The embedded runtime with continuous batching (``groupwise.runtime.streamed``): real tiny model and engine.

Invariants pinned:
- the streamed client returns, per prompt, the group the batch-per-call client returns: same completion tokens
  and rewards (logprobs within 1e-5: batch shapes differ), for prompts submitted while earlier ones decode;
- a weight sync with ``partial_rollouts: continue`` returns while rows of long rollouts are still generating, and
  those completions carry version 0 tokens then version 1 tokens; with ``off`` the sync returns only once every
  running row has finished, and every completion has one version;
- evaluation while the stream runs parks it (``PausingGenerator``: no decode step meanwhile, the rollouts go on
  afterwards) and gets the answers it gets alone;
- an async run with continuous batching and partial rollouts balances every step (trained + dropped = P),
  writes aligned train data, audits clean and accounts every generated token (generated = trained + wasted +
  pending; each fate's tokens = those of its fates.jsonl lines; every step's groups charged some seconds);
  each train_data row's ``version_spans`` cover its tokens, and ``staleness/token_mean`` is recomputed from them
  exactly (it is bounded by ``staleness/max``, not by ``staleness/mean``: a mean over groups weighs a short group
  as much as a long one);
- a rollout cancelled mid-generation (an abort) is charged what the stream spent on it once its rows left their
  slots: the tokens it held and some seconds (``spent``); a group the client never ran costs nothing;
- partial rollouts on a model the stream cannot decode are a config error (never silently one version per call);
- a weight sync loads the learner's weights only when they are the version it asked for (a mismatch is an error
  and loads nothing).
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from test_async_runtime import ready_first_async
from test_sync_trainer import tiny_config
from test_waste import tokens_by_fate

from groupwise.cli.run_prompts import training_uids
from groupwise.config import config_from_dict
from groupwise.data.loader import LoadedPrompt
from groupwise.generation.base import VersionedWeights
from groupwise.generation.pausing import PausingGenerator
from groupwise.model.lora import generator_state_dict
from groupwise.run.audit import audit_run
from groupwise.run.fates_file import read_fates
from groupwise.run.metrics import read_metrics
from groupwise.runtime.async_run import run_async
from groupwise.runtime.embedded import EmbeddedRollouts
from groupwise.runtime.streamed import StreamedRollouts
from groupwise.trainer.builder import build_components, build_session, frozen_copy

pytestmark = pytest.mark.numerics


def _parts(tmp_path, max_new: int = 8, **generation):
    cfg = tiny_config(tmp_path, generation={"max_new_tokens": max_new, **generation},
                      model={"tiny": {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64,
                                      "max_position_embeddings": 64}})  # fmt: skip
    return cfg, build_components(cfg, separate_engine_model=True)


def _weights_of(model, version: int = 1):
    """The generator-weights callable the session hands the rollout clients, over ``model`` (as ``version``)."""
    return lambda: VersionedWeights(generator_state_dict(model), version)


def _items(parts, n: int) -> list[LoadedPrompt]:
    return [LoadedPrompt(prompt=p, epoch=0, index_in_epoch=i) for i, p in enumerate(parts.task.train_prompts()[:n])]


def _streamed(parts, partial: str = "off") -> StreamedRollouts:
    stream = parts.engine.open_stream(parts.rollouts.sampling, max_rows=16, partial=partial)
    return StreamedRollouts(parts.rollouts, _weights_of(parts.policy.model), stream)


async def _when_decoding(stream, steps: int = 2) -> None:
    """Return with ``stream`` parked after at least ``steps`` decode steps (the caller resumes it)."""
    while True:
        await asyncio.sleep(0.001)
        stream.pause()
        if stream.steps >= steps:
            return
        stream.resume()


def test_streamed_groups_equal_the_batch_per_call_groups(tmp_path):
    cfg, parts = _parts(tmp_path, max_new=48)
    items = _items(parts, 8)

    async def both():
        streamed = _streamed(parts)
        try:
            first = [asyncio.ensure_future(streamed.rollout(item, i, 0, 0)) for i, item in enumerate(items[:4])]
            await _when_decoding(streamed.stream)
            later = [asyncio.ensure_future(streamed.rollout(item, 4 + i, 0, 0)) for i, item in enumerate(items[4:])]
            await asyncio.sleep(0)  # the later rollouts are submitted to the parked stream
            streamed.stream.resume()
            got = await asyncio.gather(*first, *later)
            joins = streamed.stream.joins
        finally:
            await streamed.close()
        batch = EmbeddedRollouts(parts.rollouts, _weights_of(parts.policy.model), max_batch_groups=1)
        try:
            expected = await asyncio.gather(*(batch.rollout(item, i, 0, 0) for i, item in enumerate(items)))
        finally:
            await batch.close()
        return got, expected, joins

    got, expected, joins = asyncio.run(both())
    assert joins >= 1
    assert_same_groups(got, expected)


def assert_same_groups(got, expected) -> None:
    """Same group ids, completion tokens and rewards; logprobs within 1e-5 (the batch shapes differ)."""
    for a, b in zip(got, expected, strict=True):
        assert [c.token_ids for c in a.completions] == [c.token_ids for c in b.completions]
        assert a.raw_rewards == b.raw_rewards and a.group_id == b.group_id
        for x, y in zip(a.completions, b.completions, strict=True):
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) <= 1e-5


@pytest.mark.parametrize("partial", ["continue", "off"])
def test_a_weight_sync_mid_generation(tmp_path, partial):
    cfg, parts = _parts(tmp_path, max_new=48)
    items = _items(parts, 4)
    new_weights = frozen_copy(parts.policy.model)
    for tensor in new_weights.state_dict().values():
        tensor.mul_(0.5)

    async def run():
        streamed = StreamedRollouts(parts.rollouts, _weights_of(new_weights), _streamed(parts, partial).stream)
        try:
            tasks = [asyncio.ensure_future(streamed.rollout(item, i, 0, 0)) for i, item in enumerate(items)]
            await _when_decoding(streamed.stream, 3)
            streamed.stream.resume()
            await streamed.sync_weights(1)
            progress = streamed.stream.progress().values()
            running_at_sync = sum(row is None or row.finish_reason is None for rows in progress for row in rows)
            return await asyncio.gather(*tasks), running_at_sync
        finally:
            await streamed.close()

    groups, running_at_sync = asyncio.run(run())
    versions = [set(c.token_versions) for g in groups for c in g.completions]
    if partial == "continue":
        assert running_at_sync > 0, "the sync must not wait for the running rows"
        assert {0, 1} in versions
    else:
        assert running_at_sync == 0
        assert all(v == {0} for v in versions)


def test_evaluation_parks_the_running_stream(tmp_path):
    cfg, parts = _parts(tmp_path, max_new=48)
    items = _items(parts, 4)
    steps_during: list[int] = []

    async def run():
        streamed = _streamed(parts)

        def evaluate(requests, sampling):  # what evaluation calls, recording whether the stream stepped meanwhile
            before = streamed.stream.steps
            out = parts.engine.generate(requests, sampling)
            steps_during.append(streamed.stream.steps - before)
            return out

        pausing = PausingGenerator(SimpleNamespace(generate=evaluate, version=0), streamed.stream)
        requests = [parts.rollouts.request_for(item, 7) for item in items]
        try:
            tasks = [asyncio.ensure_future(streamed.rollout(item, i, 0, 0)) for i, item in enumerate(items)]
            await _when_decoding(streamed.stream)
            streamed.stream.resume()
            during = await asyncio.to_thread(pausing.generate, requests, parts.rollouts.sampling)
            still_running = sum(not t.done() for t in tasks)
            await asyncio.gather(*tasks)
        finally:
            await streamed.close()
        return during, requests, still_running

    during, requests, still_running = asyncio.run(run())
    assert steps_during == [0] and still_running > 0
    alone = parts.engine.generate(requests, parts.rollouts.sampling)
    assert [[c.token_ids for c in per] for per in during] == [[c.token_ids for c in per] for per in alone]


def test_an_async_run_with_continuous_batching_and_partial_rollouts(tmp_path):
    cfg = tiny_config(tmp_path, run={"name": "cb", "max_steps": 3}, eval={"at_start": False, "at_end": False},
                      generation={"continuous_batching": True, "max_new_tokens": 8})  # fmt: skip
    data = ready_first_async(cfg.model_dump(by_alias=True))
    data["async"]["partial_rollouts"] = "continue"
    session = build_session(config_from_dict(data))
    summary = run_async(session)
    records = [r for r in read_metrics(session.run_dir.metrics_path) if "loss/total" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        assert record["ds/groups_trained"] + record["accounting/dropped_groups"] == cfg.grpo.num_prompts_per_step
        assert record["rollout/resumed_tokens"] == 0
        rows = [json.loads(x) for x in session.run_dir.train_data_path(record["step"]).read_text().splitlines()]
        assert len({r["group_id"] for r in rows}) == record["ds/groups_trained"]
        assert all(len(r["completion_ids"]) == len(r["generation_logprobs"]) for r in rows)
        # the per-token versions in the file give the metric back: staleness of token = trainer version − its version
        assert all(sum(n for _, n in r["version_spans"]) == len(r["completion_ids"]) for r in rows)
        trainer = record["step"] - 1
        weighted = [(trainer - version, n) for r in rows for version, n in r["version_spans"]]
        assert record["staleness/token_mean"] == pytest.approx(
            sum(s * n for s, n in weighted) / sum(n for _, n in weighted), abs=1e-12)
        assert 0 <= record["staleness/token_mean"] <= record["staleness/max"]
    report = audit_run(session.run_dir.path, training_uids)
    assert report.ok, report.format()
    # every generated token is accounted: generated = trained + wasted + pending, and each fate's tokens are those
    # of its fates.jsonl lines (the streamed client charges each group the stream's time for its rows)
    lines = read_fates(session.run_dir.fates_path)
    totals = summary.fates.generation.totals()
    by_fate = tokens_by_fate(lines)
    assert totals["generated_tokens"] == sum(by_fate.values()) > 0
    assert totals["generated_tokens"] == totals["trained_tokens"] + totals["wasted_tokens"] + totals["pending_tokens"]
    assert totals["trained_tokens"] == by_fate["trained"] == sum(r["perf/train_tokens"] for r in records)
    # seconds are charged wherever tokens were handed back (a step can be handed none, depending on timing)
    assert sum(r["waste/generated_tokens"] for r in records) > 0
    assert all((r["waste/generated_gen_seconds"] > 0) == (r["waste/generated_tokens"] > 0) for r in records)


def test_a_cancelled_rollout_is_charged_what_the_stream_spent_on_it(tmp_path):
    cfg, parts = _parts(tmp_path, max_new=48)
    items = _items(parts, 2)

    async def run():
        streamed = _streamed(parts)
        try:
            task = asyncio.ensure_future(streamed.rollout(items[0], 0, 0, 0))
            await _when_decoding(streamed.stream, 3)
            held = sum(len(r.token_ids) for rows in streamed.stream.progress().values() for r in rows if r)
            task.cancel()
            streamed.stream.resume()
            with pytest.raises(asyncio.CancelledError):
                await task
            cost = await asyncio.wait_for(streamed.spent(0), 30)
            return held, cost, await streamed.spent(99), streamed.stream.progress()
        finally:
            await streamed.close()

    held, cost, never_ran, left = asyncio.run(run())
    assert cost.tokens >= held > 0 and cost.seconds > 0
    assert never_ran.tokens == 0 and never_ran.seconds == 0 and left == {}


def test_partial_rollouts_on_a_model_without_the_stream_are_refused_not_ignored(tmp_path, monkeypatch):
    from groupwise.config import ConfigError
    from groupwise.generation.base import StreamSupport
    from groupwise.generation.engine import Engine

    unavailable = StreamSupport(False, "the model decodes with its own forward (test)")
    monkeypatch.setattr(Engine, "stream_support", lambda self: unavailable)
    data = ready_first_async(tiny_config(tmp_path, generation={"continuous_batching": True}).model_dump(by_alias=True))
    build_components(config_from_dict(data))  # off: a note, and one batch per engine call
    data["async"]["partial_rollouts"] = "continue"
    with pytest.raises(ConfigError, match=r"(?s)async.partial_rollouts.*own forward \(test\)"):
        build_components(config_from_dict(data))


def test_a_weight_sync_loads_only_the_version_it_asked_for(tmp_path):
    _, parts = _parts(tmp_path)

    async def sync(version: int) -> None:
        rollouts = EmbeddedRollouts(parts.rollouts, _weights_of(parts.policy.model, version=2), max_batch_groups=1)
        try:
            await rollouts.sync_weights(version)
        finally:
            await rollouts.close()

    with pytest.raises(RuntimeError, match="asked for version 1, but the learner's weights are version 2"):
        asyncio.run(sync(1))
    assert parts.rollouts.generator.version == 0  # nothing was loaded
    asyncio.run(sync(2))
    assert parts.rollouts.generator.version == 2
