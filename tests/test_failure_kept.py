"""A failed run says what it kept, and which trained steps are not kept.

Invariants pinned, through ``groupwise train`` in process (``main``) on a sync tiny run whose verifier breaks in
a chosen step (4 reward calls a step):
- stderr names the newest complete checkpoint (or says there is none) and how to continue (``--resume``);
- the steps ``metrics.jsonl`` records after that checkpoint are named as not kept (a resume trains them again),
  counted from the metrics file, with ``checkpoint.every`` as the fix; with none after it, nothing is said of them;
- ``--resume`` from the kept checkpoint then trains those steps again and the run finishes: metrics hold each step
  once.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from groupwise.cli.main import main

TINY_MODEL = ("{source: tiny, tiny: {num_layers: 1, hidden_size: 16, num_heads: 2, intermediate_size: 16, "
              "max_position_embeddings: 32}}")
REWARD = '''
import os

CALLS = []


def breaks_in_step(prompt, completion):
    """1.0 for an even-length completion; raises from the first call of step BREAK_STEP on (4 calls a step)."""
    CALLS.append(1)
    step = os.environ.get("BREAK_STEP")
    if step and len(CALLS) > 4 * (int(step) - 1):
        raise ValueError("the verifier broke")
    return float(len(completion.text) % 2 == 0)
'''


def write_config(tmp_path: Path, every: int) -> Path:
    (tmp_path / "breaking_reward.py").write_text(textwrap.dedent(REWARD), encoding="utf-8")
    path = tmp_path / "config.yaml"
    path.write_text(
        f"model: {TINY_MODEL}\n"
        f"run: {{name: t, output_dir: {tmp_path / 'runs'}, max_steps: 6}}\n"
        "data: {task: addition, addition: {num_eval: 4}}\n"
        "grpo: {num_prompts_per_step: 2, num_generations_per_prompt: 2, dynamic_sampling: {enabled: false}}\n"
        "generation: {max_new_tokens: 4}\n"
        "logging: {tensorboard: false, progress: false}\n"
        "eval: {at_start: false, at_end: false}\n"
        f"checkpoint: {{every: {every}, save_final: false}}\n"
        "reward: {function: 'breaking_reward:breaks_in_step'}\n",
        encoding="utf-8",
    )
    return path


def metric_steps(tmp_path: Path) -> list[int]:
    lines = (tmp_path / "runs" / "t" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["step"] for line in lines]


@pytest.mark.parametrize(
    ("every", "break_step", "kept", "lost"),
    [(2, 4, "step_2", "step 3 trained after it is not kept: a resume trains it again"),
     (0, 4, "no complete checkpoint", "steps 1–3 trained are not kept: a resume trains them again"),
     (2, 3, "step_2", None)],
)  # fmt: skip
def test_a_failed_run_names_its_checkpoint_and_the_steps_a_resume_trains_again(
    tmp_path, capsys, monkeypatch, every, break_step, kept, lost
):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "breaking_reward", raising=False)  # each case counts its calls from 0
    monkeypatch.setenv("BREAK_STEP", str(break_step))
    config = write_config(tmp_path, every)
    assert main(["train", str(config)]) == 1
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if line.startswith("kept: ")]
    assert kept in line and "(resume with --resume)" in line, err
    assert metric_steps(tmp_path) == list(range(1, break_step))
    if lost is None:
        assert "not kept" not in line
        return
    assert lost in line and line.endswith("again (checkpoint.every saves more often)")
    if every:  # the kept checkpoint resumes: the lost step is trained again, once
        monkeypatch.delenv("BREAK_STEP")
        assert main(["train", str(config), "--resume"]) == 0
        assert metric_steps(tmp_path) == list(range(1, 7))
