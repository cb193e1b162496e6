"""Config rules of the async single controller (the ``async`` section and dynamic sampling in async mode).

Invariants pinned here:
- async.* keys with non-default values are an error outside mode async; sync-only dynamic-sampling knobs are
  an error in mode async (a key with no effect is an error);
- gated samplers need max_buffered_rollouts ≥ P × (window + 1); windowed and custom need nothing at load;
- 1 ≤ min_groups_for_streaming_train ≤ P; a staleness/lookahead window > 0 needs importance sampling;
- dynamic sampling is refused with weight_fifo (with the full explanation) and needs on_dropped_prompt
  replace except with windowed;
- a knob of another sampler is an error naming the sampler that owns it (in YAML and in overrides).
"""

from __future__ import annotations

import pytest

from groupwise.config import (
    ConfigError,
    ConfigIssue,
    InOrderSamplerConfig,
    ReadyFirstSamplerConfig,
    WindowedSamplerConfig,
    config_from_dict,
    load_config,
    required_buffer_capacity,
)

ASYNC = {"mode": "async", "model": {"source": "tiny"}}


def errors_of(overrides: list[str], base: dict | None = None) -> list[ConfigIssue]:
    with pytest.raises(ConfigError) as info:
        config_from_dict(ASYNC if base is None else base, overrides)
    return info.value.errors


def issue_at(errors: list[ConfigIssue], path: str) -> ConfigIssue:
    found = [e for e in errors if e.path == path]
    assert found, f"no issue at {path}; got {[e.path for e in errors]}"
    return found[0]


def test_async_keys_are_an_error_in_sync_mode():
    errors = errors_of(["mode=sync", "async.max_inflight_prompts=8", "async.rollout_failure.max_backoff_s=5"])
    assert issue_at(errors, "async.max_inflight_prompts").value == 8
    assert "mode: async" in issue_at(errors, "async.rollout_failure.max_backoff_s").fix
    # choosing another sampler is reported as the whole sampler block
    sampler = issue_at(errors_of(["mode=sync", "async.sampler.name=in_order"]), "async.sampler")
    assert sampler.value == {"name": "in_order", "max_lookahead_versions": 1}


def test_async_defaults_written_out_are_fine_in_sync_mode():
    config = config_from_dict({"model": {"source": "tiny"}, "async": {"max_inflight_prompts": 32}})
    assert config.mode == "sync"


@pytest.mark.parametrize(
    ("key", "value"),
    [("batch_multiplier", "2"), ("max_gen_rounds", "8"), ("on_exhausted", "raise"),
     ("min_step_batch_fraction", "0.5"), ("surplus", "carry")],
)
def test_sync_only_dynamic_sampling_knobs_are_an_error_in_async_mode(key, value):
    issue = issue_at(errors_of([f"grpo.dynamic_sampling.{key}={value}"]), f"grpo.dynamic_sampling.{key}")
    assert "mode async" in issue.rule and "rollout_failure" in issue.fix


def test_gated_sampler_capacity():
    issue = issue_at(errors_of(["grpo.num_prompts_per_step=40"]), "async.max_buffered_rollouts")
    assert issue.value == 64 and "80" in issue.rule and "≥ 80" in issue.fix
    config_from_dict(ASYNC, ["grpo.num_prompts_per_step=32"])  # 32 × 2 = 64 fits exactly
    lookahead = ["async.sampler.name=in_order", "async.sampler.max_lookahead_versions=3"]
    config_from_dict(ASYNC, lookahead)  # 16 × 4 = 64
    assert issue_at(errors_of(lookahead[:1] + ["async.sampler.max_lookahead_versions=4"]),
                    "async.max_buffered_rollouts").value == 64


def test_ungated_and_custom_samplers_have_no_load_time_capacity():
    config_from_dict(ASYNC, ["async.sampler.name=windowed", "grpo.num_prompts_per_step=60"])
    config_from_dict(ASYNC, ["async.sampler={name: custom, target: 'pkg.mod:Sampler', kwargs: {a: 1}}",
                             "grpo.num_prompts_per_step=60"])


def test_required_buffer_capacity_per_sampler():
    assert required_buffer_capacity(InOrderSamplerConfig(max_lookahead_versions=0), 8) == 8
    assert required_buffer_capacity(ReadyFirstSamplerConfig(max_staleness_versions=2), 8) == 24
    assert required_buffer_capacity(WindowedSamplerConfig(max_staleness_versions=2), 8) is None


@pytest.mark.parametrize("chunk", [0, 17])
def test_streaming_chunk_must_be_between_1_and_p(chunk):
    issue = issue_at(errors_of([f"async.min_groups_for_streaming_train={chunk}"]),
                     "async.min_groups_for_streaming_train")
    assert issue.value == chunk and "16" in issue.rule


@pytest.mark.parametrize("chunk", [1, 16])
def test_streaming_chunk_bounds_are_inclusive(chunk):
    config = config_from_dict(ASYNC, [f"async.min_groups_for_streaming_train={chunk}"])
    assert config.streaming_min_groups == chunk


NO_IS = ["loss.importance_sampling=false", "loss.is_truncation=none"]


@pytest.mark.parametrize(
    ("sampler", "knob"),
    [("ready_first", "max_staleness_versions"), ("in_order", "max_lookahead_versions"),
     ("windowed", "max_staleness_versions")],
)
def test_stale_window_needs_importance_sampling(sampler, knob):
    issue = issue_at(errors_of(NO_IS + [f"async.sampler.name={sampler}"]), f"async.sampler.{knob}")
    assert issue.value == 1 and "importance_sampling: true" in issue.fix
    config_from_dict(ASYNC, NO_IS + [f"async.sampler.name={sampler}", f"async.sampler.{knob}=0"])


def test_weight_fifo_with_dynamic_sampling_is_refused_with_the_explanation():
    errors = errors_of(["async.sampler.name=weight_fifo"])
    issue = issue_at(errors, "async.sampler.name")
    assert issue.value == "weight_fifo"
    assert issue.rule.startswith(
        "grpo.dynamic_sampling.enabled cannot be combined with async.sampler.name='weight_fifo'"
    )
    for words in ("one weight version", "newer version", "can never fill", "training hangs"):
        assert words in issue.rule
    assert "'in_order', 'ready_first' or 'windowed'" in issue.fix
    assert "grpo.dynamic_sampling.enabled=false" in issue.fix
    config_from_dict(ASYNC, ["async.sampler.name=weight_fifo", "grpo.dynamic_sampling.enabled=false"])


@pytest.mark.parametrize("sampler", ["in_order", "ready_first"])
def test_dynamic_sampling_needs_replace(sampler):
    errors = errors_of([f"async.sampler.name={sampler}", "async.rollout_failure.on_dropped_prompt=shrink"])
    assert issue_at(errors, "async.rollout_failure.on_dropped_prompt").value == "shrink"


def test_windowed_dynamic_sampling_may_shrink():
    config = config_from_dict(ASYNC, ["async.sampler.name=windowed", "async.rollout_failure.on_dropped_prompt=shrink"])
    assert config.async_.rollout_failure.on_dropped_prompt == "shrink"


def test_dynamic_sampling_in_async_needs_two_generations():
    issue = issue_at(errors_of(["grpo.num_generations_per_prompt=1"]), "grpo.num_generations_per_prompt")
    assert issue.value == 1


def test_foreign_sampler_knob_names_its_owner_in_overrides():
    issue = issue_at(errors_of(["async.sampler.max_lookahead_versions=0"]), "async.sampler.max_lookahead_versions")
    assert "'in_order'" in issue.rule and "'ready_first'" in issue.rule
    assert "async.sampler.name: in_order" in issue.fix


def test_foreign_sampler_knob_names_its_owners_in_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("mode: async\nmodel: {source: tiny}\n"
                    "async:\n  sampler:\n    name: in_order\n    max_staleness_versions: 2\n"
                    "    sample_freshest_first: true\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    staleness = issue_at(info.value.errors, "async.sampler.max_staleness_versions")
    assert all(name in staleness.rule for name in ("'ready_first'", "'windowed'", "'weight_fifo'"))
    assert "'windowed'" in issue_at(info.value.errors, "async.sampler.sample_freshest_first").rule


def test_sampler_name_defaults_to_ready_first():
    config = config_from_dict(ASYNC, ["async.sampler.max_staleness_versions=2", "async.max_buffered_rollouts=48"])
    assert config.async_.sampler == ReadyFirstSamplerConfig(max_staleness_versions=2)


def test_unknown_sampler_name_lists_the_samplers():
    issue = issue_at(errors_of(["async.sampler.name=fifo"]), "async.sampler")
    assert "in_order" in issue.rule and "windowed" in issue.fix


def test_custom_sampler_target_is_required_and_checked():
    errors = errors_of(["async.sampler.name=custom"])
    assert "required" in issue_at(errors, "async.sampler.target").rule
    bad = issue_at(errors_of(["async.sampler={name: custom, target: NoColon}"]), "async.sampler.target")
    assert bad.value == "NoColon" and "module:ClassName" in bad.rule


def test_rollout_failure_rules():
    errors = errors_of(["async.rollout_failure.backoff_base_s=10", "async.rollout_failure.max_backoff_s=5"])
    assert issue_at(errors, "async.rollout_failure.max_backoff_s").value == 5
    shrink = ["async.sampler.name=windowed", "async.rollout_failure.on_dropped_prompt=shrink",
              "async.rollout_failure.max_replacement_attempts=3"]
    assert issue_at(errors_of(shrink), "async.rollout_failure.max_replacement_attempts").value == 3
    assert issue_at(errors_of(["async.max_inflight_prompts=0"]), "async.max_inflight_prompts").value == 0
