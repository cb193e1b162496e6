"""ControllerSettings: built from a RunConfig, and its own input checks.

Invariants pinned:
- from_config maps every async / grpo / run field the controller uses (sampler name and knobs, streaming
  minimum, capacities, all rollout_failure knobs, dynamic sampling and its tolerance, reward range, seed,
  max_steps), and the result builds a working controller;
- bad values are refused with the field, the value and the fix (streaming minimum outside 1..P, DS with
  G < 2, resume step beyond max_steps).
"""

from __future__ import annotations

import pytest
from fakes import RecordingTrainer, ScriptedRollouts, make_loader, run_virtual
from fakes.settings import controller_settings

from groupwise.algo.filter import GroupFilter
from groupwise.config import WindowedSamplerConfig, config_from_dict
from groupwise.controller.controller import build_controller
from groupwise.controller.settings import ControllerSettings


def test_from_config_maps_every_field():
    cfg = config_from_dict(
        {"mode": "async", "model": {"source": "tiny"}},
        [
            "async.sampler.name=windowed",
            "async.sampler.max_staleness_versions=2",
            "async.sampler.sample_freshest_first=true",
            "grpo.num_prompts_per_step=4",
            "grpo.num_generations_per_prompt=2",
            "async.min_groups_for_streaming_train=2",
            "async.max_inflight_prompts=5",
            "async.max_buffered_rollouts=9",
            "async.rollout_failure.on_dropped_prompt=shrink",
            "async.rollout_failure.max_skipped_prompts=3",
            "async.rollout_failure.max_consecutive_dropped_prompts=4",
            "async.rollout_failure.min_step_batch_fraction=0.75",
            "async.rollout_failure.backoff_base_s=0.5",
            "async.rollout_failure.max_backoff_s=8",
            "grpo.dynamic_sampling.zero_variance_tol=0.01",
            "run.seed=7",
            "run.max_steps=3",
        ],
    )
    s = ControllerSettings.from_config(cfg)
    assert (s.prompts_per_step, s.group_size) == (4, 2)
    assert s.sampler == WindowedSamplerConfig(max_staleness_versions=2, sample_freshest_first=True)
    assert (s.min_groups_for_streaming_train, s.max_inflight_prompts, s.max_buffered_rollouts) == (2, 5, 9)
    f = s.failure
    assert (f.on_dropped_prompt, f.max_skipped_prompts, f.max_consecutive_dropped_prompts) == ("shrink", 3, 4)
    assert (f.min_step_batch_fraction, f.backoff_base_s, f.max_backoff_s) == (0.75, 0.5, 8.0)
    assert s.dynamic_sampling == GroupFilter(enabled=True, tol=0.01, reward_low=0.0, reward_high=1.0)
    assert (s.seed, s.max_steps, s.advantages) == (7, 3, cfg.grpo)
    trainer = RecordingTrainer()
    summary = run_virtual(build_controller(s, make_loader(12), ScriptedRollouts(group_size=2), trainer).run)
    assert summary.stop_reason == "max_steps" and trainer.finished == [0, 1, 2]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"min_groups_for_streaming_train": 5}, "between 1 and prompts_per_step 4"),
        ({"min_groups_for_streaming_train": 0}, "between 1 and prompts_per_step 4"),
        ({"group_size": 1}, "dynamic sampling needs group_size >= 2"),
        ({"start_step": 5, "max_steps": 3}, "max_steps 3 is below the resume step 5"),
        ({"max_inflight_prompts": 0}, "max_inflight_prompts must be >= 1"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    base = {"prompts_per_step": 4, "group_size": 2}
    base.update(kwargs)
    with pytest.raises(ValueError, match=message):
        controller_settings(**base)
