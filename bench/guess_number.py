"""Does SmolLM2 learn to win a game with feedback sooner? Reward, games solved and turns per solved game, per step.

    .venv/bin/python bench/guess_number.py RUN_DIR [RUN_DIR ...] [--window 5]

Reads a finished (or running) run of ``examples/guess_number.yaml``, ``examples/times_tables_retry.yaml`` or
``examples/number_walk.yaml``: ``metrics.jsonl`` for the held-out greedy evaluations (``eval/accuracy``,
``eval/solved_turns_mean``) and ``train_data/step_<N>.jsonl`` for the trained games. Per window of steps: the sampled
reward, the share of games solved, the model turns a game took (a guess or a move each; a lost game takes them all)
and those a solved game took, with the share solved in the fewest turns possible (the first try; for a walk, as many
moves as the distance: a selection-free measure of playing well, since a mean over solved games rises when longer
games start to be won) — overall and, for guess-the-number, per range (the prompt uid ``guess/<high>/<secret>``),
since a policy that starts to solve the wider ranges raises the overall mean even while it gets faster on each; for
the number walk, per distance to the goal (``walk/<start>/<goal>``), whose shortest solution is that many moves, and a
table of the walk's turns replayed through the environment: the share of turns that moved, and of moves that went
toward the goal (a random walker's is ½) and that went up, the walks won by the goal's direction, and the walks whose
first reply moved. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


Game = tuple[str | None, float, int, int]  # kind (or None), raw reward, model turns, the fewest turns that solve it


def trained_games(run_dir: Path) -> dict[int, list[Game]]:
    """Per step: ``(kind or None, raw reward, model turns, fewest turns)`` of every trained game.

    The kind is read from the prompt uid (:func:`game_kind`); other games (``times_tables_retry``) have none. The
    fewest turns that solve a game: a walk's distance, else 1 (a first guess can be right).
    """
    steps: dict[int, list[Game]] = {}
    for path in sorted((run_dir / "train_data").glob("step_*.jsonl")):
        step = int(path.stem.split("_")[1])
        steps[step] = [(game_kind(row["prompt_uid"]), row["raw_reward"], len(row["episode"]["assistant"]),
                        fewest_turns(row["prompt_uid"])) for row in read_jsonl(path)]  # fmt: skip
    return steps


def fewest_turns(prompt_uid: str) -> int:
    """The fewest model turns that solve the game: ``walk/<start>/<goal>`` needs one move per step of the distance,
    any other game can be solved by its first reply."""
    parts = prompt_uid.split("/")
    return abs(int(parts[2]) - int(parts[1])) if len(parts) == 3 and parts[0] == "walk" else 1


def game_kind(prompt_uid: str) -> str | None:
    """``range 5–8`` (9–12, 13–16) for a ``guess/<high>/<secret>`` game, ``distance d`` for a
    ``walk/<start>/<goal>`` walk, None for any other uid."""
    parts = prompt_uid.split("/")
    if len(parts) != 3 or parts[0] not in ("guess", "walk"):
        return None
    if parts[0] == "walk":
        return f"distance {abs(int(parts[2]) - int(parts[1]))}"
    low = 5 + (int(parts[1]) - 5) // 4 * 4
    return f"range {low}–{low + 3}"


def mean(values: Sequence[float]) -> str:
    return f"{sum(values) / len(values):.2f}" if values else "–"


def unfiltered_rewards(run_dir: Path) -> dict[int, float]:
    """Per step, ``reward/unfiltered_mean``: the mean reward of every game generated for it, groups that dynamic
    sampling filtered included (``train_data`` holds the trained groups only)."""
    return {r["step"]: r["reward/unfiltered_mean"] for r in read_jsonl(run_dir / "metrics.jsonl")
            if r.get("reward/unfiltered_mean") is not None}  # fmt: skip


def window_table(steps: dict[int, list[Game]], unfiltered: dict[int, float], window: int) -> list[str]:
    """Rows of ``window`` steps; a column of turns per solved game for each kind of game (:func:`game_kind`).

    Every column but the first reward counts the trained games only: a group whose games all got one reward (all
    won, or all lost) is filtered by dynamic sampling and is not in ``train_data``, so a policy that wins some
    prompts always and others never looks better here than it plays. The first reward is every generated game's.
    """
    kinds = sorted({g[0] for games in steps.values() for g in games if g[0] is not None})
    lines = ["| steps | games | reward, every game generated | sampled reward | solved | solved in the fewest turns "
             "| turns per game | turns per solved game |" + "".join(f" {kind} |" for kind in kinds),
             "|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(kinds)]  # fmt: skip
    last = max(steps, default=0)
    for first in range(1, last + 1, window):
        window_steps = range(first, min(first + window, last + 1))
        games = [g for s in window_steps for g in steps.get(s, [])]
        solved = [g for g in games if g[1] >= 1.0]
        by_kind = defaultdict(list)
        for kind, _, turns, _ in solved:
            if kind is not None:
                by_kind[kind].append(turns)
        fewest = [float(g[1] >= 1.0 and g[2] == g[3]) for g in games]
        solved_share = [float(g[1] >= 1.0) for g in games]
        generated = [unfiltered[s] for s in window_steps if s in unfiltered]
        row = (f"| {first}–{min(first + window - 1, last)} | {len(games)} | {mean(generated)} | "
               f"{mean([g[1] for g in games])} | {mean(solved_share)} | {mean(fewest)} | "
               f"{mean([g[2] for g in games])} | {mean([g[2] for g in solved])} |")  # fmt: skip
        lines.append(row + "".join(f" {mean(by_kind[kind])} |" for kind in kinds))
    return lines


Walk = tuple[int, bool, list[int]]  # the goal's direction (+1 up, −1 down), won, each turn's move (+1 up, −1, 0)


def walk_turns(run_dir: Path) -> dict[int, list[Walk]]:
    """Per step, each trained walk replayed through ``number_walk``: the goal's direction, whether it was won, and
    each turn's move (+1 up, −1 down, 0 a turn that did not move)."""
    from groupwise.environments.number_walk import next_move

    steps: dict[int, list[Walk]] = {}
    for path in sorted((run_dir / "train_data").glob("step_*.jsonl")):
        walks: list[Walk] = []
        for row in read_jsonl(path):
            kind, start, goal = row["prompt_uid"].split("/")
            if kind != "walk":
                return {}
            position, moves = int(start), []
            for text in row["episode"]["assistant"]:
                moves.append(next_move(text, position))
                position += moves[-1]
            walks.append((1 if int(goal) > int(start) else -1, row["raw_reward"] >= 1.0, moves))
        steps[int(path.stem.split("_")[1])] = walks
    return steps


def walk_table(steps: dict[int, list[Walk]], window: int) -> list[str]:
    """Rows of ``window`` steps: the turns that moved, the moves toward the goal, the moves that went up, the walks
    won among those whose goal is up and down, and the walks whose first reply moved.

    A policy that always moves up wins every walk up in the fewest moves and loses every walk down (moves up near
    1, walks down near 0 won): its moves per won walk fall while it never reads the goal. A habit of opening with a
    reply that moves nothing (such as restating the position) costs every walk a move, so no walk can be won in the
    fewest moves. Both show here and not in the table of turns.
    """
    lines = ["| steps | turns | turns that moved | moves toward the goal | moves up | won: goal up | won: goal down "
             "| walks whose first reply moved |", "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    last = max(steps, default=0)
    for first in range(1, last + 1, window):
        walks = [w for s in range(first, min(first + window, last + 1)) for w in steps.get(s, [])]
        moves = [(goal, move) for goal, _, turns in walks for move in turns]
        made = [(goal, move) for goal, move in moves if move != 0]
        won = {side: [float(w) for goal, w, _ in walks if goal == side] for side in (1, -1)}
        lines.append(f"| {first}–{min(first + window - 1, last)} | {len(moves)} | "
                     f"{mean([float(move != 0) for _, move in moves])} | "
                     f"{mean([float(goal == move) for goal, move in made])} | "
                     f"{mean([float(move > 0) for _, move in made])} | {mean(won[1])} | {mean(won[-1])} | "
                     f"{mean([float(turns[0] != 0) for _, _, turns in walks if turns])} |")  # fmt: skip
    return lines


def eval_table(run_dir: Path) -> list[str]:
    lines = ["| step | held-out greedy accuracy | turns per solved held-out game |", "|---:|---:|---:|"]
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
        print("\n".join(window_table(trained_games(run_dir), unfiltered_rewards(run_dir), args.window)))
        walks = walk_turns(run_dir)
        if walks:
            print()
            print("\n".join(walk_table(walks, args.window)))
        print()
        print("\n".join(eval_table(run_dir)))


if __name__ == "__main__":
    main()
