"""Skipping prompts that carry no signal (``data.skip_no_signal``): on vs off, 3 seeds, one table.

    taskset -c 1 .venv/bin/python bench/skip_no_signal.py                 # 3 seeds × off/on (minutes per run)
    taskset -c 1 .venv/bin/python bench/skip_no_signal.py --quick         # a smoke run: 1 seed, 10 steps
    taskset -c 1 .venv/bin/python bench/skip_no_signal.py --only-on --on data.skip_no_signal.history=1
    .venv/bin/python bench/skip_no_signal.py --config examples/smollm2_times_tables.yaml --steps 20 \
        --num-train 0 --eval-every 5 --pair-cores 0,1 --on data.skip_no_signal.history=1   # SmolLM2, side by side

Each run is ``groupwise train examples/addition.yaml`` (``--config``) in a subprocess of its own (pin it with
``taskset``: the child inherits the CPU set), with a small training set (``--num-train`` prompts of the addition
task, so a prompt is drawn many times and has a history; 0 keeps the config's own set) and the same steps, seed
by seed, skipping off and on (in alternating order). ``--pair-cores A,B`` runs a seed's two runs side by side
instead, each pinned to its core with one torch thread, so both see the same machine. Read back from
``metrics.jsonl``:

* ``filtered share`` — Σ ``ds/groups_filtered`` ÷ Σ ``ds/groups_generated``: the share of generated groups the
  dynamic-sampling filter threw away (the waste skipping is meant to cut);
* ``gen tokens`` — Σ ``waste/generated_tokens``; ``skipped`` — ``skip/cumulative_prompts`` at the end;
* ``acc`` — held-out greedy accuracy (``eval/accuracy``) after the last step; with ``--eval-every K`` each run's
  JSON line also has its ``curve``: (step, accuracy, seconds of training steps so far, Σ ``perf/step_seconds``),
  to compare the two at the same training time;
* ``wall s`` — the training process's wall time, start to exit (model load and evaluations included); ``cpu s``
  — its user + system CPU seconds, which another process on the pinned core does not inflate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GROUPWISE = ROOT / ".venv" / "bin" / "groupwise"


@dataclass(frozen=True)
class Job:
    """What every run of the table shares: the config, its length and evaluation, and the skip-on overrides."""

    config: str
    out: Path
    steps: int
    num_train: int  # 0: the task's own training set (no cap)
    eval_every: int  # 0: evaluate once, after the last step
    extra: list[str]


def command(job: Job, seed: int, skip: bool) -> tuple[str, list[str]]:
    """The run's name and its ``groupwise train`` command line."""
    name = f"{Path(job.config).stem}_seed{seed}_{'on' if skip else 'off'}"
    name += "_" + "_".join(job.extra).replace("=", "") if skip and job.extra else ""
    evaluation = [f"eval.every={job.eval_every}"] + ([] if job.eval_every else ["eval.at_start=false"])
    capped = [f"data.addition.num_train={job.num_train}"] if job.num_train else []
    args = [
        str(GROUPWISE), "train", job.config, f"run.output_dir={job.out}", f"run.name={name}",
        f"run.seed={seed}", f"run.max_steps={job.steps}", *capped, *evaluation, "checkpoint.every=0",
        "checkpoint.save_final=false", "logging.progress=false", "logging.train_data=false",
        f"data.skip_no_signal.enabled={'true' if skip else 'false'}", *(job.extra if skip else []),
    ]  # fmt: skip
    return name, args


def run_one(job: Job, seed: int, skip: bool, core: int | None = None) -> dict[str, Any]:
    """One run (pinned to ``core`` with one torch thread when given) and its row of the table."""
    name, args = command(job, seed, skip)
    env = None
    if core is not None:
        args = ["taskset", "-c", str(core), *args]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
    job.out.mkdir(parents=True, exist_ok=True)
    log = job.out / f"{name}.stderr"
    started = time.perf_counter()
    with log.open("w") as stderr:
        child = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        # wait4: this child's own CPU seconds (user + system), which another process on its core does not
        # inflate and which a run beside it (--pair-cores) does not add to.
        _, status, usage = os.wait4(child.pid, 0)
    wall, cpu = time.perf_counter() - started, usage.ru_utime + usage.ru_stime
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"{name} failed ({code}):\n{log.read_text()[-3000:]}")
    lines = [json.loads(line) for line in (job.out / name / "metrics.jsonl").read_text().splitlines()]
    generated = sum(line.get("ds/groups_generated", 0.0) for line in lines)
    filtered = sum(line.get("ds/groups_filtered", 0.0) for line in lines)
    accuracy = [line["eval/accuracy"] for line in lines if "eval/accuracy" in line]
    trained_s, curve = 0.0, []  # (step, held-out accuracy, seconds of training steps so far)
    for line in lines:
        trained_s += line.get("perf/step_seconds", 0.0)
        if "eval/accuracy" in line:
            curve.append((line["step"], line["eval/accuracy"], round(trained_s, 1)))
    skipped = [line["skip/cumulative_prompts"] for line in lines if "skip/cumulative_prompts" in line]
    return {
        "seed": seed, "skip": skip, "filtered_share": filtered / generated if generated else 0.0,
        "groups_generated": generated, "gen_tokens": sum(line.get("waste/generated_tokens", 0.0) for line in lines),
        "skipped": skipped[-1] if skipped else 0.0, "accuracy": accuracy[-1] if accuracy else float("nan"),
        "wall_s": wall, "cpu_s": cpu, "curve": curve,
    }  # fmt: skip


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
    parser.add_argument(
        "--on",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="overrides for the runs with skipping on, e.g. data.skip_no_signal.history=1",
    )
    parser.add_argument("--only-on", action="store_true", help="skip the runs with skipping off")
    parser.add_argument("--eval-every", type=int, default=0, help="held-out evaluation every K steps (0: at the end)")
    parser.add_argument(
        "--pair-cores",
        default=None,
        metavar="A,B",
        help="run each seed's off and on runs side by side, pinned to cores A and B, one thread each",
    )
    args = parser.parse_args()
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    job = Job(args.config, args.out, 10 if args.quick else args.steps, args.num_train, args.eval_every, args.on)
    rows = []
    for seed in seeds:
        order = (False, True) if seed % 2 == 0 else (True, False)  # alternate, so drift favours neither
        arms = (True,) if args.only_on else order
        if args.pair_cores:
            cores = [int(c) for c in args.pair_cores.split(",")]
            with ThreadPoolExecutor(len(arms)) as pool:
                done = list(pool.map(run_one, [job] * len(arms), [seed] * len(arms), arms, cores))
        else:
            done = [run_one(job, seed, skip) for skip in arms]
        for row in done:
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
