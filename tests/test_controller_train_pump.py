"""The train pump and the controller as a whole (invariants 5, 6, 8 and 9 in docs/design.md).

Covered: sync ≡ async ordering (in_order, lookahead 0, full-batch chunks, DS off, on_dropped_prompt shrink: prompts
trained in loader order, one chunk and one optimizer step per step, zero staleness, one weight sync per step), and
with replace the documented difference (the second loader batch goes to the spare pool and trains last); streaming
chunks of at least ``min_groups_for_streaming_train`` with exactly one finish_step per step; clean stop at
the end of data vs a named RolloutExhaustedError when groups are left that the sampler cannot select; step
metrics (tally over every generated group incl. filtered ones, accounting, staleness, versions, trainer
metrics); weight_fifo + DS refused at build with the explanation, capacity below the sampler's need
refused (built-in and custom); the weight_fifo bucket-mismatch hang (replace + an infra drop) reported as
ControllerStalled with the per-version buffer, while ready_first completes the same schedule; a trainer crash
reaches the caller naming the step and stops rollouts; max_steps stops the run with in-flight and buffered
work recorded as pending; an async on_step_end hook can snapshot state, and resuming from it trains the same
prompts per step as an uninterrupted run.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from fakes import Outcome, RecordingTrainer, ScriptedRollouts, make_loader, make_prompts, run_virtual
from fakes.settings import controller_settings, failure_settings

from groupwise.config import sampler_config
from groupwise.controller.controller import build_controller
from groupwise.controller.settings import ControllerSettings
from groupwise.controller.train_pump import ControllerStalled, RolloutExhaustedError
from groupwise.data.loader import PromptLoader

G = 2


def cfg(sampler="in_order", knobs=None, P=3, **kw) -> ControllerSettings:
    kw.setdefault("failure", failure_settings(min_step_batch_fraction=0.5))
    kw.setdefault("dynamic_sampling", False)
    kw.setdefault("max_buffered_rollouts", 16)
    return controller_settings(prompts_per_step=P, group_size=G, sampler=sampler_config(sampler, **(knobs or {})), **kw)


def random_latencies(n: int, seed: int) -> dict[str, list[Outcome]]:
    rng = random.Random(seed)
    return {f"p{i}": [Outcome(latency=rng.choice([0.5, 1.0, 3.0, 7.0]))] for i in range(n)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sync_equivalent_ordering_with_in_order_lookahead_zero(seed):
    prompts = make_prompts(12)
    expected = [item.prompt.uid for item in PromptLoader(prompts, seed=3, shuffle=True, max_epochs=1).take(12)]
    loader = PromptLoader(prompts, seed=3, shuffle=True, max_epochs=1)
    rollouts = ScriptedRollouts(group_size=G, script=random_latencies(12, seed))
    trainer = RecordingTrainer()
    metrics = {}
    shrink = failure_settings(on_dropped_prompt="shrink", min_step_batch_fraction=0.5)
    controller = build_controller(
        cfg("in_order", {"max_lookahead_versions": 0}, failure=shrink),
        loader,
        rollouts,
        trainer,
        on_step_end=lambda s, m, g: metrics.__setitem__(s, m),
    )
    summary = run_virtual(controller.run)
    assert trainer.uids_per_step() == {s: expected[3 * s : 3 * s + 3] for s in range(4)}
    assert [c.step for c in trainer.chunks] == [0, 1, 2, 3] and trainer.finished == [0, 1, 2, 3]
    assert all(g.start_version == c.step for c in trainer.chunks for g in c.groups)
    assert [metrics[s]["staleness/max"] for s in range(4)] == [0.0] * 4
    assert rollouts.syncs == [0, 1, 2, 3, 4]
    assert summary.stop_reason == "exhausted" and summary.final_version == 4


def test_with_replace_the_spare_pool_diverts_the_second_batch_as_the_docs_say():
    # The documented difference from the sync order (docs/samplers.md): batch 1 goes to the spare pool, steps 1
    # and 2 train batches 2 and 3, and the pool's batch is trained last, as a whole step at the end of data.
    replace = failure_settings(on_dropped_prompt="replace", replacement_reserve_prompts=1, min_step_batch_fraction=0.5)
    trainer = RecordingTrainer()
    controller = build_controller(cfg("in_order", {"max_lookahead_versions": 0}, failure=replace), make_loader(12),
                                  ScriptedRollouts(group_size=G, script=random_latencies(12, 0)), trainer)  # fmt: skip
    run_virtual(controller.run)
    batch = {b: [f"p{i}" for i in range(3 * b, 3 * b + 3)] for b in range(4)}
    assert trainer.uids_per_step() == {0: batch[0], 1: batch[2], 2: batch[3], 3: batch[1]}
    docs = (Path(__file__).resolve().parent.parent / "docs" / "samplers.md").read_text(encoding="utf-8")
    claim = docs[docs.index("With `in_order` and `max_lookahead_versions: 0`"):].split("\n\n")[0]
    assert "on_dropped_prompt: shrink" in claim and "train batches 0, 2, 3 and then 1" in claim


def test_streaming_chunks_respect_the_minimum_and_one_optimizer_step_per_step():
    script = {"p0": [Outcome(1.0)], "p1": [Outcome(1.0)], "p2": [Outcome(2.0)], "p3": [Outcome(3.0)]}
    trainer = RecordingTrainer()
    controller = build_controller(
        cfg("ready_first", {"max_staleness_versions": 0}, P=4, min_groups_for_streaming_train=2),
        make_loader(8),
        ScriptedRollouts(group_size=G, script=script, default=Outcome(4.0)),
        trainer,
    )
    run_virtual(controller.run)
    assert trainer.chunk_sizes(0) == [2, 2]
    assert trainer.finished == [0, 1] and trainer.groups_per_step() == {0: 4, 1: 4}
    assert [c.first_chunk for c in trainer.chunks if c.step == 0] == [True, False]


def test_groups_left_that_cannot_be_selected_raise_a_named_error():
    controller = build_controller(
        cfg("custom", {"target": "fakes.samplers:HoardingSampler"}, P=2),
        make_loader(4),
        ScriptedRollouts(group_size=G),
        RecordingTrainer(),
    )
    with pytest.raises(RolloutExhaustedError, match=r"step 0 .*selected 0 \+ charged 0 of P 2.*4 ready group"):
        run_virtual(controller.run)


def test_step_metrics_cover_tally_accounting_staleness_and_trainer():
    zero = (1.0, 1.0)
    script = {"p1": [Outcome(rewards=zero)]}
    failure = failure_settings(
        on_dropped_prompt="replace",
        max_replacement_attempts=1,
        replacement_reserve_prompts=2,
        min_step_batch_fraction=0.5,
    )
    metrics = {}
    controller = build_controller(
        cfg("in_order", {"max_lookahead_versions": 0}, P=2, dynamic_sampling=True, failure=failure),
        make_loader(8),
        ScriptedRollouts(group_size=G, script=script),
        RecordingTrainer(),
        on_step_end=lambda s, m, g: metrics.__setitem__(s, m),
    )
    run_virtual(controller.run)
    m0 = metrics[0]
    # Generated for step 0: p0 [0, 1], p1 [1, 1] (filtered), p2 [0, 1] (its replacement).
    assert m0["reward/unfiltered_mean"] == pytest.approx(4 / 6)
    assert m0["reward/trained_mean"] == pytest.approx(0.5)
    assert (m0["ds/groups_generated"], m0["ds/groups_filtered"], m0["ds/groups_trained"]) == (3.0, 1.0, 2.0)
    assert m0["ds/zero_variance_fraction"] == pytest.approx(1 / 3)
    assert (m0["accounting/replaced_groups"], m0["accounting/dropped_groups"]) == (1.0, 0.0)
    assert (m0["step"], m0["weight_version"], m0["loss/fake"]) == (0.0, 1.0, 0.0)
    assert (m0["staleness/mean"], m0["buffer/evicted_groups"]) == (0.0, 0.0)
    assert metrics[1]["ds/groups_generated"] == 2.0


def test_setup_refusals():
    loader, rollouts, trainer = make_loader(4), ScriptedRollouts(group_size=G), RecordingTrainer()
    with pytest.raises(ValueError, match="weight_fifo builds each step only from groups generated under the same"):
        build_controller(cfg("weight_fifo", {}, dynamic_sampling=True), loader, rollouts, trainer)
    with pytest.raises(ValueError, match=r"max_buffered_rollouts=7 .*needs \(8 = P × \(window \+ 1\)\)"):
        build_controller(
            cfg("ready_first", {"max_staleness_versions": 1}, P=4, max_buffered_rollouts=7), loader, rollouts, trainer
        )
    with pytest.raises(ValueError, match="needs \\(8"):
        build_controller(
            cfg(
                "custom",
                {"target": "fakes.samplers:PlainReadyFirst", "kwargs": {"window": 3}},
                P=2,
                max_buffered_rollouts=7,
            ),
            loader,
            rollouts,
            trainer,
        )


def bucket_mismatch_script() -> dict[str, list[Outcome]]:
    # p5 (dispatched at v=0) fails after step 0 trained; its spare runs under v=1, so bucket 0 stays short.
    return {"p0": [Outcome(1.0)], "p1": [Outcome(1.0)], "p4": [Outcome(1.0)], "p5": [Outcome(5.0, fail="infra")]}


def bucket_mismatch_settings(sampler: str) -> ControllerSettings:
    failure = failure_settings(
        on_dropped_prompt="replace",
        max_replacement_attempts=1,
        replacement_reserve_prompts=2,
        max_infra_attempts_per_prompt=1,
        max_consecutive_dropped_prompts=5,
        min_step_batch_fraction=0.5,
    )
    return cfg(sampler, {"max_staleness_versions": 1}, P=2, failure=failure)


def test_weight_fifo_bucket_mismatch_is_reported_as_a_stall_not_a_hang():
    controller = build_controller(
        bucket_mismatch_settings("weight_fifo"),
        make_loader(10),
        ScriptedRollouts(group_size=G, script=bucket_mismatch_script()),
        RecordingTrainer(),
    )
    with pytest.raises(ControllerStalled, match=r"per_start_weight=\{0: '1 ready/1 slots', 1: '3 ready/3 slots'\}"):
        run_virtual(controller.run)
    trainer = RecordingTrainer()
    controller = build_controller(
        bucket_mismatch_settings("ready_first"),
        make_loader(10),
        ScriptedRollouts(group_size=G, script=bucket_mismatch_script()),
        trainer,
    )
    summary = run_virtual(controller.run)
    assert summary.stop_reason == "exhausted" and trainer.groups_per_step() == {0: 2, 1: 2, 2: 2, 3: 2}


class CrashingTrainer(RecordingTrainer):
    async def train_chunk(self, step, chunk, first_chunk):
        await super().train_chunk(step, chunk, first_chunk)
        if step == 1:
            raise RuntimeError("learner out of memory")


def test_trainer_crash_reaches_the_caller_and_stops_rollouts():
    rollouts = ScriptedRollouts(group_size=G, default=Outcome(latency=1.0))
    controller = build_controller(
        cfg("in_order", {"max_lookahead_versions": 1}, P=2), make_loader(12), rollouts, CrashingTrainer()
    )
    with pytest.raises(RuntimeError, match="learner out of memory") as info:
        run_virtual(controller.run)
    assert any("step 1" in note for note in info.value.__notes__)
    # Every reserved attempt is accounted, the in-flight ones as pending.
    assert controller.fates.total == controller.ctx.buffer.next_slot_id >= len(rollouts.calls)
    assert controller.rollout_pump.active_slots == 0


def test_max_steps_stops_and_records_pending_work():
    rollouts = ScriptedRollouts(group_size=G)
    trainer = RecordingTrainer()
    controller = build_controller(
        cfg("in_order", {"max_lookahead_versions": 1}, P=2, max_steps=2), make_loader(20), rollouts, trainer
    )
    summary = run_virtual(controller.run)
    assert summary.stop_reason == "max_steps" and trainer.finished == [0, 1]
    assert summary.fates["trained"] == 4
    assert summary.fates["pending"] == controller.ctx.buffer.next_slot_id - 4 > 0
    assert summary.fates.total == controller.ctx.buffer.next_slot_id


def test_snapshot_in_async_hook_then_resume_equals_continuing():
    def settings(**kw):
        return cfg("in_order", {"max_lookahead_versions": 1}, P=2, **kw)

    script = random_latencies(12, seed=5)
    full = RecordingTrainer()
    run_virtual(build_controller(settings(), make_loader(12), ScriptedRollouts(G, script=script), full).run)

    loader = make_loader(12)
    saved = {}
    first = RecordingTrainer()
    controller = None

    async def snapshot(step, metrics, chunks):
        assert sum(len(chunk.groups) for chunk in chunks) == 2 and metrics["step"] == step
        if step == 1:
            saved["controller"] = controller.state_dict()
            saved["loader"] = loader.state_dict()

    controller = build_controller(
        settings(max_steps=2), loader, ScriptedRollouts(G, script=script), first, on_step_end=snapshot
    )
    run_virtual(controller.run)
    assert saved["controller"]["step"] == 2

    resumed_loader = make_loader(12)
    resumed_loader.load_state_dict(saved["loader"])
    second = RecordingTrainer()
    resumed = build_controller(
        settings(start_step=2), resumed_loader, ScriptedRollouts(G, script=script), second, state=saved["controller"]
    )
    run_virtual(resumed.run)
    combined = {**first.uids_per_step(), **second.uids_per_step()}
    assert {s: sorted(u) for s, u in combined.items()} == {s: sorted(u) for s, u in full.uids_per_step().items()}
