"""The default job's step time on an idle machine and beside busy cores, with default settings, in one run.

    .venv/bin/python bench/busy_core.py [--steps 40] [--warmup 5] [--busy 1] [--before] [KEY=VALUE ...]

Each setting trains ``examples/addition.yaml`` through the ``groupwise train`` command in a fresh process,
first alone, then beside ``--busy`` processes that each keep one core busy (a Python busy loop), and reads the
step times back from the run's ``metrics.jsonl`` (``perf/step_seconds``, the median over the steps after
``--warmup``). The child's environment has no ``OMP_NUM_THREADS``, ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``
unless the setting names one, so "default" is what a user gets without setting anything. The threads column
is what the run wrote to its events.log.

``--before`` adds the settings a user got before groupwise chose them: torch's default thread count (one per
physical core) and libgomp's default waiting (``GOMP_SPINCOUNT=300000``: spin a while, then sleep, which is
what libgomp does when neither variable is set).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRUBBED = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS")
BUSY_LOOP = "while True: pass"


def physical_cores() -> int:
    import torch  # torch's own default thread count is the number of physical cores

    return torch.get_num_threads()


def step_times(settings: dict[str, str], steps: int, overrides: list[str], busy: int) -> tuple[list[float], str]:
    """Per-step seconds of one ``groupwise train`` run (beside ``busy`` busy loops) and its thread line."""
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env.update(settings)
    hogs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(busy)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            command = [
                sys.executable, "-m", "groupwise.cli", "train", "examples/addition.yaml", f"run.output_dir={tmp}",
                "run.name=busy", f"run.max_steps={steps}", "logging.progress=false", "logging.tensorboard=false",
                "logging.train_data=false", "eval.at_start=false", "eval.every=0", "eval.at_end=false",
                "checkpoint.every=0", "checkpoint.save_final=false", *overrides,
            ]  # fmt: skip
            subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
            run_dir = Path(tmp) / "busy"
            records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            events = (run_dir / "events.log").read_text().splitlines()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    times = [r["perf/step_seconds"] for r in records if "perf/step_seconds" in r]
    return times, _thread_setting(events)


def _thread_setting(events: list[str]) -> str:
    """``N, <wait policy>`` from the run's ``cpu threads: N (why); OpenMP wait policy: P (why)`` line."""
    line = next((line for line in events if "cpu threads: " in line), None)
    if line is None:
        return "—"
    threads = line.split("cpu threads: ", 1)[1].split(" ", 1)[0]
    policy = line.split("wait policy: ", 1)[1].split(" (", 1)[0] if "wait policy: " in line else "—"
    return f"{threads}, {policy}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out of the median")
    parser.add_argument("--busy", type=int, default=1, help="busy cores beside the job in the second run")
    parser.add_argument("--before", action="store_true", help="also the settings users had before (see above)")
    parser.add_argument("overrides", nargs="*", help="config overrides for the job, e.g. grpo.num_prompts_per_step=8")
    args = parser.parse_args()
    if args.steps <= args.warmup:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    settings = {"default": {}}
    if args.before:
        settings["before (torch's threads, libgomp spinning)"] = {
            "OMP_NUM_THREADS": str(physical_cores()), "GOMP_SPINCOUNT": "300000"
        }
    print(f"{args.steps} steps (median after {args.warmup}), {os.cpu_count()} CPUs, busy loops: {args.busy}\n")
    print(f"| setting | threads (events.log) | idle s/step | beside {args.busy} busy core(s) s/step | ratio |")
    print("|---|---|---|---|---|")
    for name, env in settings.items():
        idle, threads = step_times(env, args.steps, args.overrides, busy=0)
        loaded, _ = step_times(env, args.steps, args.overrides, busy=args.busy)
        idle_s, loaded_s = statistics.median(idle[args.warmup :]), statistics.median(loaded[args.warmup :])
        print(f"| {name} | {threads} | {idle_s:.3f} | {loaded_s:.3f} | {loaded_s / idle_s:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
