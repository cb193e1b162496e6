"""Wrong input is refused before any work, in one message: ``config check`` finds it, ``train`` refuses it first.

Invariants pinned here, each for ``groupwise config check`` and ``groupwise train`` (in process, through ``main``):
- exit code 2 within seconds, the key named in the message, no Python traceback, and no run directory left;
- a reward module that does not import; a misspelled ``reward.kwargs`` key (named with the closest key the
  function takes); a JSONL train file with malformed lines (every bad line listed with its number and reason,
  and an empty prompt is one); ``model.path`` relative to another working directory (the message names the
  directory it was resolved against; no Hugging Face Hub fallback); more prompts per round than the dataset holds;
- setup errors: ``run.output_dir`` a file or unwritable, ``--resume-from`` something that is not a complete
  checkpoint, ``data.addition.max_digits: 4``, a 2^64 seed, a NUL byte or 300 characters in ``run.name``;
- prompts are checked against the loaded model: one longer than the model's positions is refused naming its uid,
  one of only special tokens (BOS alone) is refused, characters the tokenizer maps to ``<unk>`` are counted and
  reported in events.log while the run goes on;
- a real ``groupwise`` process behaves the same (exit 2, no "Traceback"), e.g. for the shipped example run from
  outside the repository.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from groupwise.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL = ("{source: tiny, tiny: {num_layers: 1, hidden_size: 16, num_heads: 2, intermediate_size: 16, "
              "max_position_embeddings: 32}}")


def write_config(tmp_path: Path, extra: str = "", *, data: str | None = None, run: str = "name: t",
                 model: str = TINY_MODEL) -> Path:
    """A tiny sync config; ``run`` is the inside of the run mapping (``output_dir`` defaults to ``tmp_path/runs``),
    ``extra`` YAML lines are appended."""
    if "output_dir" not in run:
        run = f"{run}, output_dir: {tmp_path / 'runs'}"
    text = (
        f"model: {model}\n"
        f"run: {{max_steps: 1, {run}}}\n"
        "grpo: {num_prompts_per_step: 2, num_generations_per_prompt: 2, dynamic_sampling: {enabled: false}}\n"
        "generation: {max_new_tokens: 4}\n"
        "logging: {tensorboard: false, progress: false}\n"
        "eval: {at_start: false, at_end: false}\n"
        "checkpoint: {save_final: false}\n"
        + (data if data is not None else "data: {task: addition, addition: {num_eval: 4}}\n")
        + extra
    )
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def refused(args: list[str], capsys, *keys: str, within_s: float = 10) -> str:
    """Run the CLI; assert exit 2 within ``within_s``, every key named, no traceback; return stderr."""
    start = time.monotonic()
    code = main(args)
    seconds = time.monotonic() - start
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert seconds < within_s, f"refusal took {seconds:.1f} s"
    assert "Traceback" not in err and "Traceback" not in out
    for key in keys:
        assert key in err, (key, err)
    return err


def check_and_train_refuse(config: Path, tmp_path: Path, capsys, *keys: str, overrides: tuple[str, ...] = ()) -> str:
    """Both commands refuse with the keys named; train leaves no run directory."""
    refused(["config", "check", str(config), *overrides], capsys, *keys)
    err = refused(["train", str(config), *overrides], capsys, *keys)
    assert not (tmp_path / "runs").exists(), list((tmp_path / "runs").rglob("*"))
    return err


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- the reward --------------------------------------------------------------------------------------------------


def test_a_reward_module_that_does_not_import_is_refused(tmp_path, capsys):
    config = write_config(tmp_path, "reward: {function: 'mytask.rewardz:fn'}\n")
    err = check_and_train_refuse(config, tmp_path, capsys, "reward.function", "mytask.rewardz")
    assert "No module named 'mytask'" in err


def test_a_misspelled_reward_kwarg_is_refused_naming_the_closest_key(tmp_path, capsys):
    config = write_config(tmp_path, "reward: {function: exact_numeric, kwargs: {partial_credt: 0.5}}\n")
    err = check_and_train_refuse(config, tmp_path, capsys, "reward.kwargs", "'partial_credt'")
    assert "did you mean 'partial_credit'?" in err


# --- data --------------------------------------------------------------------------------------------------------


def test_every_bad_jsonl_line_is_listed_with_its_reason(tmp_path, capsys):
    good = json.dumps({"prompt": "1+1=", "answer": "2"})
    train = write_jsonl(tmp_path / "train.jsonl", [
        good, '{"prompt": "2+2=", "answer": 4', good, json.dumps({"prompt": "  ", "answer": "0"}), good,
        json.dumps({"answer": "1"}),
    ])
    config = write_config(tmp_path, data=f"data: {{task: jsonl, jsonl: {{train_path: {train}}}}}\n")
    err = check_and_train_refuse(config, tmp_path, capsys, "data.jsonl.train_path", "3 bad line(s)")
    assert "line 2: invalid JSON" in err
    assert "line 4: 'prompt' is empty" in err
    assert "line 6: needs exactly one of 'prompt'" in err


def test_a_missing_jsonl_file_names_the_directory_it_was_resolved_against(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, data="data: {task: jsonl, jsonl: {train_path: data/train.jsonl}}\n")
    check_and_train_refuse(config, tmp_path, capsys, "data.jsonl.train_path", f"working directory {tmp_path}",
                           str(tmp_path / "data" / "train.jsonl"))


def test_more_prompts_per_round_than_the_dataset_holds_is_refused_with_the_numbers(tmp_path, capsys):
    train = write_jsonl(tmp_path / "train.jsonl", [json.dumps({"prompt": f"{i}+0=", "answer": i}) for i in range(5)])
    config = write_config(tmp_path, data=f"data: {{task: jsonl, jsonl: {{train_path: {train}}}}}\n")
    err = check_and_train_refuse(config, tmp_path, capsys, "grpo.num_prompts_per_step", "holds only 5 prompts",
                                 overrides=("grpo.num_prompts_per_step=8",))
    assert "8 prompts per generation round" in err
    # with dynamic sampling a round takes ceil(P × batch_multiplier): 4 × 1.5 = 6 > 5
    err = check_and_train_refuse(config, tmp_path, capsys, "grpo.num_prompts_per_step", overrides=(
        "grpo.num_prompts_per_step=4", "grpo.dynamic_sampling={enabled: true, batch_multiplier: 1.5}"))
    assert "6 prompts per generation round" in err
    assert main(["config", "check", str(config), "grpo.num_prompts_per_step=5"]) == 0


def test_addition_digits_beyond_3_are_refused_at_check(tmp_path, capsys):
    config = write_config(tmp_path)
    check_and_train_refuse(config, tmp_path, capsys, "data.addition.max_digits", overrides=(
        "data.addition.max_digits=4",))


# --- the model ---------------------------------------------------------------------------------------------------


def test_a_model_path_relative_to_another_directory_is_refused_fast_naming_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    example = ROOT / "examples" / "addition.yaml"
    overrides = (f"run.output_dir={tmp_path / 'runs'}",)
    err = check_and_train_refuse(example, tmp_path, capsys, "model.path", "models/addition-tiny",
                                 f"working directory {tmp_path}", overrides=overrides)
    assert "Hugging Face cache" in err


def test_a_directory_that_is_not_a_model_is_refused(tmp_path, capsys):
    (tmp_path / "not-a-model").mkdir()
    config = write_config(tmp_path, model=f"{{source: hf, path: {tmp_path / 'not-a-model'}}}")
    check_and_train_refuse(config, tmp_path, capsys, "model.path", "has no config.json")


def test_a_prompt_longer_than_the_model_positions_is_refused_naming_it(tmp_path, capsys):
    train = write_jsonl(tmp_path / "train.jsonl", [
        json.dumps({"prompt": "1+1=", "answer": "2"}), json.dumps({"prompt": "1" * 2001, "answer": "1", "id": "long"}),
        json.dumps({"prompt": "2+2=", "answer": "4"}),
    ])
    config = write_config(tmp_path, data=f"data: {{task: jsonl, jsonl: {{train_path: {train}}}}}\n")
    assert main(["config", "check", str(config)]) == 0  # the model's positions are known once it is loaded
    # after the model loaded (the first torch import of a process can take long on a busy machine)
    err = refused(["train", str(config)], capsys, "data.jsonl.train_path", "long (2002 tokens)", "32 positions",
                  within_s=120)
    assert "1 train prompt(s)" in err
    assert not (tmp_path / "runs").exists()


def test_unknown_characters_are_counted_and_reported_and_the_run_goes_on(tmp_path, capsys, caplog):
    lines = [json.dumps({"prompt": f"{i}+1=", "answer": i + 1}) for i in range(3)]
    lines.append(json.dumps({"prompt": "1+1=\u00e9\u00df", "answer": "2", "id": "accents"}))
    train = write_jsonl(tmp_path / "train.jsonl", lines)
    config = write_config(tmp_path, data=f"data: {{task: jsonl, jsonl: {{train_path: {train}}}}}\n")
    assert main(["train", str(config)]) == 0
    events = (tmp_path / "runs" / "t" / "events.log").read_text(encoding="utf-8")
    for text in (caplog.text, events):  # a logged warning: stderr of the groupwise command
        assert "1 of 4 train prompts hold characters the tokenizer maps to its unknown token" in text
        assert "accents" in text and "'é', 'ß'" in text


# --- setup -------------------------------------------------------------------------------------------------------


def test_an_output_dir_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "runs").write_text("not a directory\n")
    config = write_config(tmp_path)
    refused(["config", "check", str(config)], capsys, "run.output_dir", "is a file")
    refused(["train", str(config)], capsys, "run.output_dir", "is a file")
    assert (tmp_path / "runs").read_text() == "not a directory\n"


def test_an_unwritable_output_dir_is_refused(tmp_path, capsys, monkeypatch):
    parent = tmp_path / "readonly"
    parent.mkdir()
    config = write_config(tmp_path, run=f"name: t, output_dir: {parent / 'runs'}")
    if os.geteuid() == 0:  # root writes anywhere: let the permission check see what a user would
        import groupwise.run.rundir as rundir

        monkeypatch.setattr(rundir.os, "access", lambda path, mode: Path(path) != parent)
    else:
        parent.chmod(0o555)
    try:
        refused(["config", "check", str(config)], capsys, "run.output_dir", "is not writable", str(parent))
        refused(["train", str(config)], capsys, "run.output_dir", "is not writable")
    finally:
        parent.chmod(0o755)
    assert list(parent.iterdir()) == []


def test_resume_from_something_that_is_not_a_complete_checkpoint_is_refused(tmp_path, capsys):
    config = write_config(tmp_path)
    refused(["train", str(config), "--resume-from", str(tmp_path / "absent")], capsys, "--resume-from",
            "is not a directory")
    partial = tmp_path / "step_3"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    refused(["train", str(config), "--resume-from", str(partial)], capsys, "--resume-from", "no COMPLETE marker")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("run", "key", "rule"),
    [
        ("seed: 18446744073709551616", "run.seed", "≤ 9223372036854775807"),
        ('name: "a\\0b"', "run.name", "control characters"),
        (f"name: {'x' * 300}", "run.name", "at most 255 bytes"),
        ("name: ' padded'", "run.name", "spaces"),
        ('output_dir: "runs\\0x"', "run.output_dir", "NUL"),
    ],
    ids=["seed-2^64", "nul-name", "300-char-name", "padded-name", "nul-output-dir"],
)
def test_bad_names_seeds_and_paths_are_one_message(tmp_path, capsys, run, key, rule):
    check_and_train_refuse(write_config(tmp_path, run=run), tmp_path, capsys, key, rule)


# --- a real process ----------------------------------------------------------------------------------------------


def test_a_real_groupwise_process_exits_2_without_a_traceback(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "groupwise.cli", "train", str(ROOT / "examples" / "addition.yaml"),
               f"run.output_dir={tmp_path / 'runs'}"]
    start = time.monotonic()
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - start < 30
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "model.path" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_a_prompt_with_no_content_is_refused_by_the_prompt_checks():
    from groupwise.model.encode import encode_prompt
    from groupwise.model.tokenizer import build_char_tokenizer
    from groupwise.trainer.prompt_checks import check_prompts
    from groupwise.types import Prompt

    tokenizer = build_char_tokenizer("task")
    prompts = [Prompt(uid="empty", answer="1", text=""), Prompt(uid="ok", answer="2", text="1+1=")]
    report = check_prompts(lambda p: encode_prompt(tokenizer, p), tokenizer, 32, 4, {"train": ("data.x", prompts)})
    (issue,) = report.issues
    assert issue.path == "data.x" and "empty (only special tokens: 1)" in issue.rule and "BOS alone" in issue.rule
    assert report.notes == []
