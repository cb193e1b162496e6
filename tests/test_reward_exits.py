"""A reward function that leaves through ``SystemExit`` (or any ``BaseException`` but ``KeyboardInterrupt``) ends
the run as a failure, never as a success.

Invariants pinned, through ``groupwise train`` in process (``main``), sync and async:
- a verifier that calls ``sys.exit(0)`` makes ``train`` exit 1 (not 0, having trained nothing), with
  ``RewardError`` and the function's name on stderr, and ``events.log`` saying the run failed; so does one raising
  another ``BaseException``;
- a reward module that calls ``sys.exit()`` while it is imported is refused by ``config check`` (exit 2, naming
  ``reward.function``), not a silent exit of the command.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from groupwise.cli.main import main

TINY_MODEL = ("{source: tiny, tiny: {num_layers: 1, hidden_size: 16, num_heads: 2, intermediate_size: 16, "
              "max_position_embeddings: 32}}")
REWARDS = '''
import sys


class Escape(BaseException):
    pass


def exits(prompt, completion):
    sys.exit(0)


def escapes(prompt, completion):
    raise Escape("a BaseException of its own")
'''


def write_config(tmp_path: Path, reward: str, mode: str = "sync") -> Path:
    (tmp_path / "leaving_rewards.py").write_text(textwrap.dedent(REWARDS), encoding="utf-8")
    text = (
        f"mode: {mode}\n"
        f"model: {TINY_MODEL}\n"
        f"run: {{name: t, output_dir: {tmp_path / 'runs'}, max_steps: 2}}\n"
        "data: {task: addition, addition: {num_eval: 4}}\n"
        "grpo: {num_prompts_per_step: 2, num_generations_per_prompt: 2, dynamic_sampling: {enabled: false}}\n"
        "generation: {max_new_tokens: 4}\n"
        "logging: {tensorboard: false, progress: false}\n"
        "eval: {at_start: false, at_end: false}\n"
        "checkpoint: {save_final: false}\n"
        f"reward: {{function: 'leaving_rewards:{reward}'}}\n"
    )
    if mode == "async":
        text += "async: {rollout_failure: {backoff_base_s: 0, max_backoff_s: 0}}\n"
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


CASES = [("sync", "exits", "SystemExit"), ("async", "exits", "SystemExit"), ("sync", "escapes", "Escape")]


@pytest.mark.parametrize(("mode", "reward", "raised"), CASES)
def test_a_reward_calling_sys_exit_0_fails_the_run_with_exit_1_naming_it(tmp_path, capsys, monkeypatch, mode, reward,
                                                                          raised):
    monkeypatch.syspath_prepend(str(tmp_path))
    config = write_config(tmp_path, reward, mode)
    code = main(["train", str(config)])
    out, err = capsys.readouterr()
    assert code == 1, (out, err)
    assert "RewardError" in err and f"'{reward}' raised {raised}" in err, err
    assert "Traceback" not in err
    events = (tmp_path / "runs" / "t" / "events.log").read_text(encoding="utf-8")
    assert "run failed: " in events


def test_a_reward_module_exiting_at_import_is_refused_naming_it(tmp_path, capsys, monkeypatch):
    (tmp_path / "exits_at_import.py").write_text("import sys\nsys.exit(0)\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = write_config(tmp_path, "exits")
    config.write_text(config.read_text().replace("leaving_rewards:exits", "exits_at_import:score"))
    assert main(["config", "check", str(config)]) == 2
    err = capsys.readouterr().err
    assert "reward.function" in err and "SystemExit" in err and "Traceback" not in err
