"""Commands on a run directory whose ``metrics.jsonl`` ends in a torn line (a run killed mid-write), as real
``groupwise`` processes.

Invariants pinned:
- ``groupwise compare`` reads the run, and says that the torn line was ignored in exactly one plain stderr line
  (also when it reads the run twice): no Python ``UserWarning``, no source line of groupwise's code;
- ``groupwise eval RUN_DIR`` ends (exit 0, its table printed) well within a timeout, and says when evaluating
  starts and ends (a phase line each), so minutes of evaluation on a busy core never look like a hang.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from groupwise.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
CONFIG = """\
model: {source: tiny, tiny: {num_layers: 1, hidden_size: 16, num_heads: 2, intermediate_size: 16,
                             max_position_embeddings: 32}}
run: {name: torn, output_dir: runs, max_steps: 1}
grpo: {num_prompts_per_step: 2, num_generations_per_prompt: 2, dynamic_sampling: {enabled: false}}
generation: {max_new_tokens: 4}
logging: {tensorboard: false, progress: false}
eval: {at_start: false, at_end: false}
data: {task: addition, addition: {num_eval: 4}}
"""


@pytest.fixture(scope="module")
def torn_run(tmp_path_factory) -> Path:
    """A finished one-step run (``final/`` written) whose metrics.jsonl then got a torn last line."""
    root = tmp_path_factory.mktemp("torn")
    (root / "config.yaml").write_text(CONFIG, encoding="utf-8")
    cwd = Path.cwd()
    os.chdir(root)
    try:
        assert main(["train", "config.yaml"]) == 0
    finally:
        os.chdir(cwd)
    run_dir = root / "runs" / "torn"
    with (run_dir / "metrics.jsonl").open("a", encoding="utf-8") as handle:
        handle.write('{"step": 2, "loss/to')
    return run_dir


def groupwise(*args: str, cwd: Path, timeout: float) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "groupwise.cli", *args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=timeout)  # fmt: skip
    return result, time.monotonic() - start


def test_the_torn_line_warning_is_one_plain_line(torn_run):
    result, _ = groupwise("compare", str(torn_run), str(torn_run), cwd=torn_run.parent, timeout=120)
    assert result.returncode == 0, result.stderr
    (line,) = result.stderr.splitlines()  # the same file read twice: said once
    assert line == (f"warning: {torn_run / 'metrics.jsonl'}: ignoring its torn last line 2 (20 characters cut "
                        "mid-write, e.g. by a killed run)")
    assert "UserWarning" not in result.stderr


def test_eval_on_a_torn_run_dir_ends_promptly_and_says_what_it_does(torn_run):
    result, seconds = groupwise("eval", str(torn_run), cwd=torn_run.parent, timeout=180)
    assert result.returncode == 0, result.stderr
    assert seconds < 90  # about 10 s on an idle core: model load, 4 greedy prompts, exit
    assert "greedy accuracy" in result.stdout
    assert "evaluating 4 held-out prompts ..." in result.stderr
    assert "evaluating 4 held-out prompts: done in" in result.stderr
    assert "Traceback" not in result.stderr and "UserWarning" not in result.stderr
