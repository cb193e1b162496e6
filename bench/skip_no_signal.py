"""Skipping prompts that carry no signal (``data.skip_no_signal``): on vs off on the tiny default job.

    taskset -c 1 .venv/bin/python bench/skip_no_signal.py                 # 3 seeds × off/on (minutes per run)
    taskset -c 1 .venv/bin/python bench/skip_no_signal.py --quick         # a smoke run: 1 seed, 10 steps
    taskset -c 1 .venv/bin/python bench/skip_no_signal.py --only-on --on data.skip_no_signal.history=1

Each run is ``groupwise train examples/addition.yaml`` (``--config``) in a subprocess of its own (pin it with
``taskset``: the child inherits the CPU set), with a small training set (``--num-train`` prompts, so a prompt is
drawn many times and has a history) and the same steps, seed by seed, skipping off and on (in alternating order).
Read back from ``metrics.jsonl``:

* ``filtered share`` — Σ ``ds/groups_filtered`` ÷ Σ ``ds/groups_generated``: the share of generated groups the
  dynamic-sampling filter threw away (the waste skipping is meant to cut);
* ``gen tokens`` — Σ ``waste/generated_tokens``; ``skipped`` — ``skip/cumulative_prompts`` at the end;
* ``acc`` — held-out greedy accuracy (``eval/accuracy``) after the last step;
* ``wall s`` — the training process's wall time, start to exit (model load and evaluations included); ``cpu s``
  — its user + system CPU seconds, which another process on the pinned core does not inflate.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GROUPWISE = ROOT / ".venv" / "bin" / "groupwise"


def run_one(
    config: str, out: Path, seed: int, skip: bool, steps: int, num_train: int, extra: list[str]
) -> dict[str, Any]:
    name = f"{Path(config).stem}_seed{seed}_{'on' if skip else 'off'}"
    name += "_" + "_".join(extra).replace("=", "") if skip and extra else ""
    args = [
        str(GROUPWISE), "train", config, f"run.output_dir={out}", f"run.name={name}",
        f"run.seed={seed}", f"run.max_steps={steps}", f"data.addition.num_train={num_train}", "eval.every=0",
        "eval.at_start=false", "checkpoint.every=0", "checkpoint.save_final=false", "logging.progress=false",
        "logging.train_data=false", f"data.skip_no_signal.enabled={'true' if skip else 'false'}",
        *(extra if skip else []),
    ]  # fmt: skip
    started, cpu_before = time.perf_counter(), _children_cpu_seconds()
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - started, _children_cpu_seconds() - cpu_before
    if done.returncode != 0:
        sys.exit(f"{name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    lines = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    generated = sum(line.get("ds/groups_generated", 0.0) for line in lines)
    filtered = sum(line.get("ds/groups_filtered", 0.0) for line in lines)
    accuracy = [line["eval/accuracy"] for line in lines if "eval/accuracy" in line]
    skipped = [line["skip/cumulative_prompts"] for line in lines if "skip/cumulative_prompts" in line]
    return {
        "seed": seed, "skip": skip, "filtered_share": filtered / generated if generated else 0.0,
        "groups_generated": generated, "gen_tokens": sum(line.get("waste/generated_tokens", 0.0) for line in lines),
        "skipped": skipped[-1] if skipped else 0.0, "accuracy": accuracy[-1] if accuracy else float("nan"),
        "wall_s": wall, "cpu_s": cpu,
    }  # fmt: skip


def _children_cpu_seconds() -> float:
    """User + system CPU seconds of the finished child processes: unlike wall time, not inflated when another
    process shares the pinned core."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| seed | skip | filtered share | groups generated | gen tokens | skipped | acc | wall s | cpu s |",
           "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        out.append(f"| {r['seed']} | {'on' if r['skip'] else 'off'} | {r['filtered_share']:.1%} | "
                   f"{r['groups_generated']:.0f} | {r['gen_tokens']:.0f} | {r['skipped']:.0f} | "
                   f"{r['accuracy']:.3f} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} |")  # fmt: skip
    for skip in (False, True):
        mine = [r for r in rows if r["skip"] == skip]
        if not mine:
            continue
        out.append(f"| mean | {'on' if skip else 'off'} | "
                   f"{statistics.mean(r['filtered_share'] for r in mine):.1%} | "
                   f"{statistics.mean(r['groups_generated'] for r in mine):.0f} | "
                   f"{statistics.mean(r['gen_tokens'] for r in mine):.0f} | "
                   f"{statistics.mean(r['skipped'] for r in mine):.0f} | "
                   f"{statistics.mean(r['accuracy'] for r in mine):.3f} | "
                   f"{statistics.mean(r['wall_s'] for r in mine):.1f} | "
                   f"{statistics.mean(r['cpu_s'] for r in mine):.1f} |")  # fmt: skip
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="examples/addition.yaml", help="the job (addition_async.yaml: async)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds")
    parser.add_argument("--steps", type=int, default=150, help="optimizer steps per run")
    parser.add_argument("--num-train", type=int, default=256, help="training prompts (a cap)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/groupwise-skip-bench"), help="run directories")
    parser.add_argument("--quick", action="store_true", help="1 seed, 10 steps: proves the script runs")
    parser.add_argument("--on", nargs="*", default=[], metavar="KEY=VALUE",
                        help="overrides for the runs with skipping on, e.g. data.skip_no_signal.history=1")
    parser.add_argument("--only-on", action="store_true", help="skip the runs with skipping off")
    args = parser.parse_args()
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    steps = 10 if args.quick else args.steps
    rows = []
    for seed in seeds:
        order = (False, True) if seed % 2 == 0 else (True, False)  # alternate, so drift favours neither
        for skip in (True,) if args.only_on else order:
            rows.append(run_one(args.config, args.out, seed, skip, steps, args.num_train, args.on))
            print(json.dumps(rows[-1]), flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
