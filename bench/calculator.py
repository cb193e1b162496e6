"""Does SmolLM2 learn to use the calculator tool? The warm start, then RL, per seed, as a user would run them.

    .venv/bin/python bench/calculator.py [--seeds 0,1,2] [--sft-steps 60] [--rl-steps 30] [--config YAML]
        [KEY=VALUE ...]

For each seed, in fresh processes: ``groupwise sft recipes/warm_start_calculator.yaml`` (the warm start: the first
turn, a ``multiply`` call, from each item's ``demonstration``), then ``groupwise train examples/calculator.yaml``
(or ``--config``: ``examples/calculator_harness.yaml`` trains the same task through the harness endpoint) from its
``final/`` (extra ``KEY=VALUE`` overrides go to the train command; ``--reuse-warm-start`` trains from a warm start
an earlier run of the bench left in ``--out``, so two configs can be compared from the same warm starts; ``--tag``
names the RL runs apart). Read back from the runs' metrics: held-out greedy accuracy of the warm start and along RL
(``eval/accuracy``: greedy episodes, correct = reward ≥ 1), tool calls per trained episode at the first and last RL
step (``episode/tool_calls_mean``), and the wall time of each phase. Prints one markdown table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GROUPWISE = [sys.executable, "-m", "groupwise.cli"]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def one_seed(seed: int, args: argparse.Namespace, out: Path) -> str:
    sft_dir, rl_dir = out / f"sft-{seed}", out / f"rl-{seed}{args.tag}"
    sft_seconds = 0.0
    if not (args.reuse_warm_start and (sft_dir / "final").is_dir()):
        sft_seconds = timed([*GROUPWISE, "sft", "recipes/warm_start_calculator.yaml", f"run.seed={seed}",
                             f"run.output_dir={out}", f"run.name={sft_dir.name}",
                             f"sft.steps={args.sft_steps}"])  # fmt: skip
    warm = [r["eval/accuracy"] for r in metrics(sft_dir) if "eval/accuracy" in r]
    rl_seconds = timed([*GROUPWISE, "train", args.config, "model.source=hf",
                        f"model.path={sft_dir / 'final'}", f"run.seed={seed}", f"run.output_dir={out}",
                        f"run.name={rl_dir.name}", f"run.max_steps={args.rl_steps}", "logging.progress=false",
                        *args.overrides])  # fmt: skip
    records = metrics(rl_dir)
    curve = [(r["step"], r["eval/accuracy"]) for r in records if "eval/accuracy" in r]
    steps = [r for r in records if "episode/tool_calls_mean" in r]
    start, end, best = curve[0][1], curve[-1][1], max(a for _, a in curve)
    calls = f"{steps[0]['episode/tool_calls_mean']:.2f} → {steps[-1]['episode/tool_calls_mean']:.2f}" if steps else "—"
    points = ", ".join(f"{s}:{a:.2f}" for s, a in curve)
    return (f"| {seed} | {warm[-1] if warm else float('nan'):.2f} | {start:.2f} → {end:.2f} (best {best:.2f}) | "
            f"{100 * (best - start):+.0f} | {calls} | {sft_seconds / 60:.1f} + {rl_seconds / 60:.1f} | {points} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--sft-steps", type=int, default=60)
    parser.add_argument("--rl-steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--config", default="examples/calculator.yaml", help="the RL config (default: %(default)s)")
    parser.add_argument("--tag", default="", help="appended to each RL run's directory name (rl-SEED-TAG)")
    parser.add_argument("--reuse-warm-start", action="store_true",
                        help="train from OUT/sft-SEED/final when it exists instead of making it again (0 SFT minutes)")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE overrides for the RL run")
    args = parser.parse_args()
    print("| seed | warm start acc | RL acc start → end | gain (points, best) | tool calls / episode, first → last "
          "step | minutes sft + rl | curve (step:acc) |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="groupwise-calculator-") as tmp:
        out = args.out or Path(tmp)
        for seed in (int(s) for s in args.seeds.split(",")):
            print(one_seed(seed, args, out), flush=True)


if __name__ == "__main__":
    main()
