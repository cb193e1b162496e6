"""The dynamic-sampling filter is one decision, configured in one place, for both loops.

Invariants pinned:
- the sync loop and the async controller, fed the same groups under the same config, report the same ``ds/*``
  fractions, with reward scaling on a declared raw range other than [0, 1]: the filter's reward range comes from
  ``GrpoSection.group_filter`` for both (an all −1 group is all-min, an all +1 group all-max, in both modes);
- the sync step's fates are written from the accumulator's own record of what it filtered.
"""

from __future__ import annotations

from fakes import Outcome, RecordingTrainer, ScriptedRollouts, make_loader, run_virtual

from groupwise.config import config_from_dict
from groupwise.controller.controller import build_controller
from groupwise.controller.settings import ControllerSettings
from groupwise.run.fates_file import FatesWriter, read_fates
from groupwise.trainer.sync_loop import SyncLoop, TrainerState

G = 2
REWARDS = {"p0": (-1.0, -1.0), "p1": (1.0, 1.0), "p2": (-1.0, 1.0), "p3": (1.0, -1.0)}
DS_KEYS = ("ds/zero_variance_fraction", "ds/zero_variance_max_fraction", "ds/zero_variance_min_fraction",
           "ds/groups_generated", "ds/groups_filtered")  # fmt: skip


def config(mode: str, ds: bool):
    return config_from_dict({
        "mode": mode, "model": {"source": "tiny"},
        "grpo": {"num_prompts_per_step": 4, "num_generations_per_prompt": G,
                 "reward_scaling": {"enabled": True, "source_min": -1.0, "source_max": 1.0},
                 "dynamic_sampling": {"enabled": ds}},
        "run": {"max_steps": 1},
        **({"async": {"sampler": {"name": "in_order", "max_lookahead_versions": 0},
                      "rollout_failure": {"on_dropped_prompt": "shrink", "min_step_batch_fraction": 0.5}}}
           if mode == "async" else {}),
    })  # fmt: skip


def scripted() -> ScriptedRollouts:
    return ScriptedRollouts(group_size=G, script={uid: [Outcome(rewards=r)] for uid, r in REWARDS.items()})


def sync_metrics(tmp_path) -> tuple[dict[str, float], list[dict]]:
    cfg = config("sync", ds=False)
    metrics: dict[str, float] = {}
    fates = FatesWriter(tmp_path / "fates.jsonl")
    loop = SyncLoop(cfg.grpo, make_loader(4), scripted(), RecordingTrainer(), TrainerState(),
                    on_step_end=lambda done: metrics.update(done.metrics), fates=fates)  # fmt: skip
    run_virtual(lambda: loop.run(1))
    return metrics, read_fates(fates.path)


def async_metrics() -> dict[str, float]:
    settings = ControllerSettings.from_config(config("async", ds=False))
    metrics: dict[str, float] = {}
    controller = build_controller(settings, make_loader(4), scripted(), RecordingTrainer(),
                                  on_step_end=lambda step, m, chunks: metrics.update(m))  # fmt: skip
    run_virtual(controller.run)
    return metrics


def test_sync_and_async_report_the_same_ds_fractions_with_reward_scaling(tmp_path):
    sync, _ = sync_metrics(tmp_path)
    asynchronous = async_metrics()
    assert {key: sync[key] for key in DS_KEYS} == {key: asynchronous[key] for key in DS_KEYS}
    assert (sync["ds/zero_variance_min_fraction"], sync["ds/zero_variance_max_fraction"]) == (0.25, 0.25)


def test_sync_fates_follow_the_accumulators_record(tmp_path):
    cfg = config("sync", ds=True)
    fates = FatesWriter(tmp_path / "fates.jsonl")
    rollouts = ScriptedRollouts(group_size=G, script={uid: [Outcome(rewards=r)] for uid, r in REWARDS.items()})
    loop = SyncLoop(cfg.grpo, make_loader(8), rollouts, RecordingTrainer(), TrainerState(), fates=fates)
    run_virtual(lambda: loop.run(1))
    by_uid = {line["prompt_uid"]: line["fate"] for line in read_fates(fates.path)}
    assert by_uid["p0"] == by_uid["p1"] == "filtered"
    assert by_uid["p2"] == by_uid["p3"] == "trained"
