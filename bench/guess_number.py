"""Does SmolLM2 learn to play guess-the-number faster? Reward, games solved and guesses per solved game, per step.

    .venv/bin/python bench/guess_number.py RUN_DIR [RUN_DIR ...] [--window 5]

Reads a finished (or running) ``groupwise train examples/guess_number.yaml`` run: ``metrics.jsonl`` for the
held-out greedy evaluations (``eval/accuracy``, ``eval/solved_turns_mean``) and ``train_data/step_<N>.jsonl``
for the trained games. Per window of steps: the sampled reward, the share of games solved and the guesses a
solved game took — overall and per range (the prompt uid ``guess/<high>/<secret>``), since a policy that starts
to solve the wider ranges raises the overall mean even while it gets faster on each. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trained_games(run_dir: Path) -> dict[int, list[tuple[int, float, int]]]:
    """Per step: ``(range high, raw reward, model turns)`` of every trained game."""
    steps: dict[int, list[tuple[int, float, int]]] = {}
    for path in sorted((run_dir / "train_data").glob("step_*.jsonl")):
        step = int(path.stem.split("_")[1])
        steps[step] = [(int(row["prompt_uid"].split("/")[1]), row["raw_reward"], len(row["episode"]["assistant"]))
                       for row in read_jsonl(path)]  # fmt: skip
    return steps


def mean(values: list[float]) -> str:
    return f"{sum(values) / len(values):.2f}" if values else "–"


def window_table(steps: dict[int, list[tuple[int, float, int]]], window: int) -> list[str]:
    lines = ["| steps | games | sampled reward | solved | guesses per solved game | by range: 5–8 | 9–12 | 13–16 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    last = max(steps, default=0)
    for first in range(1, last + 1, window):
        games = [g for s in range(first, min(first + window, last + 1)) for g in steps.get(s, [])]
        solved = [g for g in games if g[1] >= 1.0]
        by_range = defaultdict(list)
        for high, _, turns in solved:
            by_range[(high - 5) // 4].append(turns)
        lines.append(f"| {first}–{min(first + window - 1, last)} | {len(games)} | {mean([g[1] for g in games])} | "
                     f"{mean([float(g[1] >= 1.0) for g in games])} | {mean([g[2] for g in solved])} | "
                     + " | ".join(mean(by_range[k]) for k in range(3)) + " |")  # fmt: skip
    return lines


def eval_table(run_dir: Path) -> list[str]:
    lines = ["| step | held-out greedy accuracy | guesses per solved held-out game |", "|---:|---:|---:|"]
    for record in read_jsonl(run_dir / "metrics.jsonl"):
        if "eval/accuracy" in record:
            turns = record.get("eval/solved_turns_mean")
            lines.append(f"| {record['step']} | {record['eval/accuracy']:.3f} | "
                         f"{'–' if turns is None else f'{turns:.2f}'} |")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--window", type=int, default=5, help="steps per row of the trained-games table")
    args = parser.parse_args()
    for run_dir in args.run_dirs:
        print(f"\n### {run_dir}\n")
        print("\n".join(window_table(trained_games(run_dir), args.window)))
        print()
        print("\n".join(eval_table(run_dir)))


if __name__ == "__main__":
    main()
