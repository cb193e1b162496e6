"""The run commands of the CLI: ``train``, ``eval``, ``sft``, ``report``, ``compare``, ``simulate``, ``audit``.

Each is an ``add_<cmd>_parser`` / ``run_<cmd>`` pair registered in :mod:`groupwise.cli.main`. Heavy imports stay
inside the ``run_*`` functions. A run that fails at run time exits 1 with what failed and what was kept (the
newest complete checkpoint), never a bare traceback for an expected failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from groupwise.config import ConfigError, ConfigIssue, config_from_dict, load_config

if TYPE_CHECKING:
    from typing import TypeAlias

    from groupwise.config import RunConfig
    from groupwise.trainer.preflight import Inputs
    from groupwise.trainer.session import Session

    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

EXIT_OK = 0
EXIT_RUN_FAILED = 1
EXIT_USAGE = 2


def print_config_warnings(cfg: RunConfig) -> list[str]:
    """Print the config's hazards (:mod:`groupwise.config.hazards`) to stderr; return them as one-line texts."""
    return print_warnings(cfg.warnings())


def print_warnings(warnings: list[ConfigIssue]) -> list[str]:
    """Print warnings (hazards, or what the input checks found) to stderr; return them as one-line texts."""
    from groupwise.config.issues import format_warning, warning_line

    for issue in warnings:
        print(format_warning(issue), file=sys.stderr)
    return [warning_line(issue) for issue in warnings]


def _config_arguments(parser: argparse.ArgumentParser, what: str = "FILE") -> None:
    parser.add_argument("file", metavar=what, help="YAML config file" if what == "FILE" else "config file or run dir")
    parser.add_argument(
        "overrides", metavar="KEY=VALUE", nargs="*", help="dotted overrides parsed as YAML values, e.g. run.max_steps=5"
    )


# --- train --------------------------------------------------------------------------------------------------------


def add_train_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("train", help="train a policy (sync or async, as the config's mode says)")
    _config_arguments(parser)
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_true", help="continue run.name from its newest complete checkpoint")
    resume.add_argument("--resume-from", type=Path, metavar="PATH", help="continue from this checkpoint directory")
    parser.set_defaults(handler=run_train)


def run_train(args: argparse.Namespace) -> int:
    """Check everything that can refuse the run first (exit 2, nothing created), then train (exit 1 on failure)."""
    started = time.monotonic()
    cfg = load_config(args.file, args.overrides)
    warnings = print_config_warnings(cfg)
    from groupwise.trainer.preflight import check_train_start

    inputs = check_train_start(cfg, resume=args.resume, resume_from=args.resume_from)
    warnings += print_warnings(inputs.warnings)
    from groupwise.cli.run_summary import kept_after_failure, run_summary_text
    from groupwise.run.async_checkpoint import ResumeError
    from groupwise.run.disk_full import DiskFullError, is_disk_full
    from groupwise.run.rundir import RunDirError
    from groupwise.runtime.ray.errors import RayNotInstalledError, RaySetupError

    try:
        session = _build_train_session(cfg, args, inputs)
    except (RunDirError, ResumeError, RayNotInstalledError, RaySetupError) as err:
        print(f"groupwise train: {err}", file=sys.stderr)
        return EXIT_USAGE
    for warning in warnings:
        session.events.event(warning)
    if cfg.runtime.backend != "ray":  # Ray sets each actor's OMP_NUM_THREADS from the CPUs it reserves
        from groupwise.trainer.cpu_threads import apply_cpu_threads
        from groupwise.trainer.remote_policy import RemotePolicy

        policy = session.policy  # with learner ranks, the driver's own copy (the engine's) is the model here
        local = policy.local.model if isinstance(policy, RemotePolicy) else policy.model
        session.events.event(apply_cpu_threads(local))
    stop_reason = "max_steps"
    try:
        if cfg.mode == "sync":
            from groupwise.runtime.sync_run import run_sync

            stop_reason = run_sync(session)
        else:
            from groupwise.runtime.async_run import run_async

            run_async(session)
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # a SystemExit raised by user code (a sampler, a task) is a failure, not exit 0
        session.events.event(f"run failed: {type(err).__name__}: {err}")
        print(f"groupwise train: the run failed: {type(err).__name__}: {err}", file=sys.stderr)
        if is_disk_full(err) and not isinstance(err, DiskFullError):  # a metrics or fates line, say
            print("the disk is full: free space, then continue with --resume", file=sys.stderr)
        print(kept_after_failure(session.run_dir.path), file=sys.stderr)
        return EXIT_RUN_FAILED
    finally:
        session.close()  # stop the learner ranks or Ray actors (and the local cluster this run started)
    print(run_summary_text(session.run_dir.path, time.monotonic() - started))
    if stop_reason != "max_steps":
        print(f"stopped before run.max_steps={cfg.run.max_steps}: {STOP_REASONS[stop_reason]} (events.log says more)")
    return EXIT_OK


# Why a sync run stopped before run.max_steps (groupwise.trainer.sync_loop.SyncLoop.run), as the command says it.
STOP_REASONS = {
    "exhausted": "the training data ran out (data.max_epochs)",
    "no_signal": "dynamic sampling found too few groups with a learning signal (stop_when_exhausted)",
}


def _build_train_session(cfg: RunConfig, args: argparse.Namespace, inputs: Inputs) -> Session:
    """The run's session on the configured runtime (:mod:`groupwise.runtime.sessions`)."""
    from groupwise.runtime.sessions import build_run_session

    return build_run_session(cfg, resume=args.resume, resume_from=args.resume_from, inputs=inputs)


# --- eval ---------------------------------------------------------------------------------------------------------


def add_eval_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("eval", help="held-out greedy accuracy (and pass@k) of a config's or run's policy")
    _config_arguments(parser, what="CONFIG|RUN_DIR")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.set_defaults(handler=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    """A run directory evaluates its ``final/`` policy with the run's resolved config."""
    path = Path(args.file)
    if path.is_dir():
        cfg = run_dir_config(path, args.overrides)
        weights, note = str(path / "final"), f"the trained policy of run {path.name}"
    else:
        cfg = load_config(path, args.overrides)
        weights, note = _configured_weights(cfg, path)
    from groupwise.run.phases import PhaseLog
    from groupwise.trainer.builder import build_components
    from groupwise.trainer.cpu_threads import apply_cpu_threads
    from groupwise.trainer.evaluation import evaluate_policy, evaluated_prompts

    parts = build_components(cfg)
    apply_cpu_threads(parts.policy.model)
    prompts = evaluated_prompts(parts.task.eval_prompts(), cfg)
    pass_k = f" (and pass@{cfg.eval.pass_k})" if cfg.eval.pass_k > 1 else ""
    # minutes on a busy core, silent until the table: a line when it starts and ends, so it never looks like a hang
    with PhaseLog().phase(f"evaluating {len(prompts)} held-out prompts{pass_k}"):
        result = evaluate_policy(parts.engine, parts.rollouts, prompts, cfg)
    if args.json:
        print(json.dumps({"weights": weights, "num_prompts": len(prompts), **result}, indent=2))
    else:
        print(eval_table(f"{weights}  ({note})", cfg, len(prompts), result))
    return EXIT_OK


def eval_table(weights: str, cfg: RunConfig, num_prompts: int, result: dict[str, float]) -> str:
    """The readable ``groupwise eval`` output: which weights, how many prompts, accuracy and pass@k."""
    rows = [("weights", weights), ("held-out prompts", f"{num_prompts}  (task {cfg.data.task}, eval split)")]
    accuracy = result.get("eval/accuracy")
    if accuracy is None:
        rows.append(("greedy accuracy", "—  (the task has no held-out prompts)"))
    else:
        rows.append(("greedy accuracy", f"{accuracy:.3f}  ({round(accuracy * num_prompts)} of {num_prompts} correct)"))
    k = cfg.eval.pass_k
    if "eval/pass_at_k" in result:
        pass_at_k = result["eval/pass_at_k"]
        solved = f"{round(pass_at_k * num_prompts)} of {num_prompts} solved"
        rows.append((f"pass@{k}", f"{pass_at_k:.3f}  ({solved} by {k} samples at temperature "
                                  f"{cfg.generation.temperature:g})"))
    else:
        rows.append(("pass@k", "—  (eval.pass_k is 1: add eval.pass_k=8 to measure pass@8)"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {text}" for label, text in rows)


def _configured_weights(cfg: RunConfig, config_file: Path) -> tuple[str, str]:
    """(what the weights are, where that came from) for a config file's ``model`` section."""
    model = cfg.model
    if model.source == "tiny":
        return f"a random tiny model (seed {cfg.run.seed})", f"model.source: tiny in {config_file}"
    name = f"{model.path}/{model.gguf_file}" if model.gguf_file else str(model.path)
    return name, f"model.path in {config_file}"


def run_dir_config(run_dir: Path, overrides: list[str]) -> RunConfig:
    """The run's resolved config with its model replaced by the trained policy in ``final/``."""
    from groupwise.config.load import read_config_file

    final = run_dir / "final"
    if not final.is_dir():
        issue = ConfigIssue(
            "model.path",
            str(final),
            "evaluating a run directory needs its final/ policy",
            "train the run to the end (or evaluate a config file instead)",
        )
        raise ConfigError([issue], source=str(run_dir))
    data = read_config_file(run_dir / "config.yaml")
    data["model"] = {
        **{k: v for k, v in data["model"].items() if k not in ("tiny", "gguf_file", "gguf_cache")},
        "source": "hf",
        "path": str(final),
    }
    return config_from_dict(data, overrides, source=str(run_dir / "config.yaml"))


# --- sft ----------------------------------------------------------------------------------------------------------


def add_sft_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("sft", help="supervised fine-tuning on task demonstrations (warm starts)")
    _config_arguments(parser)
    parser.set_defaults(handler=run_sft_command)


def run_sft_command(args: argparse.Namespace) -> int:
    cfg = load_config(args.file, args.overrides)
    from groupwise.trainer.sft import run_sft

    final = run_sft(cfg)
    print(f"done: {final}")
    return EXIT_OK


# --- report / compare ---------------------------------------------------------------------------------------------


def add_report_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("report", help="report.md and plots for one or more runs (overlaid)")
    parser.add_argument("run_dirs", metavar="RUN_DIR", nargs="+", type=Path)
    parser.set_defaults(handler=run_report_command)


def run_report_command(args: argparse.Namespace) -> int:
    from groupwise.run.report import run_report

    try:
        written = run_report(args.run_dirs)
    except (FileNotFoundError, ValueError) as err:  # not a run directory, or a corrupted metrics.jsonl
        print(f"groupwise report: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {written}")
    return EXIT_OK


def add_compare_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("compare", help="a markdown table and plots comparing runs (real or simulated)")
    parser.add_argument("run_dirs", metavar="RUN_DIR", nargs="+", type=Path)
    parser.set_defaults(handler=run_compare_command)


def run_compare_command(args: argparse.Namespace) -> int:
    from groupwise.run.report import run_compare

    try:
        table = run_compare(args.run_dirs)
    except (FileNotFoundError, ValueError) as err:
        print(f"groupwise compare: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(table)
    return EXIT_OK


# --- simulate -----------------------------------------------------------------------------------------------------


def add_simulate_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="run a config in virtual time against a simulated generator and learner (sim: section); writes a run dir",
        description="Run the real async controller (or, in mode sync, the real sync loop) in virtual time against the "
        "simulated generator and learner described by the config's sim: section. Writes the run directory "
        "(config.yaml, metrics.jsonl, events.log, fates.jsonl, sim/summary.json) for groupwise compare.",
    )
    _config_arguments(parser)
    parser.set_defaults(handler=run_simulate)


def run_simulate(args: argparse.Namespace) -> int:
    cfg = load_config(args.file, args.overrides)
    print_config_warnings(cfg)
    from groupwise.trainer.preflight import tracker_issues  # no torch: a simulation logs to the same trackers

    if issues := tracker_issues(cfg):
        raise ConfigError(issues)
    from groupwise.run.rundir import RunDirError
    from groupwise.sim.run import format_summary, simulate

    try:
        result = simulate(cfg)
    except RunDirError as err:
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


def add_audit_parser(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="check fates.jsonl against the dataset: no prompt trained twice in an epoch, none lost without a fate",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", type=Path)
    parser.add_argument("--replay-episodes", action="store_true",
                        help="also replay every trained episode into a fresh environment and check its answers and "
                        "rewards (a run with episode.environment)")  # fmt: skip
    parser.add_argument("--replay-sessions", action="store_true",
                        help="also render every logged request of every trained harness session again and check "
                        "that each trained sequence is exactly the tokens served (a run with episode.harness)")
    parser.set_defaults(handler=run_audit)


def run_audit(args: argparse.Namespace) -> int:
    """Print the per-epoch audit; exit 1 if a prompt was trained twice in an epoch or lacks a fate."""
    from groupwise.cli.run_prompts import replay_run_episodes, replay_run_sessions, training_uids
    from groupwise.run.audit import audit_run

    try:
        report = audit_run(args.run_dir, training_uids)
    except (FileNotFoundError, ValueError) as err:
        print(f"groupwise audit: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(report.format())
    replayed_ok = True
    if args.replay_episodes:
        try:
            replay = replay_run_episodes(args.run_dir)
        except ValueError as err:
            print(f"groupwise audit: {err}", file=sys.stderr)
            return EXIT_USAGE
        print(replay.format_lines(), end="")
        replayed_ok = replay.ok
    if args.replay_sessions:
        try:
            sessions = replay_run_sessions(args.run_dir)
        except (ValueError, OSError) as err:
            print(f"groupwise audit: {err}", file=sys.stderr)
            return EXIT_USAGE
        print(sessions.format_lines(), end="")
        replayed_ok = replayed_ok and sessions.ok
    return EXIT_OK if report.ok and replayed_ok else EXIT_RUN_FAILED


RUN_COMMAND_PARSERS = [
    add_train_parser,
    add_eval_parser,
    add_sft_parser,
    add_report_parser,
    add_compare_parser,
    add_simulate_parser,
    add_audit_parser,
]
