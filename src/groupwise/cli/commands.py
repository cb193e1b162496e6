"""The run commands of the CLI: ``train``, ``eval``, ``sft``, ``report``, ``compare``, ``simulate``, ``audit``.

Each is an ``add_<cmd>_parser`` / ``run_<cmd>`` pair registered in :mod:`groupwise.cli.main`. Heavy imports stay
inside the ``run_*`` functions. A run that fails at run time exits 1 with what failed and what was kept (the
newest complete checkpoint), never a bare traceback for an expected failure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from groupwise.config import ConfigError, ConfigIssue, config_from_dict, load_config

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_USAGE = 2


def _config_arguments(parser: argparse.ArgumentParser, what: str = "FILE") -> None:
    parser.add_argument("file", metavar=what, help="YAML config file" if what == "FILE" else "config file or run dir")
    parser.add_argument(
        "overrides", metavar="KEY=VALUE", nargs="*", help="dotted overrides parsed as YAML values, e.g. run.max_steps=5"
    )


# --- train --------------------------------------------------------------------------------------------------------


def add_train_parser(subparsers) -> None:
    parser = subparsers.add_parser("train", help="train a policy (sync or async, as the config's mode says)")
    _config_arguments(parser)
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_true", help="continue run.name from its newest complete checkpoint")
    resume.add_argument("--resume-from", type=Path, metavar="PATH", help="continue from this checkpoint directory")
    parser.set_defaults(handler=run_train)


def run_train(args: argparse.Namespace) -> int:
    cfg = load_config(args.file, args.overrides)
    from groupwise.data.jsonl_dataset import DatasetError
    from groupwise.model.encode import ChatTemplateMissing
    from groupwise.model.lora import LoraSetupError
    from groupwise.run.async_checkpoint import ResumeError
    from groupwise.run.checkpoint import latest_checkpoint
    from groupwise.runtime.ray_errors import RayNotInstalledError, RaySetupError

    setup_errors = (FileExistsError, FileNotFoundError, ResumeError, RayNotInstalledError, RaySetupError,
                    DatasetError, ChatTemplateMissing, LoraSetupError)
    try:
        session = _build_train_session(cfg, args)
    except setup_errors as err:
        print(f"groupwise train: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if cfg.mode == "sync":
            from groupwise.trainer.sync_loop import run_sync

            run_sync(session)
        else:
            from groupwise.runtime.async_run import run_async

            run_async(session)
    except Exception as err:
        kept = latest_checkpoint(session.run_dir.path)
        session.events.event(f"run failed: {type(err).__name__}: {err}")
        print(f"groupwise train: the run failed: {type(err).__name__}: {err}", file=sys.stderr)
        print(f"kept: {kept or 'no complete checkpoint'} (resume with --resume)", file=sys.stderr)
        return EXIT_RUN_FAILED
    finally:
        if cfg.runtime.backend == "ray":
            session.close()  # stop the actors (and the local cluster this run started)
    print(f"done: {session.run_dir.path}")
    return EXIT_OK


def _build_train_session(cfg, args: argparse.Namespace):
    """The run's session on the configured ``runtime.backend`` (Ray is imported only when chosen)."""
    if cfg.runtime.backend == "ray":
        from groupwise.runtime.ray_session import build_ray_session

        return build_ray_session(cfg, resume=args.resume, resume_from=args.resume_from)
    from groupwise.trainer.builder import build_session

    return build_session(cfg, resume=args.resume, resume_from=args.resume_from)


# --- eval ---------------------------------------------------------------------------------------------------------


def add_eval_parser(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="held-out greedy accuracy (and pass@k) of a config's or run's policy")
    _config_arguments(parser, what="CONFIG|RUN_DIR")
    parser.set_defaults(handler=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    """A run directory evaluates its ``final/`` policy with the run's resolved config."""
    path = Path(args.file)
    if path.is_dir():
        cfg = run_dir_config(path, args.overrides)
    else:
        cfg = load_config(path, args.overrides)
    from groupwise.trainer.builder import build_components
    from groupwise.trainer.evaluation import evaluate_policy

    parts = build_components(cfg)
    result = evaluate_policy(parts.engine, parts.rollouts, parts.task.eval_prompts(), cfg)
    print(json.dumps(result, indent=2))
    return EXIT_OK


def run_dir_config(run_dir: Path, overrides: list[str]):
    """The run's resolved config with its model replaced by the trained policy in ``final/``."""
    import yaml

    final = run_dir / "final"
    if not final.is_dir():
        issue = ConfigIssue(
            "model.path",
            str(final),
            "evaluating a run directory needs its final/ policy",
            "train the run to the end (or evaluate a config file instead)",
        )
        raise ConfigError([issue], source=str(run_dir))
    data = yaml.safe_load((run_dir / "config.yaml").read_text())
    data["model"] = {
        **{k: v for k, v in data["model"].items() if k not in ("tiny", "gguf_file")},
        "source": "hf",
        "path": str(final),
    }
    return config_from_dict(data, overrides, source=str(run_dir / "config.yaml"))


# --- sft ----------------------------------------------------------------------------------------------------------


def add_sft_parser(subparsers) -> None:
    parser = subparsers.add_parser("sft", help="supervised fine-tuning on task demonstrations (warm starts)")
    _config_arguments(parser)
    parser.set_defaults(handler=run_sft)


def run_sft(args: argparse.Namespace) -> int:
    cfg = load_config(args.file, args.overrides)
    from groupwise.trainer.sft import run_sft as fine_tune

    final = fine_tune(cfg)
    print(f"done: {final}")
    return EXIT_OK


# --- report / compare ---------------------------------------------------------------------------------------------


def add_report_parser(subparsers) -> None:
    parser = subparsers.add_parser("report", help="report.md and plots for one or more runs (overlaid)")
    parser.add_argument("run_dirs", metavar="RUN_DIR", nargs="+", type=Path)
    parser.set_defaults(handler=run_report_command)


def run_report_command(args: argparse.Namespace) -> int:
    from groupwise.run.report import run_report

    print(f"wrote {run_report(args.run_dirs)}")
    return EXIT_OK


def add_compare_parser(subparsers) -> None:
    parser = subparsers.add_parser("compare", help="a markdown table and plots comparing runs (real or simulated)")
    parser.add_argument("run_dirs", metavar="RUN_DIR", nargs="+", type=Path)
    parser.set_defaults(handler=run_compare_command)


def run_compare_command(args: argparse.Namespace) -> int:
    from groupwise.run.report import run_compare

    print(run_compare(args.run_dirs))
    return EXIT_OK


# --- simulate -----------------------------------------------------------------------------------------------------


def add_simulate_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="run a config in virtual time against a simulated generator and learner (sim: section); writes a run dir",
        description="Run the real async controller (or the sync loop's schedule) in virtual time against the "
        "simulated generator and learner described by the config's sim: section. Writes the run directory "
        "(config.yaml, metrics.jsonl, events.log, fates.jsonl, sim/summary.json) for groupwise compare.",
    )
    _config_arguments(parser)
    parser.set_defaults(handler=run_simulate)


def run_simulate(args: argparse.Namespace) -> int:
    cfg = load_config(args.file, args.overrides)
    from groupwise.sim.run import format_summary, simulate

    try:
        result = simulate(cfg)
    except FileExistsError as err:
        print(f"groupwise simulate: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(format_summary(result.summary))
    if result.summary["outcome"] != "completed":
        print(f"groupwise simulate: the simulated run failed: {result.summary['error']}", file=sys.stderr)
        print(f"written: {result.run_dir.path} (summary in sim/summary.json)", file=sys.stderr)
        return EXIT_RUN_FAILED
    print(f"done: {result.run_dir.path}")
    return EXIT_OK


# --- audit --------------------------------------------------------------------------------------------------------


def add_audit_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="check fates.jsonl against the dataset: no prompt trained twice in an epoch, none lost without a fate",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path)
    parser.set_defaults(handler=run_audit)


def run_audit(args: argparse.Namespace) -> int:
    """Print the per-epoch audit; exit 1 if a prompt was trained twice in an epoch or lacks a fate."""
    from groupwise.run.audit import audit_run

    try:
        report = audit_run(args.run_dir)
    except (FileNotFoundError, ValueError) as err:
        print(f"groupwise audit: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(report.format())
    return EXIT_OK if report.ok else EXIT_RUN_FAILED


RUN_COMMAND_PARSERS = [
    add_train_parser,
    add_eval_parser,
    add_sft_parser,
    add_report_parser,
    add_compare_parser,
    add_simulate_parser,
    add_audit_parser,
]
