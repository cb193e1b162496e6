"""Loading configs: YAML files, dotted overrides, unknown-key suggestions, round trips, import hygiene.

Invariants pinned here:
- overrides parse their right side as YAML (int, float incl. ``1e-4``, bool, null, list, mapping) and create
  missing sections; a key given twice and malformed overrides are reported, never raised as another exception;
- unknown keys (top level and nested, in YAML and in overrides) are errors suggesting the nearest valid key;
- a missing file, a YAML syntax error or a non-mapping document is a ConfigError;
- every file in examples/ loads; ``to_yaml`` output loads back to an equal config (``async`` alias kept);
- random mutations of a valid config give a RunConfig or a ConfigError, never another exception;
- every schema field has a docstring, docs/configs.md is what the generator renders, and importing
  groupwise.config (or the CLI, or the input checks ``config check`` runs) does not import torch.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from groupwise.config import (
    ConfigError,
    ConfigIssue,
    CustomSamplerConfig,
    RunConfig,
    config_from_dict,
    load_config,
)
from groupwise.config.keys import dotted_paths, model_types, valid_paths

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
TINY = {"model": {"source": "tiny"}}


def errors_of(overrides: list[str], base: dict | None = None) -> list[ConfigIssue]:
    with pytest.raises(ConfigError) as info:
        config_from_dict(TINY if base is None else base, overrides)
    return info.value.errors


def only_issue(errors: list[ConfigIssue]) -> ConfigIssue:
    assert len(errors) == 1, [str(e) for e in errors]
    return errors[0]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# --- overrides ----------------------------------------------------------------------------------------------------


def test_overrides_parse_yaml_scalars():
    config = config_from_dict(TINY, [
        "grpo.num_prompts_per_step=8", "loss.entropy_coef=0.3", "optimizer.lr=1e-4", "optimizer.eps=2E-9",
        "data.shuffle=false", "run.max_epochs=null", "run.name=my-run", "generation.stop=[a, 'b c']",
        "reward.kwargs={tolerance: 0.5, strict: true}",
    ])
    assert config.grpo.num_prompts_per_step == 8
    assert config.loss.entropy_coef == 0.3
    assert config.optimizer.lr == 1e-4 and config.optimizer.eps == 2e-9
    assert config.data.shuffle is False and config.run.max_epochs is None and config.run.name == "my-run"
    assert config.generation.stop == ["a", "b c"]
    assert config.reward.kwargs == {"tolerance": 0.5, "strict": True}


def test_overrides_create_sections_and_do_not_touch_the_input():
    data = {"model": {"source": "tiny"}, "grpo": {"num_prompts_per_step": 4}}
    config = config_from_dict(data, ["grpo.num_prompts_per_step=12", "grpo.dynamic_sampling.zero_variance_tol=0.1"])
    assert config.grpo.num_prompts_per_step == 12
    assert config.grpo.dynamic_sampling.zero_variance_tol == 0.1
    assert data == {"model": {"source": "tiny"}, "grpo": {"num_prompts_per_step": 4}}


def test_an_override_given_twice_is_refused_not_taken_last():
    issue = only_issue(errors_of(["grpo.num_prompts_per_step=8", "run.seed=1", "grpo.num_prompts_per_step=12"]))
    assert issue.path == "grpo.num_prompts_per_step" and issue.value == "8 and 12"
    assert "given twice" in issue.rule


@pytest.mark.parametrize("override", ["grpo.num_prompts_per_step", "=3", "grpo..x=1", ".x=1"])
def test_malformed_overrides_are_reported(override):
    issue = only_issue(errors_of([override]))
    assert issue.path == override and "KEY=VALUE" in issue.rule


def test_override_through_a_value_is_reported():
    base = {**TINY, "grpo": {"num_prompts_per_step": 8}}
    issue = only_issue(errors_of(["grpo.num_prompts_per_step.x=1"], base=base))
    assert issue.path == "grpo.num_prompts_per_step" and issue.value == 8
    assert "grpo.num_prompts_per_step=VALUE" in issue.fix
    # when the file did not set the key, the override builds a mapping there, which the type check reports
    issue = only_issue(errors_of(["grpo.num_prompts_per_step.x=1"]))
    assert issue.path == "grpo.num_prompts_per_step" and issue.value == {"x": 1}


def test_override_with_invalid_yaml_value_is_reported():
    issue = only_issue(errors_of(["run.name=[unclosed"]))
    assert issue.path == "run.name" and issue.value == "[unclosed" and "YAML" in issue.rule


# --- unknown keys -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "overrides", "path", "suggestion"),
    [
        ({"gpro": {}}, [], "gpro", "grpo"),
        ({"grpo": {"num_prompt_per_step": 8}}, [], "grpo.num_prompt_per_step", "grpo.num_prompts_per_step"),
        ({"grpo": {"epsilon_high": 0.3}}, [], "grpo.epsilon_high", "loss.epsilon_high"),
        ({"grpo": {"dynamic_sampling": {"max_gen_round": 2}}}, [], "grpo.dynamic_sampling.max_gen_round",
         "grpo.dynamic_sampling.max_gen_rounds"),
        ({}, ["mdoe=async"], "mdoe", "mode"),
        ({}, ["grpo.num_prompt_per_step=8"], "grpo.num_prompt_per_step", "grpo.num_prompts_per_step"),
        ({}, ["run.sed=1"], "run.sed", "run.seed"),
        ({}, ["num_prompts_per_step=8"], "num_prompts_per_step", "grpo.num_prompts_per_step"),
        ({}, ["async.rollout_failure.max_backof_s=3"], "async.rollout_failure.max_backof_s",
         "async.rollout_failure.max_backoff_s"),
    ],
)
def test_unknown_keys_suggest_the_nearest_valid_key(data, overrides, path, suggestion):
    issue = only_issue(errors_of(overrides, base={**TINY, **data}))
    assert issue.path == path and "unknown key" in issue.rule
    assert f"did you mean `{suggestion}`?" == issue.fix


def test_unknown_key_in_a_yaml_file_suggests_too(tmp_path):
    path = write(tmp_path, "model:\n  source: tiny\nloss:\n  epsilon_hihg: 0.3\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    issue = only_issue(info.value.errors)
    assert issue.path == "loss.epsilon_hihg" and issue.value == 0.3
    assert issue.fix == "did you mean `loss.epsilon_high`?"
    assert str(path) in str(info.value)


def test_unknown_key_with_nothing_close_lists_the_valid_keys():
    issue = only_issue(errors_of(["eval.zzzzzz=1"]))
    assert "valid keys here:" in issue.fix and "pass_k" in issue.fix


def test_free_form_mappings_accept_any_key():
    config = config_from_dict(TINY, ["reward.function=pkg.mod:fn", "reward.kwargs.any_name=3"])
    assert config.reward.kwargs == {"any_name": 3}


# --- files --------------------------------------------------------------------------------------------------------


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.yaml")
    assert "does not exist" in only_issue(info.value.errors).rule


def test_yaml_syntax_error_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "grpo:\n  num_prompts_per_step: [8\n"))
    assert "not valid YAML" in only_issue(info.value.errors).rule


def test_top_level_must_be_a_mapping(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "- a\n- b\n"))
    assert only_issue(info.value.errors).value == ["a", "b"]


def test_empty_section_means_defaults_and_yaml_floats_with_exponent_load(tmp_path):
    config = load_config(write(tmp_path, "model:\n  source: tiny\ngrpo:\n  # nothing yet\noptimizer:\n  lr: 3e-5\n"))
    assert config.grpo.num_prompts_per_step == 16 and config.optimizer.lr == 3e-5


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_loads_and_round_trips(path):
    config = load_config(path)
    assert config_from_dict(yaml.safe_load(config.to_yaml())) == config


def test_examples_say_what_they_are_named_for():
    names = {p.name for p in EXAMPLES}
    assert {"addition.yaml", "addition_nods.yaml", "addition_async.yaml"} <= names
    ds, nods, asynchronous = (load_config(ROOT / "examples" / n)
                              for n in ("addition.yaml", "addition_nods.yaml", "addition_async.yaml"))
    assert ds.mode == "sync" and ds.grpo.dynamic_sampling.enabled and ds.data.addition.max_digits == 2
    assert nods.mode == "sync" and not nods.grpo.dynamic_sampling.enabled
    assert asynchronous.mode == "async" and asynchronous.async_.sampler.name == "ready_first"
    assert asynchronous.grpo.dynamic_sampling.enabled


def test_to_yaml_round_trips_non_defaults_and_uses_the_async_key():
    config = config_from_dict(TINY, [
        "mode=async", "async.sampler={name: custom, target: 'pkg.mod:Sampler', kwargs: {depth: 2}}",
        "optimizer.betas=[0.8, 0.95]", "generation.stop=['\\n']", "run.name=x", "loss.dual_clip_c=3",
        "optimizer.mini_batches_per_step=2",
    ])
    text = config.to_yaml()
    dumped = yaml.safe_load(text)
    assert "async" in dumped and "async_" not in dumped
    again = config_from_dict(dumped)
    assert again == config
    assert again.async_.sampler == CustomSamplerConfig(target="pkg.mod:Sampler", kwargs={"depth": 2})
    assert again.optimizer.betas == (0.8, 0.95)


# --- random mutations ---------------------------------------------------------------------------------------------

yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**20) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12) | st.sampled_from(["in_order", "windowed", "custom", "weight_fifo", "tiny", "hf", "async"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=6,
)
paths = st.sampled_from(valid_paths()) | st.text(min_size=1, max_size=15)
override_texts = st.builds(lambda p, v: f"{p}={v}", paths, st.text(max_size=10)) | st.text(max_size=30)
BASE = yaml.safe_load(load_config(ROOT / "examples" / "addition_async.yaml").to_yaml())


def _mutate(data: dict, path: str, value: object, delete: bool) -> None:
    parts = path.split(".")
    node = data
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    if delete:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = value


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(paths, yaml_values, st.booleans()), min_size=1, max_size=6),
       st.lists(override_texts, max_size=3))
def test_random_mutations_give_a_config_or_a_config_error(mutations, overrides):
    data = yaml.safe_load(yaml.safe_dump(BASE))
    for path, value, delete in mutations:
        _mutate(data, path, value, delete)
    try:
        result = config_from_dict(data, overrides)
    except ConfigError as exc:
        assert exc.errors and all(isinstance(e, ConfigIssue) for e in exc.errors)
        str(exc)
    else:
        assert isinstance(result, RunConfig)
        assert config_from_dict(yaml.safe_load(result.to_yaml())) == result


# --- hygiene ------------------------------------------------------------------------------------------------------


def test_every_field_has_a_docstring():
    def walk(model, prefix):
        for name, field in model.model_fields.items():
            assert field.description and field.description.strip(), f"{prefix}{name} has no docstring"
            for sub in model_types(field.annotation):
                walk(sub, f"{prefix}{name}.")

    walk(RunConfig, "")
    assert "async.sampler.max_lookahead_versions" in dotted_paths(RunConfig)


def test_docs_match_the_schema():
    spec = importlib.util.spec_from_file_location("gen_config_docs", ROOT / "scripts" / "gen_config_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (ROOT / "docs" / "configs.md").read_text(encoding="utf-8") == module.render(), (
        "docs/configs.md is stale: run python scripts/gen_config_docs.py"
    )


def test_config_and_cli_import_without_torch():
    code = ("import sys, groupwise.config, groupwise.cli.main, groupwise.trainer.preflight; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")  # the preflight is what `config check` runs
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr or "groupwise.config imported torch"
