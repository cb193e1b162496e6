"""Wasted compute, counted (``groupwise.algo.waste``, the ``waste/*`` metrics, the ``tokens`` of ``fates.jsonl``).

Invariants pinned:
- a generator call's seconds are split among its groups pro rata by completion tokens (evenly when none came
  back), so the shares add up to the call's seconds;
- the account keeps per-step values (reset when a step closes) and run totals (which continue across a checkpoint
  exactly as if the run had not stopped);
- a simulated async run (filtered, failed, aborted, evicted and pending attempts) and a simulated sync run
  (filtered, discarded, carried) account every generated token: the engine's own count = generated = trained +
  wasted + pending, each fate's tokens in sim/summary.json = the tokens of its fates.jsonl lines (one per group
  id, its last), per-step metrics add up to the cumulative ones, and in sync mode every step's metrics equal the
  tokens of that step's fate lines;
- a real tiny sync run: the same per-step identities against fates.jsonl and metrics.jsonl, the seconds of a
  step's groups add up to its perf/gen_seconds, and the end-of-run events.log line states the totals;
- a real tiny async run with a verifier that raises: the failed attempts' tokens (their completions were
  generated) are counted as failed, and fates.jsonl, the metrics and the run totals agree;
- an aborted attempt is charged what the generator spent on it once the generator stopped (the controller asks
  the rollout client's ``spent``); a request cancelled before it reached a call costs nothing; a shutdown while
  waiting leaves the attempt ``pending``; a reward failure's cost survives pickling (Ray).
"""

from __future__ import annotations

import asyncio
import json
import pickle
from collections import defaultdict
from pathlib import Path

import pytest
from fakes import Outcome, ScriptedRollouts, run_virtual
from test_controller_rollout_pump import make
from test_sim_run import sim_config
from test_sync_trainer import run, tiny_config

from groupwise.algo.waste import WASTE_FATES, GenerationAccount, split_call_seconds
from groupwise.config import config_from_dict
from groupwise.controller.fate_records import FateRecord
from groupwise.data.scoring import RewardError
from groupwise.run.fates_file import read_fates
from groupwise.run.metrics import read_metrics
from groupwise.runtime.async_run import run_async
from groupwise.runtime.rollout_queue import RolloutQueue, charge_call, drop_cancelled
from groupwise.sim.run import simulate
from groupwise.trainer.builder import build_session
from groupwise.types import GenerationCost, Group, Prompt, attach_cost, cost_of


def last_lines(lines: list[dict]) -> dict[int, dict]:
    """The last fates.jsonl line of every group id (slot-less lines, group id null, cost nothing)."""
    return {line["group_id"]: line for line in lines if line["group_id"] is not None}


def tokens_by_fate(lines: list[dict]) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for line in last_lines(lines).values():
        totals[line["fate"]] += line["tokens"]
    return dict(totals)


def step_sum(records: list[dict], key: str) -> float:
    return sum(r.get(key) or 0 for r in records)


# --- the maths ------------------------------------------------------------------------------------------------


def test_a_call_is_split_pro_rata_by_tokens_and_the_shares_add_up():
    assert split_call_seconds(3.0, [10, 20, 30]) == pytest.approx([0.5, 1.0, 1.5], rel=1e-12)
    assert sum(split_call_seconds(0.7, [3, 0, 11, 5])) == pytest.approx(0.7, rel=1e-12)
    assert split_call_seconds(0.9, [0, 0, 0]) == pytest.approx([0.3, 0.3, 0.3])  # nothing came back: evenly
    assert split_call_seconds(1.0, []) == []


def test_the_account_keeps_per_step_values_and_run_totals_across_a_checkpoint():
    def step_one(account: GenerationAccount) -> None:
        account.generated(100, 1.0)
        account.settled("trained", 60, 0.6)
        account.settled("filtered", 40, 0.4)

    def step_two(account: GenerationAccount) -> dict[str, float]:
        account.generated(50, 0.5)
        account.settled("evicted", 30, 0.3)
        account.settled("carried", 20, 0.2)  # interim: settles later, nothing counted now
        return account.step_metrics(("filtered", "evicted"))

    straight, first = GenerationAccount(), GenerationAccount()
    for account in (straight, first):
        step_one(account)
    metrics = straight.step_metrics(("filtered", "evicted"))
    assert metrics["waste/filtered_tokens"] == 40 and metrics["waste/tokens"] == 40
    assert metrics["waste/generated_tokens"] == 100 and metrics["waste/cumulative_fraction"] == pytest.approx(0.4)
    first.step_metrics(("filtered", "evicted"))
    resumed = GenerationAccount()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))  # what a checkpoint holds
    second, after_resume = step_two(straight), step_two(resumed)
    assert second == after_resume
    assert second["waste/tokens"] == 30 and second["waste/filtered_tokens"] == 0  # per step: reset at the close
    assert second["waste/cumulative_tokens"] == 70 and second["waste/cumulative_generated_tokens"] == 150
    assert second["waste/cumulative_fraction"] == pytest.approx(70 / 150)
    totals = straight.totals()
    assert totals["generated_tokens"] == 150 and totals["trained_tokens"] == 60 and totals["wasted_tokens"] == 70


# --- simulated runs -------------------------------------------------------------------------------------------


def assert_simulated_run_accounts_every_token(result) -> dict:
    summary, root = result.summary, result.run_dir.path
    lines, records = read_fates(root / "fates.jsonl"), read_metrics(root / "metrics.jsonl")
    by_fate = tokens_by_fate(lines)
    assert summary["engine_generated_tokens"] == summary["generated_tokens"]
    assert summary["generated_tokens"] == sum(by_fate.values())
    settled = summary["trained_tokens"] + summary["wasted_tokens"] + summary["pending_tokens"]
    assert summary["generated_tokens"] == settled
    for fate in (*WASTE_FATES, "trained", "pending"):
        assert summary[f"{fate}_tokens"] == by_fate.get(fate, 0), fate
    assert summary["waste_fraction"] == pytest.approx(summary["wasted_tokens"] / summary["generated_tokens"], abs=1e-6)
    # per-step values add up to the cumulative ones; a step's waste is the sum over its fates
    last = records[-1]
    assert last["waste/cumulative_tokens"] == step_sum(records, "waste/tokens")
    assert last["waste/cumulative_generated_tokens"] == step_sum(records, "waste/generated_tokens")
    assert last["waste/cumulative_gen_seconds"] == pytest.approx(step_sum(records, "waste/gen_seconds"), rel=1e-9)
    for record in records:
        parts = [record[key] for key in record if key.startswith("waste/") and key.endswith("_tokens")
                 and key.split("/")[1][: -len("_tokens")] in WASTE_FATES]  # fmt: skip
        assert record["waste/tokens"] == sum(parts)
    assert step_sum(records, "perf/train_tokens") == by_fate["trained"]
    return by_fate


def test_a_simulated_async_run_accounts_every_generated_token(tmp_path):
    cfg = sim_config(
        tmp_path, "w", run={"max_steps": 20}, grpo={"dynamic_sampling": {"enabled": True}},
        sim={"infra_failure_rate": 0.05, "data_failure_rate": 0.05},
        **{"async": {"sampler": {"name": "windowed", "max_staleness_versions": 1}, "max_inflight_prompts": 32,
                     "max_buffered_rollouts": 64, "rollout_failure": {"max_skipped_prompts": 1000,
                                                                      "max_consecutive_dropped_prompts": 100}}},
    )  # fmt: skip
    result = simulate(cfg)
    assert result.summary["outcome"] == "completed", result.summary["error"]
    by_fate = assert_simulated_run_accounts_every_token(result)
    assert all(by_fate.get(fate, 0) > 0 for fate in ("filtered", "failed", "aborted", "evicted", "trained"))
    lines = read_fates(result.run_dir.path / "fates.jsonl")
    # an aborted attempt costs its whole booking, a data failure all its completions: every such line has tokens
    assert all(line["tokens"] > 0 for line in lines if line["fate"] in ("aborted", "evicted", "filtered", "trained"))
    account = result.run.generation
    settled_seconds = sum(account.run.seconds.values())
    assert settled_seconds == pytest.approx(account.run.generated_seconds, rel=1e-9)  # everything settled at the end
    slots = result.run.parts.rollouts.slots  # the seconds are capacity shares: ≤ the booked slot-seconds ÷ slots
    assert account.run.generated_seconds <= slots.booked_seconds / slots.num_slots + 1e-9


@pytest.mark.parametrize("surplus", ["discard", "carry"])
def test_a_simulated_sync_run_accounts_filtered_discarded_and_carried_tokens(tmp_path, surplus):
    ds = {"enabled": True, "batch_multiplier": 2.0, "surplus": surplus}
    loss = {"importance_sampling": True} if surplus == "carry" else {}
    result = simulate(sim_config(tmp_path, "s", mode="sync", grpo={"dynamic_sampling": ds}, loss=loss))
    by_fate = assert_simulated_run_accounts_every_token(result)
    assert by_fate["filtered"] > 0
    assert by_fate.get("discarded", 0) > 0 if surplus == "discard" else by_fate.get("discarded", 0) == 0
    records = {r["step"]: r for r in read_metrics(result.run_dir.path / "metrics.jsonl")}
    lines = read_fates(result.run_dir.path / "fates.jsonl")
    if surplus == "discard":  # every group settles in the step that generated it
        for step, record in records.items():
            of_step = [line for line in lines if line["step"] == step - 1]
            assert record["waste/generated_tokens"] == sum(line["tokens"] for line in of_step)
            for fate in ("filtered", "discarded"):
                assert record[f"waste/{fate}_tokens"] == sum(line["tokens"] for line in of_step if line["fate"] == fate)
    slots = result.run.parts.rollouts.slots  # nothing is cancelled in sync: every booked second is generated
    assert result.run.generation.run.generated_seconds == pytest.approx(slots.booked_seconds / slots.num_slots)


# --- real runs ------------------------------------------------------------------------------------------------


def test_a_real_sync_run_accounts_every_step_against_its_fates(tmp_path):
    ds = {"dynamic_sampling": {"batch_multiplier": 2.0, "max_gen_rounds": 6, "min_step_batch_fraction": 0.25}}
    session = run(tiny_config(tmp_path, run={"max_steps": 3}, grpo=ds, eval={"at_start": False, "at_end": False}))
    records = [r for r in read_metrics(session.run_dir.metrics_path) if "waste/tokens" in r]
    lines = read_fates(session.fates.path)
    assert len(records) == 3
    for record in records:
        of_step = [line for line in lines if line["step"] == record["step"] - 1]
        assert record["waste/generated_tokens"] == sum(line["tokens"] for line in of_step)
        for fate in ("filtered", "discarded"):
            assert record[f"waste/{fate}_tokens"] == sum(line["tokens"] for line in of_step if line["fate"] == fate)
        assert record["perf/train_tokens"] == sum(line["tokens"] for line in of_step if line["fate"] == "trained")
        # a round is a call: its seconds are split among its groups, so a step's shares add up to its rounds' time
        assert record["waste/generated_gen_seconds"] == pytest.approx(record["perf/gen_seconds"], rel=1e-9)
    assert step_sum(records, "waste/discarded_tokens") > 0 and step_sum(records, "waste/filtered_tokens") > 0
    totals = session.state.generation.totals()
    by_fate = sum(tokens_by_fate(lines).values())
    assert totals["generated_tokens"] == by_fate == step_sum(records, "waste/generated_tokens")
    events = session.run_dir.events_path.read_text()
    assert f"generation: {totals['generated_tokens']} completion tokens" in events
    assert f"wasted {totals['wasted_tokens']} " in events


def test_a_real_async_run_counts_the_tokens_of_attempts_whose_reward_raised(tmp_path):
    cfg = tiny_config(tmp_path, run={"name": "r", "max_steps": 3}, eval={"at_start": False, "at_end": False})
    data = cfg.model_dump(by_alias=True)
    data["mode"] = "async"
    data["reward"] = {"function": "scripted_rewards:fails_on_answers_ending_in"}
    data["grpo"]["dynamic_sampling"] = {"enabled": True}
    data["generation"]["micro_batch_groups"] = 16
    data["async"] = {
        "sampler": {"name": "ready_first", "max_staleness_versions": 1},
        "max_buffered_rollouts": 16, "max_inflight_prompts": 16,
        "rollout_failure": {"max_skipped_prompts": 1000, "min_step_batch_fraction": 0.25,
                            "max_data_attempts_per_prompt": 1, "replacement_reserve_prompts": 4,
                            "max_replacement_attempts": 8},
    }  # fmt: skip
    session = build_session(config_from_dict(data))
    summary = run_async(session)
    lines = read_fates(session.run_dir.fates_path)
    records = [r for r in read_metrics(session.run_dir.metrics_path) if "waste/tokens" in r]
    failed = [line for line in lines if line["fate"] == "failed"]
    assert failed and all(0 < line["tokens"] <= 4 * 4 for line in failed)  # G = 4 completions of ≤ 4 tokens
    totals = summary.fates.generation.totals()
    by_fate = tokens_by_fate(lines)
    assert totals["failed_tokens"] == by_fate["failed"] and totals["trained_tokens"] == by_fate["trained"]
    assert totals["generated_tokens"] == sum(by_fate.values())
    assert totals["generated_tokens"] == totals["trained_tokens"] + totals["wasted_tokens"] + totals["pending_tokens"]
    assert step_sum(records, "perf/train_tokens") == by_fate["trained"]
    assert step_sum(records, "waste/failed_tokens") <= by_fate["failed"]  # the rest failed after the last step
    assert records[-1]["waste/cumulative_tokens"] == step_sum(records, "waste/tokens")


# --- aborted attempts and the runtimes' bookkeeping -----------------------------------------------------------


class SpendingRollouts(ScriptedRollouts):
    """Scripted rollouts whose generator takes ``spend_latency`` to stop working on a cancelled attempt."""

    spend_latency: float | None = 3.0  # None: it never stops
    asked: list[tuple[int, float]]

    async def spent(self, group_id: int) -> GenerationCost:
        self.asked.append((group_id, asyncio.get_running_loop().time()))
        if self.spend_latency is None:
            await asyncio.Event().wait()
        await asyncio.sleep(self.spend_latency)
        return GenerationCost(50, 0.5)


def aborting_controller(fates: list[FateRecord], spend_latency: float | None, max_steps: int | None = None):
    """The windowed abort scenario of test_controller_rollout_pump: p1 and p2 are in flight, out of the window, at
    the first weight sync."""
    script = {"p0": [Outcome(latency=1.0)], "p1": [Outcome(latency=100.0)], "p2": [Outcome(latency=2.0)]}
    rollouts = SpendingRollouts(group_size=2, script=script)
    rollouts.spend_latency, rollouts.asked = spend_latency, []
    controller, _, _ = make("windowed", {"max_staleness_versions": 0}, 1, 4, script=script, fates=fates, capacity=3,
                            min_groups_for_streaming_train=1, max_steps=max_steps, rollouts=rollouts)  # fmt: skip
    return controller, rollouts


def test_an_aborted_attempt_is_charged_what_its_generator_spent_once_it_stopped():
    fates: list[FateRecord] = []
    controller, rollouts = aborting_controller(fates, spend_latency=3.0)
    run_virtual(controller.run)
    aborted = [r for r in fates if r.fate == "aborted"]
    assert sorted(r.prompt_uid for r in aborted) == ["p1", "p2"]
    assert [(r.tokens, r.gen_seconds) for r in aborted] == [(50, 0.5), (50, 0.5)]
    assert len(rollouts.asked) == 2
    account = controller.fates.generation.run
    assert account.tokens["aborted"] == 100 and account.seconds["aborted"] == pytest.approx(1.0)
    assert account.generated_tokens == sum(r.tokens for r in fates)  # generated = what settled, at the end


def test_a_shutdown_while_waiting_for_an_aborted_attempts_cost_leaves_it_pending():
    fates: list[FateRecord] = []
    controller, rollouts = aborting_controller(fates, spend_latency=None, max_steps=2)
    run_virtual(controller.run)
    uids = {r.prompt_uid: r for r in fates if r.prompt_uid in ("p1", "p2")}
    assert rollouts.asked and {r.fate for r in uids.values()} == {"pending"}
    assert all(r.tokens == 0 for r in uids.values())


def _group(group_id: int, tokens: int) -> Group:
    from groupwise.types import Completion

    completion = Completion(tuple(range(tokens)), (0.0,) * tokens, "", "stop", 0)
    return Group(group_id, Prompt(uid=f"p{group_id}", answer=""), (), [completion], [1.0], [1.0])


def test_a_cancelled_request_costs_its_share_of_the_call_it_was_in_or_nothing():
    async def main() -> None:
        queue = RolloutQueue(lambda: asyncio.sleep(3600), "test")
        tasks = [asyncio.ensure_future(queue.submit(f"item{i}", i, 0, 0)) for i in range(3)]
        await asyncio.sleep(0)
        batch = drop_cancelled(queue.take(2))  # requests 0 and 1 go into a call; 2 stays queued
        tasks[1].cancel()  # an abort while its call runs, and one while it waits
        tasks[2].cancel()
        await asyncio.sleep(0)
        waiting = asyncio.ensure_future(queue.spent(1))
        assert await queue.spent(2) == GenerationCost()  # never reached a call
        await asyncio.sleep(0)
        assert not waiting.done()  # its call is still running
        error = attach_cost(RewardError("bad", "p1", 0), GenerationCost(30))  # its completions, then the verifier
        outcomes = [_group(0, 10), error]
        charge_call(batch, outcomes, 2.0)
        assert await waiting == GenerationCost(30, 1.5)  # 2 s pro rata: 10 and 30 tokens
        assert outcomes[0].gen_seconds == pytest.approx(0.5) and cost_of(error) == GenerationCost(30, 1.5)
        assert drop_cancelled(queue.take(1)) == []  # the cancelled waiting request leaves without a call
        await asyncio.gather(*tasks[1:], return_exceptions=True)
        tasks[0].cancel()

    asyncio.run(main())


def test_a_failed_call_splits_its_time_evenly_and_a_reward_failure_keeps_its_cost_across_processes():
    async def main() -> None:
        queue = RolloutQueue(lambda: asyncio.sleep(3600), "test")
        tasks = [asyncio.ensure_future(queue.submit(f"item{i}", i, 0, 0)) for i in range(2)]
        await asyncio.sleep(0)
        batch = queue.take(2)
        error = RuntimeError("engine died")
        charge_call(batch, error, 1.0)
        assert [p.cost for p in batch] == [GenerationCost(0, 0.5)] * 2 and cost_of(error) == GenerationCost(0, 0.5)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    error = attach_cost(RewardError("reward raised", "p3", 1), GenerationCost(12, 0.25))
    copy = pickle.loads(pickle.dumps(error))
    assert cost_of(copy) == GenerationCost(12, 0.25) and (copy.prompt_uid, copy.completion_index) == ("p3", 1)
    assert str(copy) == "reward raised"


def test_old_fates_files_and_checkpoints_without_costs_still_load(tmp_path: Path):
    from groupwise.controller.fate_records import FateCounts
    from groupwise.trainer.sync_loop import TrainerState

    old = {"group_id": 0, "prompt_uid": "p", "epoch": 0, "attempt": 0, "start_version": 0, "fate": "trained",
           "step": 0, "resolution": None, "detail": "", "mode": "sync"}  # fmt: skip
    path = tmp_path / "fates.jsonl"
    path.write_text(json.dumps(old) + "\n")
    assert read_fates(path)[0]["fate"] == "trained"
    counts = FateCounts()
    counts.load_state_dict({"total": 1, "by_resolution": [["trained", None, 1]]})
    assert counts.generation.totals()["generated_tokens"] == 0
    state = TrainerState.from_dict({"step": 3, "next_group_id": 12})
    assert state.generation.run.generated_tokens == 0
