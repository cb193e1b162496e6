"""The closed list of metric keys.

``METRIC_KEYS`` is the closed list of keys a metrics line may hold; each one is defined exactly once in
``docs/metrics.md`` (a test pins that). Adding a metric means adding it here and defining it there.
``METRIC_NAMESPACES`` are the open ones: ``<namespace><name>`` for any name of ``[a-z0-9_]``, each namespace defined
once in docs/metrics.md as ``<namespace><name>`` (a plug-in loss's own metrics: ``loss/plugin/<name>``).
"""

from __future__ import annotations

METRIC_KEYS: tuple[str, ...] = (
    # identity of the line
    "step",
    "weight_version",
    # rewards
    "reward/unfiltered_mean",
    "reward/trained_mean",
    "reward/trained_shaped_mean",
    # dynamic sampling
    "ds/groups_generated",
    "ds/groups_filtered",
    "ds/groups_trained",
    "ds/zero_variance_fraction",
    "ds/zero_variance_max_fraction",
    "ds/zero_variance_min_fraction",
    "ds/gen_rounds",
    "ds/discarded_valid_groups",
    "ds/carried_groups",
    "ds/carried_out_groups",
    # multi-turn episodes (only with episode.environment)
    "episode/turns_mean",
    "episode/turns_max",
    "episode/tool_calls_mean",
    "episode/tool_errors",
    "episode/truncated_observations",
    "episode/env_seconds",
    "episode/model_tokens_mean",
    "episode/env_tokens_mean",
    "episode/solved_fraction",
    "episode/solved_turns_mean",
    "episode/resumed_continued",
    "episode/resumed_restarted",
    "episode/retries",
    "episode/retried_tokens",
    "episode/end_done_fraction",
    "episode/end_max_turns_fraction",
    "episode/end_token_budget_fraction",
    # harness sessions (only with episode.harness or episode.harness_command)
    "harness/sequences_mean",
    "harness/requests_mean",
    "harness/served_tokens_mean",
    "harness/env_tokens_mean",
    "harness/retokenized_tokens",
    "harness/limited_requests",
    "harness/refused_requests",
    "harness/unreadable_tool_calls",
    # loss
    "loss/total",
    "loss/policy",
    "loss/clip_fraction",
    "loss/clip_low_fraction",
    "loss/clip_high_fraction",
    "loss/dual_clip_fraction",
    "loss/kl",
    "loss/entropy",
    "loss/is_weight_mean",
    "loss/is_weight_max",
    "loss/is_oob_fraction",
    "loss/is_seq_masked_fraction",
    "loss/ratio_mean",
    # rollout–trainer mismatch (groupwise.algo.mismatch)
    "mismatch/on_policy_fraction",
    "mismatch/logprob_abs_diff",
    "mismatch/kl_k3",
    # optimizer
    "optim/grad_norm",
    "optim/lr",
    # performance
    "perf/step_seconds",
    "perf/gen_seconds",
    "perf/train_seconds",
    "perf/gen_tokens_per_s",
    "perf/train_tokens_per_s",
    "perf/train_tokens",
    "perf/padding_fraction",
    "perf/elapsed_seconds",
    "perf/rollout_idle_fraction",
    "perf/trainer_idle_fraction",
    # evaluation
    "eval/accuracy",
    "eval/pass_at_k",
    "eval/solved_turns_mean",
    # async accounting
    "accounting/dropped_groups",
    "accounting/replaced_groups",
    "accounting/promoted_groups",
    "accounting/unfilled_groups",
    "accounting/late_losses",
    "ds/late_tallied_groups",
    "buffer/evicted_groups",
    "buffer/aborted_inflight_groups",
    "staleness/mean",
    "staleness/max",
    "rollout/redispatches",
    "rollout/worker_restarts",
    "rollout/resumed_tokens",
    "staleness/token_mean",
    # wasted compute (groupwise.algo.waste)
    "waste/tokens",
    "waste/gen_seconds",
    "waste/filtered_tokens",
    "waste/filtered_gen_seconds",
    "waste/discarded_tokens",
    "waste/discarded_gen_seconds",
    "waste/failed_tokens",
    "waste/failed_gen_seconds",
    "waste/aborted_tokens",
    "waste/aborted_gen_seconds",
    "waste/evicted_tokens",
    "waste/evicted_gen_seconds",
    "waste/generated_tokens",
    "waste/generated_gen_seconds",
    "waste/cumulative_tokens",
    "waste/cumulative_gen_seconds",
    "waste/cumulative_generated_tokens",
    "waste/cumulative_fraction",
    # prompts skipped before dispatch for carrying no signal (data.skip_no_signal)
    "skip/prompts",
    "skip/cumulative_prompts",
    "skip/tokens_saved_est",
    "skip/cumulative_tokens_saved_est",
    "skip/retried",
    "skip/retried_mixed_fraction",
    # supervised warm start (groupwise sft)
    "sft/loss",
)

#: Open namespaces: a key ``<namespace><name>`` with a name of ``[a-z0-9_]`` (at most 64) is accepted.
METRIC_NAMESPACES: tuple[str, ...] = ("loss/plugin/",)
