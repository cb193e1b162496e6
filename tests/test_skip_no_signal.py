"""Skipping prompts predicted to carry no signal (``data.skip_no_signal``, selective rollout).

Invariants pinned:
- the retry probability is ``min(1, base_retry · growth^skips)``, exactly, and reaches 1 after a bounded number of
  skips in a row;
- a prompt is skipped only when its last ``history`` groups all had zero variance by the dynamic-sampling filter's
  own rule, and a skip decision depends on (seed, prompt, epoch, history) only;
- every skipped draw has a ``skipped_no_signal`` fate line (group id null, the history in ``detail``), in both
  loops; ``groupwise audit`` counts it as skipped, neither trained, lost, nor a violation;
- steps keep their size: the sync loop trains P groups per step and every closed async step balances
  (selected + charged == P) with no loss charged for a skip;
- a sync run resumed from a step boundary writes the same fates, so the same skip decisions, as one that ran on;
- off (the default) the run's loader is the plain PromptLoader, and skipping that never triggers changes nothing.
"""

from __future__ import annotations

import json
from typing import get_args

import pytest
from fakes import Outcome, RecordingTrainer, ScriptedRollouts, make_prompts, run_virtual

from groupwise.algo.filter import GroupFilter
from groupwise.config import ConfigError, config_from_dict
from groupwise.config.skip_schema import ZeroVarianceOutcome
from groupwise.controller.controller import build_controller
from groupwise.controller.settings import ControllerSettings
from groupwise.data.loader import PromptLoader
from groupwise.data.signal_history import (
    ZERO_VARIANCE_OUTCOMES,
    SignalHistory,
    SkipSettings,
    draw_uniform,
    retry_probability,
)
from groupwise.data.skipping_loader import NoSignalSkippingLoader, build_training_loader
from groupwise.run.audit import audit_fates
from groupwise.run.fates_file import FatesWriter, read_fates
from groupwise.trainer.sync_loop import SyncLoop, TrainerState

G, P, N = 2, 4, 8
SETTINGS = SkipSettings(history=2, base_retry=0.25, growth=2.0)
ALL_RIGHT, MIXED = (1.0, 1.0), (0.0, 1.0)


def test_retry_probability_values():
    assert [retry_probability(s, 0.1, 2.0) for s in range(5)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0])
    assert retry_probability(0, 1.0, 3.0) == 1.0
    assert retry_probability(10**6, 1e-9, 1.0001) == 1.0  # no overflow, certain in the end
    assert retry_probability(2, 0.05, 3.0) == pytest.approx(0.45)
    for bad in [(-1, 0.1, 2.0), (0, 0.0, 2.0), (0, 0.1, 1.0)]:
        with pytest.raises(ValueError):
            retry_probability(*bad)


def test_history_skips_only_after_k_zero_variance_groups():
    history = SignalHistory(SkipSettings(history=2, base_retry=1e-9, growth=1.5), GroupFilter(), seed=0)
    assert history.observe("a", [1.0, 1.0], 10) == "all_max"
    assert history.decide("a", 1) is None  # one outcome is not a history of 2
    assert history.observe("a", [0.0, 0.0], 12) == "all_min"
    skip = history.decide("a", 2)
    assert skip is not None and skip.outcomes == ("all_max", "all_min") and skip.skips == 1
    assert skip.tokens_saved == 12 and "all_max, all_min" in skip.detail
    history.observe("a", [0.0, 1.0], 12)  # a mixed group in the window: never skipped
    assert history.decide("a", 3) is None


def test_kinds_limits_which_zero_variance_outcomes_predict_no_signal():
    right_only = SkipSettings(history=1, base_retry=1e-9, growth=1.5, kinds=frozenset({"all_max"}))
    history = SignalHistory(right_only, GroupFilter(), seed=0)
    history.observe("wrong", [0.0, 0.0], 4)
    history.observe("right", [1.0, 1.0], 4)
    assert history.decide("wrong", 1) is None  # all wrong: kept, the policy may still find its answer
    assert history.decide("right", 1) is not None
    assert frozenset(get_args(ZeroVarianceOutcome)) == ZERO_VARIANCE_OUTCOMES  # one list of names, two spellings


def test_skip_decisions_depend_on_seed_prompt_and_epoch_only():
    assert draw_uniform(3, "p1", 4) == draw_uniform(3, "p1", 4)
    assert len({draw_uniform(3, "p1", e) for e in range(20)}) == 20
    decisions = []
    for _ in range(2):
        history = SignalHistory(SETTINGS, GroupFilter(), seed=7)
        for _ in range(2):
            history.observe("x", [1.0, 1.0], 4)
        decisions.append([history.decide("x", epoch) is not None for epoch in range(2, 30)])
    assert decisions[0] == decisions[1] and any(decisions[0]) and not all(decisions[0])


class FlippingRollouts(ScriptedRollouts):
    """p0..p2 always all-right; p3 all-right in epochs 0-2, then mixed (its answer changes); p4..p7 always mixed.
    Outcomes depend on the prompt and its epoch only, so a resumed run sees the same ones."""

    async def rollout(self, prompt, group_id, attempt, start_version):
        index = int(prompt.prompt.uid[1:])
        right = index < 3 or (index == 3 and prompt.epoch <= 2)
        self.default = Outcome(rewards=ALL_RIGHT if right else MIXED)  # read before the first await
        return await super().rollout(prompt, group_id, attempt, start_version)


def flipping_rollouts() -> FlippingRollouts:
    return FlippingRollouts(group_size=G)


def skipping_loader(settings: SkipSettings = SETTINGS, seed: int = 0) -> NoSignalSkippingLoader:
    return NoSignalSkippingLoader(make_prompts(N), seed, settings, GroupFilter(), shuffle=False)


def sync_config(ds: bool = False):
    return config_from_dict({
        "mode": "sync", "model": {"source": "tiny"}, "run": {"max_steps": 12},
        "grpo": {"num_prompts_per_step": P, "num_generations_per_prompt": G, "dynamic_sampling": {"enabled": ds}},
    })  # fmt: skip


def run_sync(loader: PromptLoader, path, steps: int, state: TrainerState | None = None, ds: bool = False):
    rollouts = flipping_rollouts()
    state = state or TrainerState()
    trainer = RecordingTrainer()
    loop = SyncLoop(sync_config(ds).grpo, loader, rollouts, trainer, state, fates=FatesWriter(path))
    run_virtual(lambda: loop.run(steps))
    return state, trainer


def test_sync_run_writes_skip_fates_and_the_audit_counts_them(tmp_path):
    loader = skipping_loader()
    _, trainer = run_sync(loader, tmp_path / "fates.jsonl", 12)
    lines = read_fates(tmp_path / "fates.jsonl")
    skipped = [line for line in lines if line["fate"] == "skipped_no_signal"]
    assert skipped and {line["prompt_uid"] for line in skipped} <= {"p0", "p1", "p2", "p3"}
    assert all(line["group_id"] is None and line["tokens"] == 0 and "no signal" in line["detail"] for line in skipped)
    assert all(len(c.group_ids) == P for c in trainer.chunks)  # every step still trains P groups
    report = audit_fates(lines, [f"p{i}" for i in range(N)])
    assert report.ok
    assert sum(e.skipped_no_signal for e in report.epochs) == len(skipped)
    for epoch in report.epochs[:-1]:  # whole epochs: each prompt trained or skipped, none lost
        assert epoch.counts["trained"] + epoch.skipped_no_signal == N and epoch.never_dispatched == 0
    assert "skipped (no signal)" in report.format()
    metrics = loader.step_metrics()
    assert metrics["skip/cumulative_prompts"] == len(skipped)
    assert metrics["skip/cumulative_tokens_saved_est"] == 4 * len(skipped)  # a skipped group: G rows of 2 tokens


def test_retried_prompt_whose_answer_changed_comes_back(tmp_path):
    loader = skipping_loader(SkipSettings(history=2, base_retry=0.25, growth=4.0))
    run_sync(loader, tmp_path / "fates.jsonl", 12)
    history = loader.history
    assert history.records["p3"].outcomes[-1] == "mixed"  # p3 was retried and its new outcome recorded
    assert history.retry_outcomes.get("mixed", 0) >= 1 and loader.step_metrics()["skip/retried"] >= 1


def test_sync_resume_repeats_the_same_skip_decisions(tmp_path):
    whole = tmp_path / "whole.jsonl"
    run_sync(skipping_loader(), whole, 12)
    split = tmp_path / "split.jsonl"
    first = skipping_loader()
    state, _ = run_sync(first, split, 5)
    saved = json.loads(json.dumps({"loader": first.state_dict(), "trainer": state.to_dict()}))
    resumed = skipping_loader()
    resumed.load_state_dict(saved["loader"])
    run_sync(resumed, split, 12, state=TrainerState.from_dict(saved["trainer"]))
    assert split.read_text() == whole.read_text()
    assert resumed.history.state_dict()["records"] and "skip_no_signal" in saved["loader"]


def test_sync_with_dynamic_sampling_skips_filtered_prompts(tmp_path):
    loader = skipping_loader()
    run_sync(loader, tmp_path / "fates.jsonl", 12, ds=True)
    lines = read_fates(tmp_path / "fates.jsonl")
    plain = tmp_path / "plain.jsonl"
    run_sync(PromptLoader(make_prompts(N), seed=0, shuffle=False), plain, 12, ds=True)
    filtered = [sum(line["fate"] == "filtered" for line in read_fates(path)) for path in (tmp_path / "fates.jsonl",
                                                                                           plain)]  # fmt: skip
    assert filtered[0] < filtered[1]
    assert audit_fates(lines, [f"p{i}" for i in range(N)]).ok


SAMPLERS = {
    "in_order": {"name": "in_order", "max_lookahead_versions": 0},
    "ready_first": {"name": "ready_first", "max_staleness_versions": 0},
    "windowed": {"name": "windowed", "max_staleness_versions": 0},
    "weight_fifo": {"name": "weight_fifo", "max_staleness_versions": 0},
}


def async_config(sampler: str):
    ds = sampler != "weight_fifo"  # weight_fifo refuses dynamic sampling: skipping works without it too
    return config_from_dict({
        "mode": "async", "model": {"source": "tiny"}, "run": {"max_steps": 10},
        "grpo": {"num_prompts_per_step": P, "num_generations_per_prompt": G, "dynamic_sampling": {"enabled": ds}},
        "async": {"sampler": SAMPLERS[sampler]},
    })  # fmt: skip


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_async_run_records_skips_and_keeps_the_ledger_balanced(sampler):
    records = []
    controller = build_controller(ControllerSettings.from_config(async_config(sampler)), skipping_loader(),
                                  flipping_rollouts(), RecordingTrainer(), on_fate=records.append)  # fmt: skip
    summary = run_virtual(controller.run)
    assert summary.steps_trained == 10
    skipped = [r for r in records if r.fate == "skipped_no_signal"]
    assert skipped and all(r.group_id is None and r.start_version is None for r in skipped)
    assert {r.prompt_uid for r in skipped} <= {"p0", "p1", "p2", "p3"}
    assert summary.fates["skipped_no_signal"] == len(skipped)
    assert all(r.selected + r.charged == P and r.charged == 0 for r in summary.ledger_history)
    assert summary.skipped_prompts == 0  # the failure budget's skips are another thing
    lines = [{**r.as_dict(), "mode": "async"} for r in records]
    assert audit_fates(lines, [f"p{i}" for i in range(N)]).ok


def test_off_by_default_and_a_skipper_that_never_skips_changes_nothing(tmp_path):
    cfg = sync_config()
    assert cfg.data.skip_no_signal.enabled is False
    assert type(build_training_loader(cfg, make_prompts(N))) is PromptLoader
    run_sync(PromptLoader(make_prompts(N), seed=0, shuffle=False), tmp_path / "plain.jsonl", 8)
    never = SkipSettings(history=1, base_retry=1.0, growth=2.0)  # retry probability 1: every draw dispatched
    run_sync(skipping_loader(never), tmp_path / "never.jsonl", 8)
    assert (tmp_path / "never.jsonl").read_text() == (tmp_path / "plain.jsonl").read_text()


def test_config_enables_it_and_refuses_bad_settings():
    on = {"enabled": True, "history": 3, "base_retry": 0.05, "growth": 1.5, "kinds": ["all_max"]}
    cfg = config_from_dict({"model": {"source": "tiny"}, "data": {"skip_no_signal": on}})
    loader = build_training_loader(cfg, make_prompts(N))
    assert isinstance(loader, NoSignalSkippingLoader)
    assert loader.history.settings == SkipSettings(3, 0.05, 1.5, frozenset({"all_max"}))
    cases = [
        ({"data": {"skip_no_signal": {"history": 3}}}, "data.skip_no_signal.history"),
        ({"data": {"skip_no_signal": {"enabled": True, "growth": 1.0}}}, "data.skip_no_signal.growth"),
        ({"data": {"skip_no_signal": {"enabled": True, "base_retry": 0}}}, "data.skip_no_signal.base_retry"),
        ({"data": {"skip_no_signal": {"enabled": True, "kinds": []}}}, "data.skip_no_signal.kinds"),
        ({"data": {"skip_no_signal": {"enabled": True, "kinds": ["mixed"]}}}, "data.skip_no_signal.kinds"),
        ({"data": {"skip_no_signal": {"kinds": ["all_max"]}}}, "data.skip_no_signal.kinds"),
        ({"data": {"skip_no_signal": {"enabled": True}}, "grpo": {"num_generations_per_prompt": 1}},
         "data.skip_no_signal.enabled"),
    ]  # fmt: skip
    for raw, key in cases:
        with pytest.raises(ConfigError) as caught:
            config_from_dict({"model": {"source": "tiny"}, **raw})
        assert key in str(caught.value)
