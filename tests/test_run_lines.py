"""What a run prints without a terminal: a line where each phase starts and ends, nothing from the libraries.

Invariants pinned:
- ``groupwise train`` on a GGUF model, its output piped (no terminal), prints to stderr a line when loading starts,
  what the GGUF cache did, a line when loading ends (with its time), and a start and an end line (with the
  prompt count and the accuracy) for the step-0 evaluation and the final one; stdout says when the first step
  starts and where each step ends; events.log holds the same phase lines. No progress bar (GGUF conversion,
  weight loading, shard writing), no FutureWarning (a LoRA run gets one from transformers) and no transformers
  warning reaches either stream;
- progress lines: a step that takes ``slow_step_s`` or longer gets its end line (with its time) and the next step
  a start line, whatever ``print_every`` says; fast steps keep the every-N rhythm;
- the CLI's quieting: the libraries' FutureWarnings are ignored while a user's own still show, and every switch
  it sets (bars, transformers' verbosity) leaves a value the user set alone.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import warnings
from pathlib import Path

import yaml
from rich.console import Console
from test_model_loading import _write_tiny_gguf

from groupwise.cli.main import quiet_library_output
from groupwise.model import build_char_tokenizer, build_tiny_model
from groupwise.run.progress import RunProgress

REPO = Path(__file__).resolve().parents[1]
LIBRARY_NOISE = ("it/s", "Converting and de-quantizing", "Loading weights", "Writing model shards", "Warning",
                 "warning", "[transformers]")  # fmt: skip


def gguf_run_config(tmp_path: Path, name: str) -> Path:
    tokenizer = build_char_tokenizer("task")
    model = build_tiny_model(1, 32, 2, 64, 64, vocab_size=len(tokenizer), seed=5)
    gguf = tmp_path / "tiny.gguf"
    if not gguf.exists():
        _write_tiny_gguf(gguf, model, tokenizer)
    config = {
        "run": {"name": name, "output_dir": str(tmp_path / "runs"), "max_steps": 2},
        # LoRA through peft: transformers warns a FutureWarning (is_gradient_checkpointing) on the way
        "model": {"source": "gguf", "path": str(tmp_path), "gguf_file": "tiny.gguf", "device": "cpu",
                  "lora": {"enabled": True, "rank": 2}},
        "data": {"task": "addition", "addition": {"num_eval": 8}},
        "generation": {"max_new_tokens": 4},
        "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 2, "dynamic_sampling": {"enabled": False}},
        "eval": {"num_prompts": 8},
        "logging": {"tensorboard": False, "train_data": False},
    }  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_gguf_run_without_a_terminal_prints_its_phases_and_nothing_from_the_libraries(tmp_path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("GROUPWISE_CACHE_DIR", str(cache))
    env = dict(os.environ)
    for switch in ("HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE", "TRANSFORMERS_VERBOSITY"):
        env.pop(switch, None)  # what a user's shell has: none of the switches the CLI sets
    config = gguf_run_config(tmp_path, "first")
    done = subprocess.run([sys.executable, "-m", "groupwise.cli", "train", str(config)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    err, out = done.stderr.splitlines(), done.stdout.splitlines()
    loading = f"loading the model (gguf {tmp_path / 'tiny.gguf'})"
    assert err[0] == f"{loading} ..."
    assert err[1].startswith("  dequantising tiny.gguf once; the float copy is cached in ") and str(cache) in err[1]
    assert err[2].startswith(f"{loading}: done in ")
    assert err[3] == "evaluating 8 held-out prompts at step 0 ..."
    assert err[4].startswith("evaluating 8 held-out prompts at step 0: done in ") and "(eval/accuracy=" in err[4]
    assert err[5] == "evaluating 8 held-out prompts at step 2 ..."
    assert err[6].startswith("evaluating 8 held-out prompts at step 2: done in ")
    assert len(err) == 7, "\n".join(err)
    assert out[0] == "step 1/2 started"
    assert out[1].startswith("step 2/2 reward ")
    assert out[2].startswith("run first (sync) finished: 2 steps")
    for noise in LIBRARY_NOISE:
        assert noise not in done.stderr and noise not in done.stdout, noise
    events = (tmp_path / "runs" / "first" / "events.log").read_text()
    assert "evaluating 8 held-out prompts at step 0 ..." in events
    assert "evaluating 8 held-out prompts at step 2: done in " in events



def test_slow_steps_print_where_each_starts_and_ends() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=300)
    seconds = {1: 0.5, 2: 0.5, 3: 42.0, 4: 75.0, 5: 0.5}
    with RunProgress(6, print_every=5, slow_step_s=10.0, console=console, clock=lambda: 0.0) as progress:
        for step, took in seconds.items():
            progress.update(step, {"perf/step_seconds": took})
    heads = [line.split(" reward")[0] for line in out.getvalue().splitlines()]
    assert heads == ["step 1/6 started", "step 3/6 in 0:00:42", "step 4/6 started", "step 4/6 in 0:01:15",
                     "step 5/6 started", "step 5/6"]  # fmt: skip


def test_the_cli_quiets_the_libraries_but_not_the_user(monkeypatch) -> None:
    for switch in ("HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE"):
        monkeypatch.delenv(switch, raising=False)
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")  # the user's own choice
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        quiet_library_output()
        for module in ("transformers.generation.utils", "torch.nn.modules.module", "peft.tuners.lora", "my_reward"):
            warnings.warn_explicit("this will change", FutureWarning, "somewhere.py", 1, module=module)
        warnings.warn_explicit("this is deprecated", DeprecationWarning, "x.py", 1, module="my_reward")
    assert [(w.category, w.filename) for w in shown] == [(FutureWarning, "somewhere.py"), (DeprecationWarning, "x.py")]
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" and os.environ["TQDM_DISABLE"] == "1"
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "info"
