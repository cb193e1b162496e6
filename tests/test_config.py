"""Config rules of the run-level and algorithm sections (groupwise.config).

Invariants pinned here:
- every cross-field rule and range check fires with an issue naming the key path, the value given, the rule
  and a fix; a valid neighbour of each violation loads;
- several problems (types, ranges, unknown keys, bad overrides, cross-field rules) are reported together in one
  ConfigError, and a section that fails type validation does not hide the other sections' errors;
- a key with no effect in the chosen setting is an error (invariant 10 in docs/design.md);
- a setting that makes training meaningless is an error: G = 1 without dynamic sampling and with no entropy or
  KL term (every advantage and gradient is 0), and with dynamic sampling a zero_variance_tol at or above a built-in
  reward's range [0, 1] (every group filtered); G = 1 with an entropy or KL term is a warning (hazard), and a
  custom reward's range is unknown, so its tolerance is not checked;
- a value whose arithmetic would overflow during training is refused at load, naming the key: a reward timeout
  beyond a day (the timer overflows near 9.2e9 s), a learning rate above 1 (1e38 failed the optimizer's float32
  conversion), lr × weight_decay ≥ 1, an AdamW epsilon that is 0 in float32, coefficients, clips and bounds beyond
  1e6, a KL log-ratio clamp past exp's float32 range, reward-scale targets, slopes and penalties past the reward
  bound 1e30;
- RunConfig built directly in Python runs the same rules;
- defaults follow the switch that makes them meaningless: ``loss.importance_sampling: false`` alone loads, with
  truncation off (and the resolved config says so, so it reloads the same); a truncation asked for explicitly
  without importance sampling is still an error;
- a warm-up longer than the run loads with a warning naming the clamp (the learning rate reaches its peak at the
  last step: ``tests/test_learner.py`` pins the schedule); a warm-up that fits warns nothing.
"""

from __future__ import annotations

import pytest

from groupwise.config import ConfigError, ConfigIssue, RunConfig, config_from_dict, parse_yaml

TINY = {"model": {"source": "tiny"}}


def errors_of(overrides: list[str], base: dict | None = None) -> list[ConfigIssue]:
    with pytest.raises(ConfigError) as info:
        config_from_dict(TINY if base is None else base, overrides)
    return info.value.errors


def issue_at(errors: list[ConfigIssue], path: str) -> ConfigIssue:
    found = [e for e in errors if e.path == path]
    assert found, f"no issue at {path}; got {[e.path for e in errors]}"
    return found[0]


# (overrides on a valid tiny sync config, key path of the issue, value reported, words the rule must contain)
VIOLATIONS = [
    (["model.source=hf"], "model.path", None, "needs model.path"),
    (["model.source=gguf", "model.path=models/x"], "model.gguf_file", None, "needs model.gguf_file"),
    (["model.path=models/x"], "model.path", "models/x", "tiny"),
    (["model.source=hf", "model.path=m", "model.gguf_file=f.gguf"], "model.gguf_file", "f.gguf", "no effect"),
    (["model.source=hf", "model.path=m", "model.tiny.num_layers=2"], "model.tiny.num_layers", 2, "no effect"),
    (["model.tiny.hidden_size=130"], "model.tiny.hidden_size", 130, "divisible"),
    (["model.tiny.max_position_embeddings=16"], "model.tiny.max_position_embeddings", 16, "max_new_tokens"),
    (["loss.kl_coef=0.1"], "loss.kl_coef", 0.1, "reference"),
    (["model.reference=initial"], "model.reference", "initial", "kl_coef"),
    (["loss.kl_input_clamp=5"], "loss.kl_input_clamp", 5, "no effect"),
    (["data.task=jsonl"], "data.jsonl.train_path", None, "needs data.jsonl.train_path"),
    (["data.countdown.max_target=50"], "data.countdown.max_target", 50, "no effect"),
    (["data.jsonl.train_path=a.jsonl"], "data.jsonl.train_path", "a.jsonl", "no effect"),
    (["data.addition.min_digits=3"], "data.addition.max_digits", 1, "min_digits"),
    (["grpo.num_generations_per_prompt=1"], "grpo.num_generations_per_prompt", 1, "at least 2"),
    (["grpo.num_generations_per_prompt=1", "grpo.dynamic_sampling.enabled=false", "grpo.baseline=leave_one_out"],
     "grpo.baseline", "leave_one_out", "leave-one-out"),
    (["grpo.dynamic_sampling.enabled=false", "grpo.dynamic_sampling.batch_multiplier=2"],
     "grpo.dynamic_sampling.batch_multiplier", 2, "no effect"),
    (["grpo.dynamic_sampling.enabled=false", "grpo.dynamic_sampling.max_gen_rounds=8"],
     "grpo.dynamic_sampling.max_gen_rounds", 8, "no effect"),
    (["grpo.dynamic_sampling.batch_multiplier=0.5"], "grpo.dynamic_sampling.batch_multiplier", 0.5, "≥ 1"),
    (["grpo.dynamic_sampling.max_gen_rounds=0"], "grpo.dynamic_sampling.max_gen_rounds", 0, "≥ 1"),
    (["grpo.dynamic_sampling.min_step_batch_fraction=0"], "grpo.dynamic_sampling.min_step_batch_fraction", 0, "> 0"),
    (["grpo.dynamic_sampling.surplus=carry", "loss.importance_sampling=false", "loss.is_truncation=none"],
     "grpo.dynamic_sampling.surplus", "carry", "importance-sampling"),
    (["grpo.advantage_clip_low=1", "grpo.advantage_clip_high=0.5"], "grpo.advantage_clip_low", 1, "<"),
    (["grpo.reward_scaling.enabled=true", "grpo.reward_scaling.source_max=0"],
     "grpo.reward_scaling.source_max", 0, "source_min"),
    (["grpo.reward_scaling.enabled=true", "grpo.reward_scaling.target_min=2"],
     "grpo.reward_scaling.target_max", 1.0, "target_min"),
    (["grpo.reward_scaling.target_max=2"], "grpo.reward_scaling.target_max", 2, "no effect"),
    (["grpo.overlong_shaping.enabled=true"], "grpo.overlong_shaping.max_response_length", None, "needs"),
    (["grpo.overlong_shaping.enabled=true", "grpo.overlong_shaping.max_response_length=10",
      "grpo.overlong_shaping.overlong_buffer_length=10", "grpo.overlong_shaping.overlong_buffer_penalty=1"],
     "grpo.overlong_shaping.overlong_buffer_length", 10, "< max_response_length"),
    (["grpo.overlong_shaping.enabled=true", "grpo.overlong_shaping.max_response_length=16",
      "grpo.overlong_shaping.overlong_buffer_length=4", "grpo.overlong_shaping.overlong_buffer_penalty=-1"],
     "grpo.overlong_shaping.overlong_buffer_penalty", -1, "≥ 0"),
    (["grpo.overlong_shaping.enabled=true", "grpo.overlong_shaping.max_response_length=40",
      "grpo.overlong_shaping.overlong_buffer_length=4", "grpo.overlong_shaping.overlong_buffer_penalty=1"],
     "grpo.overlong_shaping.max_response_length", 40, "no completion reaches"),
    (["grpo.overlong_shaping.overlong_buffer_length=4"], "grpo.overlong_shaping.overlong_buffer_length", 4,
     "no effect"),
    (["loss.epsilon_low=-0.1"], "loss.epsilon_low", -0.1, "≥ 0"),
    (["loss.epsilon_high=-1"], "loss.epsilon_high", -1, "≥ 0"),
    (["loss.dual_clip_c=1"], "loss.dual_clip_c", 1, "> 1"),
    (["loss.dual_clip_c=3"], "loss.dual_clip_c", 3, "one optimizer update per RL step"),
    (["loss.epsilon_high=0.4"], "loss.epsilon_high", 0.4, "ratio is exactly 1"),
    (["optimizer.mini_batches_per_step=17"], "optimizer.mini_batches_per_step", 17, "whole prompt groups"),
    (["model.lora.rank=4"], "model.lora.rank", 4, "no effect"),
    (["model.lora.enabled=true", "model.lora.target_modules=[q_proj, lm_head]"], "model.lora.target_modules",
     ["q_proj", "lm_head"], "LM head"),
    (["model.lora.enabled=true", "model.lora.target_modules=[]"], "model.lora.target_modules", [], "non-empty"),
    (["optimizer.micro_batch_tokens=0"], "optimizer.micro_batch_tokens", 0, "≥ 1"),
    (["loss.is_ratio_min=3"], "loss.is_ratio_min", 3, "≤ loss.is_ratio_max"),
    (["loss.importance_sampling=false", "loss.is_truncation=icepop"], "loss.is_truncation", "icepop",
     "importance_sampling"),
    (["loss.is_truncation=none", "loss.is_ratio_max=3"], "loss.is_ratio_max", 3, "no effect"),
    (["eval.pass_k=0"], "eval.pass_k", 0, "≥ 1"),
    (["generation.max_new_tokens=0"], "generation.max_new_tokens", 0, "≥ 1"),
    (["generation.temperature=0"], "generation.temperature", 0, "≥ 0.01"),
    (["generation.temperature=1e-300"], "generation.temperature", 1e-300, "≥ 0.01"),
    (["generation.top_p=0"], "generation.top_p", 0, "> 0"),
    (["generation.top_p=1.5"], "generation.top_p", 1.5, "≤ 1"),
    (["generation.stop=[a, '']"], "generation.stop", ["a", ""], "empty"),
    (["optimizer.min_lr_ratio=0.1"], "optimizer.min_lr_ratio", 0.1, "no effect"),
    (["optimizer.betas=[1.0, 0.9]"], "optimizer.betas[0]", 1.0, "< 1"),
    (["runtime.ray.num_generation_workers=2"], "runtime.ray.num_generation_workers", 2, "no effect"),
    (["run.name=a/b"], "run.name", "a/b", "single directory"),
    (["run.max_steps=0"], "run.max_steps", 0, "≥ 1"),
    (["reward.function=not a function"], "reward.function", "not a function", "module:function"),
    (["sft.stop_at_accuracy=0"], "sft.stop_at_accuracy", 0, "> 0"),
    # settings that make training meaningless
    (["grpo.num_generations_per_prompt=1", "grpo.dynamic_sampling.enabled=false"], "grpo.num_generations_per_prompt",
     1, "every advantage is exactly 0"),
    (["grpo.dynamic_sampling.zero_variance_tol=1"], "grpo.dynamic_sampling.zero_variance_tol", 1,
     "every group would count as zero-variance"),
    (["reward.function=exact_numeric", "grpo.dynamic_sampling.zero_variance_tol=2.5"],
     "grpo.dynamic_sampling.zero_variance_tol", 2.5, "scores in [0, 1]"),
    # values whose arithmetic overflows during training (timer, float32 conversions, inf or NaN losses)
    (["reward.timeout_s=1e10"], "reward.timeout_s", 1e10, "≤ 86400"),
    (["optimizer.lr=1e38"], "optimizer.lr", 1e38, "≤ 1"),
    (["optimizer.lr=2"], "optimizer.lr", 2, "≤ 1"),
    (["sft.lr=1e38"], "sft.lr", 1e38, "≤ 1"),
    (["optimizer.weight_decay=1e5"], "optimizer.weight_decay", 1e5, "1 − lr × weight_decay"),
    (["optimizer.eps=1e-300"], "optimizer.eps", 1e-300, "≥ 1e-30"),
    (["loss.is_ratio_max=1e300"], "loss.is_ratio_max", 1e300, "≤ 1000000"),
    (["loss.entropy_coef=1e38"], "loss.entropy_coef", 1e38, "≤ 1000000"),
    (["model.reference=initial", "loss.kl_coef=1e300"], "loss.kl_coef", 1e300, "≤ 1000000"),
    (["loss.kl_input_clamp=1e300"], "loss.kl_input_clamp", 1e300, "≤ 80"),
    (["loss.kl_output_clamp=1e300"], "loss.kl_output_clamp", 1e300, "≤ 1000000"),
    (["optimizer.mini_batches_per_step=2", "loss.epsilon_low=1e300"], "loss.epsilon_low", 1e300, "< 1"),
    (["optimizer.mini_batches_per_step=2", "loss.epsilon_high=1e300"], "loss.epsilon_high", 1e300, "≤ 1000000"),
    (["model.lora.enabled=true", "model.lora.alpha=1e300"], "model.lora.alpha", 1e300, "≤ 1000000"),
    (["grpo.overlong_shaping.enabled=true", "grpo.overlong_shaping.max_response_length=16",
      "grpo.overlong_shaping.overlong_buffer_length=4", "grpo.overlong_shaping.overlong_buffer_penalty=1e300"],
     "grpo.overlong_shaping.overlong_buffer_penalty", 1e300, "≤ 1e30"),
    (["grpo.reward_scaling.enabled=true", "grpo.reward_scaling.target_max=1e300"],
     "grpo.reward_scaling.target_max", 1e300, "≤ 1e30"),
    (["grpo.reward_scaling.enabled=true", "grpo.reward_scaling.source_max=1e-300"],
     "grpo.reward_scaling.source_max", 1e-300, "slope"),
]


@pytest.mark.parametrize(("overrides", "path", "value", "words"), VIOLATIONS, ids=[v[1] for v in VIOLATIONS])
def test_each_rule_reports_path_value_rule_and_fix(overrides, path, value, words):
    errors = errors_of(overrides)
    issue = issue_at(errors, path)
    assert issue.value == value
    assert words in issue.rule
    assert issue.fix.strip()
    rendered = str(ConfigError(errors))
    assert path in rendered and issue.rule in rendered and issue.fix in rendered


# Neighbours of the violations above that must load: the rules do not over-reach.
VALID = [
    ["model.source=hf", "model.path=models/x"],
    ["model.source=gguf", "model.path=smollm2"],
    ["model.source=gguf", "model.path=models/x", "model.gguf_file=m.gguf"],
    ["loss.kl_coef=0.1", "model.reference=initial", "loss.kl_input_clamp=5"],
    ["data.task=jsonl", "data.jsonl.train_path=train.jsonl", "data.addition.max_digits=1"],
    ["data.task=countdown", "data.countdown.max_target=50"],
    ["grpo.num_generations_per_prompt=1", "grpo.dynamic_sampling.enabled=false", "loss.entropy_coef=0.01"],
    ["grpo.dynamic_sampling.zero_variance_tol=0.99"],
    ["grpo.dynamic_sampling.zero_variance_tol=5", "reward.function=my_rewards:score"],
    ["grpo.dynamic_sampling.enabled=false", "grpo.dynamic_sampling.zero_variance_tol=1"],
    ["grpo.dynamic_sampling.enabled=false", "grpo.dynamic_sampling.zero_variance_tol=0.1"],
    ["grpo.dynamic_sampling.surplus=carry", "grpo.dynamic_sampling.batch_multiplier=1.5"],
    ["grpo.advantage_clip_low=-1", "grpo.advantage_clip_high=1"],
    ["grpo.reward_scaling.enabled=true", "grpo.reward_scaling.source_min=-1", "grpo.reward_scaling.target_max=5"],
    ["grpo.overlong_shaping.enabled=true", "grpo.overlong_shaping.max_response_length=16",
     "grpo.overlong_shaping.overlong_buffer_length=4", "grpo.overlong_shaping.overlong_buffer_penalty=0.5"],
    ["loss.importance_sampling=false", "loss.is_truncation=none"],
    ["loss.is_truncation=icepop", "loss.is_ratio_min=0.5", "loss.is_ratio_max=0.5"],
    ["optimizer.mini_batches_per_step=4", "loss.dual_clip_c=3", "loss.epsilon_high=0.3"],
    ["optimizer.epochs_per_step=2", "loss.epsilon_low=0.1"],
    ["optimizer.micro_batch_tokens=512", "optimizer.logprob_chunk_tokens=null", "model.gradient_checkpointing=true"],
    ["model.lora.enabled=true", "model.lora.rank=4", "model.lora.target_modules=[q_proj, v_proj]"],
    ["optimizer.schedule=cosine", "optimizer.min_lr_ratio=0.1", "optimizer.warmup_steps=99"],
    ["runtime.backend=ray", "runtime.ray.num_generation_workers=2", "runtime.ray.address=auto"],
    ["sim.num_prompts=10", "sim.straggler_rate=0.5"],
    ["sft.steps=10", "sft.stop_at_accuracy=0.9"],
    ["reward.function=my_pkg.rewards:score", "reward.kwargs={scale: 2}"],
]


@pytest.mark.parametrize("overrides", VALID, ids=[v[0] for v in VALID])
def test_valid_neighbours_load(overrides):
    dumped = config_from_dict(TINY, overrides).model_dump(by_alias=True)
    for override in overrides:
        key, _, text = override.partition("=")
        node = dumped
        for part in key.split("."):
            node = node[part]
        assert node == parse_yaml(text), key


def test_all_problems_are_reported_together():
    data = {
        "model": {"source": "tiny", "path": "x"},  # cross-field (model)
        "grpo": {"num_prompts_per_step": "16"},  # type error: grpo fails validation
        "loss": {"kl_coef": 0.1, "epsilon_high": -1},  # range error: loss fails validation
        "optimizer": {"min_lr_ratio": 0.5},  # cross-field (optimizer): no effect with constant schedule
        "gpro": {},  # unknown top-level key
    }
    errors = errors_of(["run.max_steps=0", "not-an-override"], base=data)
    paths = {e.path for e in errors}
    assert {"model.path", "grpo.num_prompts_per_step", "loss.epsilon_high", "optimizer.min_lr_ratio", "gpro",
            "run.max_steps", "not-an-override"} <= paths
    assert issue_at(errors, "grpo.num_prompts_per_step").value == "16"
    assert "integer" in issue_at(errors, "grpo.num_prompts_per_step").rule


def test_rules_needing_a_broken_section_are_skipped_not_crashed():
    # grpo is malformed, so "DS needs G ≥ 2" cannot be judged; the loss rule still runs
    errors = errors_of(["grpo.num_generations_per_prompt=1", "grpo.baseline=median", "loss.kl_coef=0.5"])
    paths = [e.path for e in errors]
    assert "grpo.baseline" in paths and "loss.kl_coef" in paths
    assert "grpo.num_generations_per_prompt" not in paths


def test_error_string_is_a_numbered_multiline_list():
    errors = errors_of(["loss.kl_coef=0.1", "run.max_steps=0"])
    text = str(ConfigError(errors, source="cfg.yaml"))
    lines = text.splitlines()
    assert lines[0] == "invalid config cfg.yaml: 2 errors"
    assert lines[1].startswith("  1. ") and any(line.startswith("  2. ") for line in lines)
    assert sum("rule:" in line for line in lines) == 2 and sum("fix:" in line for line in lines) == 2


def test_type_errors_are_strict_and_named():
    errors = errors_of(["run.max_steps=1.5", "data.shuffle=yes please", "generation.temperature=true",
                        "run.seed='3'"])
    assert "integer" in issue_at(errors, "run.max_steps").rule
    assert "true or false" in issue_at(errors, "data.shuffle").rule
    assert "number" in issue_at(errors, "generation.temperature").rule
    assert issue_at(errors, "run.seed").value == "3"


def test_literal_errors_list_the_choices():
    issue = issue_at(errors_of(["loss.normalization=per_token"]), "loss.normalization")
    assert "token_level" in issue.rule and "sequence_level" in issue.fix


def test_nan_and_infinity_are_refused():
    errors = errors_of(["optimizer.lr=.nan", "loss.epsilon_high=.inf"])
    assert {"optimizer.lr", "loss.epsilon_high"} <= {e.path for e in errors}


def test_direct_construction_runs_the_same_rules():
    with pytest.raises(ConfigError) as info:
        RunConfig(model={"source": "tiny"}, grpo={"num_generations_per_prompt": 1}, loss={"kl_coef": 0.2})
    assert {e.path for e in info.value.errors} == {"grpo.num_generations_per_prompt", "loss.kl_coef"}
    assert RunConfig(model={"source": "tiny"}).grpo.dynamic_sampling.enabled


def test_default_model_source_needs_a_path():
    with pytest.raises(ConfigError) as info:
        config_from_dict({})
    assert [e.path for e in info.value.errors] == ["model.path"]


def test_derived_values():
    config = config_from_dict(TINY, ["grpo.num_prompts_per_step=25", "grpo.dynamic_sampling.batch_multiplier=1.12"])
    assert config.prompts_per_generation_round == 28  # not 29: 25 × 1.12 is 28.000000000000004 in floats
    no_ds = config_from_dict(TINY, ["grpo.num_prompts_per_step=10", "grpo.dynamic_sampling.enabled=false"])
    assert no_ds.prompts_per_generation_round == 10
    assert config.streaming_min_groups == 25


def test_config_error_survives_pickling():
    # errors raised inside a Ray actor cross process boundaries by pickle
    import pickle

    errors = errors_of(["loss.kl_coef=0.1", "run.max_steps=0"])
    error = ConfigError(errors, source="x.yaml")
    again = pickle.loads(pickle.dumps(error))
    assert again.errors == errors and again.source == "x.yaml" and str(again) == str(error)


def test_importance_sampling_off_alone_turns_truncation_off():
    cfg = config_from_dict(TINY, ["loss.importance_sampling=false"])
    assert (cfg.loss.importance_sampling, cfg.loss.is_truncation) == (False, "none")
    assert config_from_dict(cfg.model_dump(by_alias=True)).loss.is_truncation == "none"  # a run dir's config.yaml
    assert config_from_dict(TINY).loss.is_truncation == "tis"
    issue = issue_at(errors_of(["loss.importance_sampling=false", "loss.is_truncation=tis"]), "loss.is_truncation")
    assert "importance_sampling false turns off" in issue.rule


def test_a_warm_up_longer_than_the_run_is_clamped_with_a_warning():
    cfg = config_from_dict(TINY, ["run.max_steps=1", "optimizer.warmup_steps=5"])
    [warning] = cfg.warnings()
    assert (warning.path, warning.value) == ("optimizer.warmup_steps", 5)
    assert "clamped to 1 step(s)" in warning.rule and "peak at the run's last step" in warning.rule
    assert config_from_dict(TINY, ["run.max_steps=5", "optimizer.warmup_steps=5"]).warnings() == []
