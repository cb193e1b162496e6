"""One job (the default job unless ``--config``) trained with each ``loss.type``: same seed, same steps, one table.

    .venv/bin/python bench/losses.py [--config FILE] [--steps 500] [--losses dapo,grpo,...] [KEY=VALUE ...]

Each loss trains the job (``--config``, by default ``examples/addition.yaml``) through ``groupwise train`` in a
fresh process (``dr_grpo`` with ``grpo.normalize_advantages=false``, which it requires); a row ``LOSS+TRUNCATION``
trains ``LOSS`` with ``loss.is_truncation=TRUNCATION`` (``dapo+seq_mask_tis``: the sequence-level importance-weight
correction, which drops whole completions whose geometric-mean weight leaves the bounds); the KEY=VALUE overrides
apply to every run. The table reads each run's ``metrics.jsonl``: held-out greedy accuracy at the start and the
end (the job's own evaluations), the wall time of the whole command, step means of the clip and importance-weight
statistics (``loss/clip_fraction``, ``loss/is_weight_mean``, ``loss/is_oob_fraction``, and
``loss/is_seq_masked_fraction`` where the row masks sequences) and the last
``loss/entropy``. With one update per step every ratio is 1, so the clip never binds and the losses differ in
their normaliser (and cispo in its gradient's form only through the ratio, which is 1): pass e.g.
``optimizer.epochs_per_step=2`` to see the clips act. Pin it (``taskset -c 1``) when timing on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOSSES = ("dapo", "grpo", "dr_grpo", "gspo", "gspo_token", "cispo", "dapo+seq_mask_tis")
NEEDS = {"dr_grpo": ["grpo.normalize_advantages=false"]}
COLUMNS = ("loss", "acc start", "acc end", "wall s", "clip frac", "IS w mean", "IS oob frac", "seq masked frac",
           "entropy end")  # fmt: skip


def row_overrides(row: str) -> list[str]:
    """The overrides of one row: ``LOSS`` or ``LOSS+TRUNCATION`` (module docstring)."""
    loss, _, truncation = row.partition("+")
    return [f"loss.type={loss}", *NEEDS.get(loss, []), *([f"loss.is_truncation={truncation}"] if truncation else [])]


def train(config: str, loss: str, steps: int, overrides: list[str]) -> dict[str, float | str]:
    """One run of the job as the row ``loss`` says: its table row."""
    name = loss.replace("+", "_")
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable, "-m", "groupwise.cli", "train", config, f"run.output_dir={tmp}",
            f"run.name={name}", f"run.max_steps={steps}", "logging.progress=false",
            "logging.tensorboard=false", "logging.train_data=false", "checkpoint.every=0",
            "checkpoint.save_final=false", *row_overrides(loss), *overrides,
        ]  # fmt: skip
        start = time.perf_counter()
        subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        records = [json.loads(line) for line in (Path(tmp) / name / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval/accuracy"] for r in records if "eval/accuracy" in r]
    steps_seen = [r for r in records if "loss/clip_fraction" in r]

    def mean(key: str) -> float:
        values = [r[key] for r in steps_seen if key in r and not math.isnan(r[key])]
        return sum(values) / len(values) if values else math.nan

    entropy = [r["loss/entropy"] for r in steps_seen if "loss/entropy" in r]
    return {
        "loss": loss, "acc start": evals[0] if evals else math.nan, "acc end": evals[-1] if evals else math.nan,
        "wall s": wall, "clip frac": mean("loss/clip_fraction"), "IS w mean": mean("loss/is_weight_mean"),
        "IS oob frac": mean("loss/is_oob_fraction"), "seq masked frac": mean("loss/is_seq_masked_fraction"),
        "entropy end": entropy[-1] if entropy else math.nan,
    }  # fmt: skip


def cell(value: float | str) -> str:
    return value if isinstance(value, str) else f"{value:.4g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="examples/addition.yaml", help="the job every loss trains")
    parser.add_argument("--steps", type=int, default=500, help="optimizer steps per run (the default job's own: 500)")
    parser.add_argument("--losses", default=",".join(LOSSES), help="comma-separated rows: LOSS or LOSS+TRUNCATION")
    parser.add_argument("overrides", nargs="*", help="config overrides for every run, e.g. run.seed=1")
    args = parser.parse_args()
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for loss in args.losses.split(","):
        row = train(args.config, loss, args.steps, args.overrides)
        print("| " + " | ".join(cell(row[c]) for c in COLUMNS) + " |", flush=True)


if __name__ == "__main__":
    main()
