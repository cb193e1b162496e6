"""Does SmolLM2 learn to win a game with feedback sooner? Reward, games solved and guesses per solved game, per step.

    .venv/bin/python bench/guess_number.py RUN_DIR [RUN_DIR ...] [--window 5]

Reads a finished (or running) run of ``examples/guess_number.yaml`` or ``examples/times_tables_retry.yaml``:
``metrics.jsonl`` for the held-out greedy evaluations (``eval/accuracy``, ``eval/solved_turns_mean``) and
``train_data/step_<N>.jsonl`` for the trained games. Per window of steps: the sampled reward, the share of games
solved, the guesses a game took (a lost game takes them all) and those a solved game took, with the share solved on
the first try — overall and, for guess-the-number, per range (the prompt uid ``guess/<high>/<secret>``), since a
policy that starts to solve the wider ranges raises the overall mean even while it gets faster on each. Prints
markdown tables.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trained_games(run_dir: Path) -> dict[int, list[tuple[int | None, float, int]]]:
    """Per step: ``(range high or None, raw reward, model turns)`` of every trained game.

    The range is read from a ``guess/<high>/<secret>`` prompt uid; other games (``times_tables_retry``) have none.
    """
    steps: dict[int, list[tuple[int | None, float, int]]] = {}
    for path in sorted((run_dir / "train_data").glob("step_*.jsonl")):
        step = int(path.stem.split("_")[1])
        steps[step] = [(range_high(row["prompt_uid"]), row["raw_reward"], len(row["episode"]["assistant"]))
                       for row in read_jsonl(path)]  # fmt: skip
    return steps


def range_high(prompt_uid: str) -> int | None:
    parts = prompt_uid.split("/")
    return int(parts[1]) if parts[0] == "guess" and len(parts) == 3 else None


def mean(values: list[float]) -> str:
    return f"{sum(values) / len(values):.2f}" if values else "–"


def window_table(steps: dict[int, list[tuple[int | None, float, int]]], window: int) -> list[str]:
    """Rows of ``window`` steps; the per-range columns only for guess-the-number games."""
    ranged = any(g[0] is not None for games in steps.values() for g in games)
    lines = ["| steps | games | sampled reward | solved | solved on the first try | guesses per game "
             "| guesses per solved game |" + (" by range: 5–8 | 9–12 | 13–16 |" if ranged else ""),
             "|---|---:|---:|---:|---:|---:|---:|" + ("---:|" * 3 if ranged else "")]  # fmt: skip
    last = max(steps, default=0)
    for first in range(1, last + 1, window):
        games = [g for s in range(first, min(first + window, last + 1)) for g in steps.get(s, [])]
        solved = [g for g in games if g[1] >= 1.0]
        by_range = defaultdict(list)
        for high, _, turns in solved:
            if high is not None:
                by_range[(high - 5) // 4].append(turns)
        first_try = [float(g[1] >= 1.0 and g[2] == 1) for g in games]
        solved_share = [float(g[1] >= 1.0) for g in games]
        row = (f"| {first}–{min(first + window - 1, last)} | {len(games)} | {mean([g[1] for g in games])} | "
               f"{mean(solved_share)} | {mean(first_try)} | {mean([g[2] for g in games])} | "
               f"{mean([g[2] for g in solved])} |")  # fmt: skip
        lines.append(row + ("".join(f" {mean(by_range[k])} |" for k in range(3)) if ranged else ""))
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
