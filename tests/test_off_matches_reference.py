"""With continuous batching and partial rollouts off (the defaults), a run is bit for bit what the reference sources
give: the same tokens, logprobs, rewards, advantages, fates and metrics.

Opt-in: set ``GROUPWISE_REFERENCE_SRC`` to the ``src`` directory of another checkout (e.g. the main branch, from
``git archive main src | tar -x -C /tmp/ref``) and run this module; it is skipped otherwise. Both trees run the
same config in subprocesses on this machine (same kernels, same thread count), so the comparison is exact; only
wall-clock fields (timestamps, seconds, rates) are left out.

Invariants pinned (against the reference tree):
- a sync run with dynamic sampling: every ``train_data`` row, every ``fates.jsonl`` line and every metric that is
  not a time are identical;
- an async embedded run (``in_order`` without lookahead, one group per engine call, so neither the versions nor
  the batch shapes depend on timing): the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REFERENCE = os.environ.get("GROUPWISE_REFERENCE_SRC")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not REFERENCE, reason="set GROUPWISE_REFERENCE_SRC to a reference checkout's src directory"),
]

TESTS_DIR = Path(__file__).parent
OURS = TESTS_DIR.parent / "src"
TIME_WORDS = ("seconds", "per_s", "idle_fraction", "time")


def base_config(root: Path, name: str) -> dict:
    return {
        "run": {"name": name, "output_dir": str(root), "seed": 3, "max_steps": 3},
        "model": {"source": "tiny", "tiny": {"num_layers": 1, "hidden_size": 32, "num_heads": 2,
                                             "intermediate_size": 64, "max_position_embeddings": 32}},
        "data": {"task": "addition", "addition": {"min_digits": 1, "max_digits": 2, "num_eval": 8}},
        "generation": {"max_new_tokens": 4},
        "grpo": {"num_prompts_per_step": 4, "num_generations_per_prompt": 4},
        "reward": {"function": "scripted_rewards:marker_reward"},
        "logging": {"progress": False, "tensorboard": False},
        "eval": {"at_start": False, "at_end": True, "num_prompts": 8},
        "checkpoint": {"save_final": False},
    }  # fmt: skip


def sync_config(root: Path, name: str) -> dict:
    data = base_config(root, name)
    data["grpo"]["dynamic_sampling"] = {"max_gen_rounds": 6, "min_step_batch_fraction": 0.25}
    return data


def async_config(root: Path, name: str) -> dict:
    data = base_config(root, name)
    data["mode"] = "async"
    data["generation"]["micro_batch_groups"] = 1
    data["async"] = {"sampler": {"name": "in_order", "max_lookahead_versions": 0}, "max_inflight_prompts": 8,
                     "max_buffered_rollouts": 8,
                     "rollout_failure": {"replacement_reserve_prompts": 4, "max_replacement_attempts": 8}}  # fmt: skip
    return data


def train(src: str, data: dict, root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{data['run']['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, str(TESTS_DIR)]), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-m", "groupwise.cli", "train", str(path)], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return root / data["run"]["name"]


def timeless(value):
    """``value`` without the fields that measure wall-clock time."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if not any(word in k for word in TIME_WORDS)}
    if isinstance(value, list):
        return [timeless(v) for v in value]
    return value


def contents(run_dir: Path) -> dict[str, list]:
    out = {}
    for name in ["metrics.jsonl", "fates.jsonl", *sorted(p.relative_to(run_dir).as_posix()
                                                          for p in run_dir.glob("train_data/*.jsonl"))]:  # fmt: skip
        lines = [json.loads(line) for line in (run_dir / name).read_text().splitlines() if line.strip()]
        out[name] = timeless(lines)
    return out


@pytest.mark.parametrize("make", [sync_config, async_config], ids=["sync", "async"])
def test_the_default_run_is_the_reference_run(tmp_path, make):
    ours = contents(train(str(OURS), make(tmp_path / "ours", "run"), tmp_path / "ours"))
    theirs = contents(train(REFERENCE, make(tmp_path / "ref", "run"), tmp_path / "ref"))
    assert ours.keys() == theirs.keys()
    assert any(name.startswith("train_data/") for name in ours)
    for name in ours:
        assert ours[name] == theirs[name], name
