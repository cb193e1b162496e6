"""What ``train`` would refuse or fail on is found by ``config check`` already (exit 2, the key named, no traceback,
no run directory), and the commands that read a run directory never print a traceback for a bad one.

Invariants pinned, each through ``groupwise config check`` and (where it matters) ``groupwise train`` in process:
- JSONL: a line nested 100,000 deep and a prompt with a lone surrogate (``"1+1=\\ud800"``) are bad lines named
  with the file and line, at ``config check`` (before: a ``RecursionError`` traceback, and a pass that crashed
  ``train`` in the tokenizer);
- reward kwargs a built-in verifier rejects on its first call (``exact_numeric`` with ``partial_credit: 5.0``)
  name ``reward.kwargs``; answers a numeric reward cannot read (a word, 100,000 digits) are listed with their uids;
  a ``module:function`` reward is never called by the check (it may count or pay per call);
- ``run.output_dir`` under /proc names ``run.output_dir``; ``model.device: cuda`` on a machine without CUDA (with
  or without ``generation.cuda_graphs: on``) names ``model.device``, never ``model.path``;
- a model folder whose ``config.json`` is not JSON names ``model.path``; one whose ``config.json`` or
  ``tokenizer_config.json`` has ``auto_map`` (custom code) names ``model.trust_remote_code`` until it is true;
- loading such a folder never asks on the terminal and never runs its code: transformers gets
  ``trust_remote_code=False`` (a user answering "y" to the prompt used to run the folder's code);
- resuming a run whose newest checkpoint is past the new ``run.max_steps`` is refused naming ``run.max_steps``, the
  checkpoint's step and what to do (before: ``ValueError: start step must be within 0..1, got 2``);
- ``audit``, ``report`` and ``compare`` on a run directory whose ``config.yaml`` is not YAML, and ``report`` on a
  directory that is not a run, exit 2 with one message.
"""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest
import torch

from groupwise.cli.main import main
from groupwise.model.loading import load_policy

TINY_MODEL = ("{source: tiny, tiny: {num_layers: 1, hidden_size: 16, num_heads: 2, intermediate_size: 16, "
              "max_position_embeddings: 32}}")


def write_config(tmp_path: Path, extra: str = "", *, data: str | None = None, model: str = TINY_MODEL,
                 run: str = "") -> Path:  # fmt: skip
    text = (
        f"model: {model}\n"
        f"run: {{name: t, output_dir: {tmp_path / 'runs'}, max_steps: 1{run}}}\n"
        "grpo: {num_prompts_per_step: 2, num_generations_per_prompt: 2, dynamic_sampling: {enabled: false}}\n"
        "generation: {max_new_tokens: 4}\n"
        "logging: {tensorboard: false, progress: false}\n"
        "eval: {at_start: false, at_end: false}\n"
        "checkpoint: {every: 1, save_final: false}\n"
        + (data if data is not None else "data: {task: addition, addition: {num_eval: 4}}\n")
        + extra
    )
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def refused(args: list[str], capsys, *words: str) -> str:
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert "Traceback" not in err + out
    for word in words:
        assert word in err, (word, err)
    return err


def check_and_train_refuse(config: Path, tmp_path: Path, capsys, *words: str, overrides: tuple[str, ...] = ()) -> str:
    refused(["config", "check", str(config), *overrides], capsys, *words)
    err = refused(["train", str(config), *overrides], capsys, *words)
    assert not (tmp_path / "runs").exists()
    return err


def jsonl_data(tmp_path: Path, lines: list[str]) -> str:
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return f"data: {{task: jsonl, jsonl: {{train_path: {path}}}}}\n"


GOOD = [json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) for i in range(4)]


# --- data --------------------------------------------------------------------------------------------------------


def test_a_deeply_nested_line_and_a_lone_surrogate_are_bad_lines_at_check(tmp_path, capsys):
    lines = [*GOOD, "[" * 100_000 + "]" * 100_000, '{"prompt": "1+1=\\ud800", "answer": "2"}']
    config = write_config(tmp_path, data=jsonl_data(tmp_path, lines))
    err = check_and_train_refuse(config, tmp_path, capsys, "data.jsonl.train_path", str(tmp_path / "train.jsonl"),
                                 "2 bad line(s)")
    assert "line 5: nested deeper than 64 levels" in err
    assert "line 6: a lone surrogate escape (\\ud800) in field 'prompt'" in err


def test_answers_a_numeric_reward_cannot_read_are_listed_at_check(tmp_path, capsys):
    lines = [*GOOD, json.dumps({"prompt": "2+2=", "answer": "four", "id": "word"}),
             json.dumps({"prompt": "3+3=", "answer": "6" * 100_000, "id": "digits"})]
    config = write_config(tmp_path, data=jsonl_data(tmp_path, lines))
    err = check_and_train_refuse(config, tmp_path, capsys, "data.jsonl.train_path", "2 train prompt(s)",
                                 "word: ValueError", "digits: ValueError", "not a plain number")
    assert "exact_numeric" in err


# --- the reward --------------------------------------------------------------------------------------------------


def test_reward_kwargs_the_reward_rejects_on_its_first_call_are_refused_at_check(tmp_path, capsys):
    config = write_config(tmp_path, "reward: {function: exact_numeric, kwargs: {partial_credit: 5.0}}\n")
    check_and_train_refuse(config, tmp_path, capsys, "reward.kwargs", "partial_credit=5.0 must be in [0, 1]")
    assert main(["config", "check", str(config), "reward.kwargs.partial_credit=0.5"]) == 0


def test_a_custom_reward_is_not_called_by_the_check(tmp_path, capsys, monkeypatch):
    (tmp_path / "counting_rewards.py").write_text(
        "CALLS = []\n\ndef counted(prompt, completion):\n    CALLS.append(prompt.uid)\n    return 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = write_config(tmp_path, "reward: {function: 'counting_rewards:counted'}\n")
    assert main(["config", "check", str(config)]) == 0
    import counting_rewards

    assert counting_rewards.CALLS == []


# --- where the run goes and what runs it -------------------------------------------------------------------------


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_an_output_dir_under_proc_is_refused_at_check(tmp_path, capsys):
    config = write_config(tmp_path)
    refused(["config", "check", str(config), "run.output_dir=/proc/groupwise-runs"], capsys, "run.output_dir",
            "cannot be written")
    refused(["train", str(config), "run.output_dir=/proc/groupwise-runs"], capsys, "run.output_dir")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("graphs", ["auto", "on"])
def test_model_device_cuda_without_cuda_names_the_device(tmp_path, capsys, graphs):
    config = write_config(tmp_path)
    overrides = ("model.device=cuda", f"generation.cuda_graphs={graphs}")
    err = check_and_train_refuse(config, tmp_path, capsys, "model.device", "cuda", overrides=overrides)
    assert "model.path" not in err and "model.tiny" not in err


# --- model folders -----------------------------------------------------------------------------------------------


def hf_folder(tmp_path: Path, config_text: str, tokenizer_config: dict | None = None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(config_text, encoding="utf-8")
    if tokenizer_config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")
    return folder


def test_a_model_folder_whose_config_json_is_not_json_is_refused_at_check(tmp_path, capsys):
    folder = hf_folder(tmp_path, '{"model_type": "llama", ')
    config = write_config(tmp_path, model=f"{{source: hf, path: {folder}}}")
    check_and_train_refuse(config, tmp_path, capsys, "model.path", "config.json is not readable JSON")


CUSTOM_CONFIG = """
import os
from pathlib import Path

Path(os.environ["GROUPWISE_REMOTE_CODE_MARKER"]).write_text("the folder's code ran")

from transformers import PretrainedConfig


class CustomConfig(PretrainedConfig):
    model_type = "groupwise_custom"
"""


def custom_code_folder(tmp_path: Path, in_tokenizer: bool = False) -> Path:
    auto_map = {"AutoConfig": "configuration_custom.CustomConfig",
                "AutoModelForCausalLM": "modeling_custom.CustomModel"}  # fmt: skip
    model_config = {"model_type": "groupwise_custom", **({} if in_tokenizer else {"auto_map": auto_map})}
    tokenizer = {"auto_map": {"AutoTokenizer": ["tokenization_custom.T", None]}} if in_tokenizer else None
    folder = hf_folder(tmp_path, json.dumps(model_config), tokenizer)
    (folder / "configuration_custom.py").write_text(CUSTOM_CONFIG, encoding="utf-8")
    return folder


@pytest.mark.parametrize("in_tokenizer", [False, True], ids=["config.json", "tokenizer_config.json"])
def test_a_folder_with_custom_code_is_refused_until_trust_remote_code_is_true(tmp_path, capsys, in_tokenizer):
    folder = custom_code_folder(tmp_path, in_tokenizer)
    config = write_config(tmp_path, model=f"{{source: hf, path: {folder}}}")
    err = check_and_train_refuse(config, tmp_path, capsys, "model.trust_remote_code", "auto_map")
    assert ("tokenizer_config.json" in err) == in_tokenizer
    assert main(["config", "check", str(config), "model.trust_remote_code=true"]) == 0
    capsys.readouterr()
    refused(["config", "check", str(write_config(tmp_path)), "model.trust_remote_code=true"], capsys,
            "model.trust_remote_code", "no effect with model.source 'tiny'")


def test_loading_a_custom_code_folder_never_asks_and_never_runs_its_code(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    monkeypatch.setenv("GROUPWISE_REMOTE_CODE_MARKER", str(marker))
    asked: list[str] = []

    def a_user_who_says_yes(question: str = "") -> str:
        asked.append(question)
        return "y"

    monkeypatch.setattr(builtins, "input", a_user_who_says_yes)
    folder = custom_code_folder(tmp_path)
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_policy("hf", folder, device="cpu")
    assert asked == [] and not marker.exists()


# --- resuming and reading run directories -------------------------------------------------------------------------


def test_resuming_past_the_new_max_steps_says_what_to_do(tmp_path, capsys):
    config = write_config(tmp_path)
    assert main(["train", str(config), "run.max_steps=2"]) == 0
    capsys.readouterr()
    err = refused(["train", str(config), "run.max_steps=1", "--resume"], capsys, "run.max_steps",
                  "step_2 (step 2)", "past run.max_steps = 1", "set run.max_steps to 2 or more", "--resume-from")
    assert "start step must be within" not in err


def fake_run_dir(tmp_path: Path, config_text: str) -> Path:
    run = tmp_path / "runs" / "broken"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(config_text, encoding="utf-8")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss/total": 0.5}) + "\n", encoding="utf-8")
    (run / "fates.jsonl").write_text("", encoding="utf-8")
    return run


@pytest.mark.parametrize("command", ["audit", "report", "compare"])
def test_a_run_dir_whose_config_yaml_is_not_yaml_is_one_message(tmp_path, capsys, command):
    run = fake_run_dir(tmp_path, "run: {name: [\n")
    refused([command, str(run)], capsys, "config.yaml", "not valid YAML")


def test_report_on_a_directory_that_is_not_a_run_is_one_message(tmp_path, capsys):
    refused(["report", str(tmp_path)], capsys, "has no metrics.jsonl")
