"""``groupwise plan JOB.yaml``: which mode, sampler, staleness, partial rollouts and GPU split for a job.

The grid and what each point sets are :mod:`groupwise.sim.plan`'s; this module parses the arguments, prints the
table as the rows come, and writes ``plan.md``, ``plan.json`` and ``plan.png`` to ``--out`` (default
``<run.output_dir>/<run.name>-plan``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from groupwise.cli.commands import print_config_warnings
from groupwise.config import load_config
from groupwise.config.job_schema import default_plan

if TYPE_CHECKING:
    from groupwise.config import RunConfig
    from groupwise.sim.plan import PlanRow

EXIT_OK = 0
EXIT_USAGE = 2


def add_plan_parser(subparsers) -> None:  # type: ignore[no-untyped-def]
    """``groupwise plan JOB.yaml [KEY=VALUE ...] [--out DIR] [--jobs N]``."""
    parser = subparsers.add_parser(
        "plan",
        help="simulate a job (sim.job) under every mode, sampler, staleness, partial-rollout and GPU-split setting "
        "of its grid (sim.plan) and rank them",
        description="Simulate the job described by the config's sim.job under every point of the grid sim.plan "
        "(mode, sampler, staleness window, partial rollouts, rollout/training split) for run.max_steps steps each, "
        "and print a table: time per step, trained tokens per second, speed-up over sync, generator utilisation, "
        "staleness tail, wasted tokens; the best setting is starred. See docs/simulator.md.",
    )
    parser.add_argument("file", metavar="JOB", help="YAML config with a sim.job section (examples/plan/)")
    parser.add_argument("overrides", metavar="KEY=VALUE", nargs="*",
                        help="dotted overrides, e.g. run.max_steps=200 sim.plan.windows=[1]")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None,
                        help="directory for plan.md, plan.json and plan.png (default <run.output_dir>/<run.name>-plan)")
    parser.add_argument("--jobs", type=int, default=1, help="points simulated in parallel processes (default 1)")
    parser.add_argument("--lengths-from", type=Path, default=None, metavar="RUN_DIR",
                        help="read the completion lengths (median and its drift) from a run's metrics.jsonl "
                        "instead of assuming sim.job.lengths")  # fmt: skip
    parser.set_defaults(handler=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    """Print the plan table and write its files; a ``ConfigError`` (every problem) propagates to ``main``."""
    cfg = load_config(args.file, args.overrides)
    if args.lengths_from is not None:
        from groupwise.sim.run_lengths import with_run_lengths

        cfg = with_run_lengths(cfg, args.lengths_from)
    print_config_warnings(cfg)
    if args.jobs < 1:
        print(f"groupwise plan: --jobs must be >= 1, got {args.jobs}", file=sys.stderr)
        return EXIT_USAGE
    from groupwise.sim.plan import CALIBRATION_BAND, format_table, plan_points, run_plan
    from groupwise.sim.plan_verdict import plan_notes

    points = plan_points(cfg)
    grid = cfg.sim.plan or default_plan()
    steps = grid.steps
    simulated = cfg.run.max_steps if steps is None or cfg.run.max_steps is None else min(steps, cfg.run.max_steps)
    screen = "" if grid.screen_steps is None else (
        f"screened for {grid.screen_steps} steps each, then the sync and the {grid.finalists} fastest async "
        f"settings for ")
    print(f"groupwise plan: {len(points)} settings, {screen}{simulated} simulated steps (standing for "
          f"run.max_steps = {cfg.run.max_steps}) of {cfg.grpo.num_prompts_per_step} × "
          f"{cfg.grpo.num_generations_per_prompt}", file=sys.stderr)  # fmt: skip
    start = time.process_time()
    rows = run_plan(cfg, jobs=args.jobs,
                    on_row=lambda row: print(f"  done: {row.point.label}", file=sys.stderr, flush=True))  # fmt: skip
    source = None if args.lengths_from is None else str(args.lengths_from)
    notes = plan_notes(cfg.sim.job, rows, CALIBRATION_BAND, source) if cfg.sim.job is not None else []
    if source is None:  # assumed lengths: how the answer moves if they are off
        from groupwise.sim.plan_sensitivity import length_notes

        notes.extend(length_notes(cfg, rows))
    print(format_table(rows) + "\n\n" + "\n".join(notes))
    name = cfg.run.name or Path(args.file).stem
    out = args.out if args.out is not None else Path(cfg.run.output_dir) / f"{name}-plan"
    written = write_plan(out, args.file, cfg, rows, notes, f"{name}: speed-up over sync")
    print(f"written: {', '.join(str(p) for p in written)} ({time.process_time() - start:.0f} s of CPU in this "
          "process)", file=sys.stderr)  # fmt: skip
    return EXIT_OK


def write_plan(out: Path, source: str, cfg: RunConfig, rows: list[PlanRow], notes: list[str], title: str) -> list[Path]:
    """Write ``plan.md`` (the table, then the notes), ``plan.json`` (one entry per row) and ``plan.png`` to
    ``out``; the paths written."""
    from groupwise.sim.plan import format_table, rows_json
    from groupwise.sim.plan_plot import plot_plan

    out.mkdir(parents=True, exist_ok=True)
    job = cfg.sim.job
    constants = ", ".join(f"{k} = {v}" for k, v in job.efficiency.model_dump().items()) if job is not None else ""
    steps = {r.steps for r in rows if not r.screened}
    (out / "plan.md").write_text(f"# Plan: {source}\n\n{', '.join(map(str, sorted(steps)))} simulated steps per "
                                 f"finalist standing for {cfg.run.max_steps}; fitted constants: {constants}.\n\n"
                                 f"{format_table(rows)}\n\n" + "\n\n".join(notes) + "\n",
                                 encoding="utf-8")  # fmt: skip
    (out / "plan.json").write_text(json.dumps(rows_json(rows), indent=2) + "\n", encoding="utf-8")
    plot = plot_plan(rows, out / "plan.png", title)
    return [p for p in (out / "plan.md", out / "plan.json", plot) if p is not None]
