"""Cross-field rules of the ``async`` section and of dynamic sampling under the async single controller."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from groupwise.config.algorithm import DynamicSamplingSection
from groupwise.config.async_schema import required_buffer_capacity
from groupwise.config.checks import no_effect, rule
from groupwise.config.issues import ConfigIssue

if TYPE_CHECKING:
    from groupwise.config.schema import RunConfig

# Dynamic-sampling knobs of the sync loop; the async controller replaces filtered groups one by one instead.
SYNC_ONLY_DS_KEYS = (
    "batch_multiplier", "max_gen_rounds", "on_exhausted", "min_step_batch_fraction", "stop_when_exhausted", "surplus"
)

WEIGHT_FIFO_DS_RULE = (
    "grpo.dynamic_sampling.enabled cannot be combined with async.sampler.name='weight_fifo': weight_fifo builds "
    "each step only from groups generated under the same weight version (a step holds one weight version), and a "
    "filtered group's replacement is generated later under a newer version, so the old version's bucket can never "
    "fill and training hangs."
)
WEIGHT_FIFO_DS_FIX = (
    "Set async.sampler.name to 'in_order', 'ready_first' or 'windowed', or set grpo.dynamic_sampling.enabled=false."
)


@rule("mode", "async_")
def async_keys_need_async_mode(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """Every async.* key keeps its default unless mode is async."""
    if cfg.mode != "async":
        yield from no_effect(cfg.async_, "async", f"in mode '{cfg.mode}'", "remove it, or set mode: async")


@rule("mode", "grpo")
def async_ignores_sync_ds_keys(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """Async mode: grpo.dynamic_sampling batch_multiplier, max_gen_rounds, on_exhausted, min_step_batch_fraction,
    stop_when_exhausted and surplus keep their defaults (they belong to the sync loop)."""
    if cfg.mode != "async":
        return
    ds, default = cfg.grpo.dynamic_sampling, DynamicSamplingSection()
    for key in SYNC_ONLY_DS_KEYS:
        value = getattr(ds, key)
        if value != getattr(default, key):
            path = f"grpo.dynamic_sampling.{key}"
            yield ConfigIssue(
                path, value, f"{path} has no effect in mode async (the controller replaces each filtered group "
                "from the spare pool; see async.rollout_failure)",
                f"remove {path}; tune async.rollout_failure.max_replacement_attempts / min_step_batch_fraction instead",
            )


@rule("mode", "grpo", "async_")
def async_streaming_and_capacity(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """Async mode: 1 ≤ min_groups_for_streaming_train ≤ P, and max_buffered_rollouts ≥ P × (window + 1) for
    gated samplers (in_order, ready_first, weight_fifo)."""
    if cfg.mode != "async":
        return
    section, p = cfg.async_, cfg.grpo.num_prompts_per_step
    chunk = section.min_groups_for_streaming_train
    if chunk is not None and not 1 <= chunk <= p:
        yield ConfigIssue(
            "async.min_groups_for_streaming_train", chunk,
            f"async.min_groups_for_streaming_train must be between 1 and grpo.num_prompts_per_step ({p})",
            f"set it to a value in 1..{p}, or null for full batches of {p}",
        )
    need = required_buffer_capacity(section.sampler, p)
    if need is not None and section.max_buffered_rollouts < need:
        yield ConfigIssue(
            "async.max_buffered_rollouts", section.max_buffered_rollouts,
            f"sampler '{section.sampler.name}' admits up to P × (window + 1) = {p} × ({section.sampler.window} + 1) "
            f"= {need} groups ahead; a smaller buffer deadlocks",
            f"set async.max_buffered_rollouts ≥ {need}, or lower the sampler window or grpo.num_prompts_per_step",
        )


@rule("mode", "async_", "loss")
def async_window_needs_importance_sampling(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """Async mode: a staleness or lookahead window > 0 needs loss.importance_sampling: true."""
    if cfg.mode != "async":
        return
    sampler = cfg.async_.sampler
    if sampler.window and not cfg.loss.importance_sampling:
        knob = "max_lookahead_versions" if sampler.name == "in_order" else "max_staleness_versions"
        yield ConfigIssue(
            f"async.sampler.{knob}", sampler.window,
            f"sampler '{sampler.name}' with a window of {sampler.window} trains off-policy groups, which need "
            "importance-sampling correction",
            f"set loss.importance_sampling: true, or async.sampler.{knob}: 0",
        )


@rule("mode", "grpo", "async_")
def async_dynamic_sampling(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """Async dynamic sampling: refused with weight_fifo; needs on_dropped_prompt: replace except with windowed."""
    if cfg.mode != "async" or not cfg.grpo.dynamic_sampling.enabled:
        return
    sampler, failure = cfg.async_.sampler, cfg.async_.rollout_failure
    if sampler.name == "weight_fifo":
        yield ConfigIssue("async.sampler.name", sampler.name, WEIGHT_FIFO_DS_RULE, WEIGHT_FIFO_DS_FIX)
    elif sampler.name != "windowed" and failure.on_dropped_prompt != "replace":
        yield ConfigIssue(
            "async.rollout_failure.on_dropped_prompt", failure.on_dropped_prompt,
            f"dynamic sampling with sampler '{sampler.name}' replaces each filtered group with a spare prompt; "
            "'shrink' would shrink a step for every zero-variance group",
            "set async.rollout_failure.on_dropped_prompt: replace, or use async.sampler.name: windowed",
        )


@rule("mode", "async_", "runtime")
def async_rollout_failure(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """Async mode: max_backoff_s ≥ backoff_base_s and < runtime.stall_timeout_s; with on_dropped_prompt shrink the
    replacement keys keep their defaults."""
    if cfg.mode != "async":
        return  # in sync mode any change here is already reported as having no effect
    failure = cfg.async_.rollout_failure
    if cfg.runtime.stall_timeout_s <= failure.max_backoff_s:
        yield ConfigIssue(
            "runtime.stall_timeout_s", cfg.runtime.stall_timeout_s,
            f"runtime.stall_timeout_s must exceed async.rollout_failure.max_backoff_s ({failure.max_backoff_s}): "
            "while every prompt backs off before a retry nothing progresses, and the watchdog would stop the run",
            "raise runtime.stall_timeout_s or lower async.rollout_failure.max_backoff_s",
        )
    if failure.max_backoff_s < failure.backoff_base_s:
        yield ConfigIssue(
            "async.rollout_failure.max_backoff_s", failure.max_backoff_s,
            f"max_backoff_s must be ≥ backoff_base_s ({failure.backoff_base_s})",
            "raise max_backoff_s or lower backoff_base_s",
        )
    if failure.on_dropped_prompt == "shrink":
        defaults = type(failure)()
        for key in ("max_replacement_attempts", "replacement_reserve_prompts"):
            value = getattr(failure, key)
            if value != getattr(defaults, key):
                path = f"async.rollout_failure.{key}"
                yield ConfigIssue(path, value, f"{path} has no effect with on_dropped_prompt shrink",
                                  f"remove {path}, or set async.rollout_failure.on_dropped_prompt: replace")


@rule("async_")
def partial_rollout_kv_needs_partial_rollouts(cfg: RunConfig) -> Iterator[ConfigIssue]:
    """async.partial_rollout_kv keeps its default unless async.partial_rollouts is continue."""
    section = cfg.async_
    if section.partial_rollouts == "off" and section.partial_rollout_kv != "recompute":
        yield ConfigIssue(
            "async.partial_rollout_kv", section.partial_rollout_kv,
            "async.partial_rollout_kv has no effect with async.partial_rollouts off (no row spans a weight sync)",
            "remove async.partial_rollout_kv, or set async.partial_rollouts: continue",
        )
