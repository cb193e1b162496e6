"""Chat-format data: JSONL rows holding ``messages`` are rendered by the tokenizer's chat template.

Invariants pinned:
- a run on chat rows renders each prompt with the chat template and the generation prompt, and
  ``train_data`` records that rendered prompt (``prompt_text``) for every trained row;
- chat rows with a tokenizer that has no chat template are a setup error before any run directory exists:
  ``groupwise train`` exits 2 naming the problem and the fix, without a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from groupwise.cli.main import main
from groupwise.config import config_from_dict
from groupwise.model import load_policy
from groupwise.runtime.sync_run import run_sync
from groupwise.trainer.builder import build_session

TINY = {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "max_position_embeddings": 48}
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


def chat_file(tmp_path: Path) -> Path:
    path = tmp_path / "chat.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"What is {a}+{b}?"}], "answer": a + b}
            for a, b in [(1, 2), (3, 4), (2, 2), (5, 1)]]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def chat_config(tmp_path: Path, model: dict) -> dict:
    return {
        "run": {"name": "chat", "output_dir": str(tmp_path / "runs"), "max_steps": 1},
        "model": model,
        "data": {"task": "jsonl", "jsonl": {"train_path": str(chat_file(tmp_path))}, "system_prompt": "Add."},
        "generation": {"max_new_tokens": 3},
        "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 2, "dynamic_sampling": {"enabled": False}},
        "logging": {"progress": False, "tensorboard": False},
        "eval": {"at_start": False, "at_end": False},
        "checkpoint": {"save_final": False},
    }


def test_chat_rows_are_rendered_by_the_template_and_recorded_in_train_data(tmp_path):
    policy = load_policy("tiny", tiny={"vocab": "full", **TINY}, seed=1, device="cpu")
    policy.tokenizer.chat_template = TEMPLATE
    policy.save(tmp_path / "instruct")
    model = {"source": "hf", "path": str(tmp_path / "instruct")}
    session = build_session(config_from_dict(chat_config(tmp_path, model)))
    run_sync(session)
    lines = (session.run_dir.path / "train_data" / "step_1.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == 4
    questions = {f"What is {a}+{b}?" for a, b in [(1, 2), (3, 4), (2, 2), (5, 1)]}
    for row in rows:
        text = row["prompt_text"]
        assert text.startswith("<bos>[system]Add.\n[user]") and text.endswith("?\n[assistant]")
        assert text[len("<bos>[system]Add.\n[user]") : -len("\n[assistant]")] in questions


def test_chat_rows_without_a_chat_template_are_a_setup_error(tmp_path, capsys):
    config = tmp_path / "chat.yaml"
    config.write_text(yaml.safe_dump(chat_config(tmp_path, {"source": "tiny", "tiny": TINY})), encoding="utf-8")
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert "4 train prompt(s)" in err and "no chat template" in err and "Traceback" not in err
    assert not (tmp_path / "runs" / "chat").exists()
