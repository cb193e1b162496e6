"""The summary ``groupwise train`` prints when a run ends: how it went, where its files are, what to run next.

Every number is read back from the run's ``metrics.jsonl`` through :mod:`groupwise.run.run_stats` (the figures
``groupwise report`` shows), except the command's own wall time, which the command measures (it includes
loading, evaluations and checkpoints; "training" is Σ ``perf/step_seconds``). Accuracy is the first and last
held-out evaluation of the run (step 0 = before training, when ``eval.at_start`` is on); rewards are smoothed:
the means over the run's first and last W steps (W = ``clamp(steps // 5, 1, 25)``).
"""

from __future__ import annotations

from pathlib import Path

from groupwise.run.checkpoint import checkpoint_step, latest_checkpoint
from groupwise.run.metrics import read_metrics
from groupwise.run.report import fmt_duration
from groupwise.run.run_stats import RunSummary, Smoothed, load_run, summarize_run
from groupwise.run.rundir import RunDir

LABEL_WIDTH = 18


def run_summary_text(run_dir: Path, command_seconds: float | None = None) -> str:
    """The end-of-run summary of the run in ``run_dir`` (see the module docstring)."""
    return format_run_summary(summarize_run(load_run(run_dir)), Path(run_dir), command_seconds)


def format_run_summary(summary: RunSummary, run_dir: Path, command_seconds: float | None = None) -> str:
    mode = f" ({summary.mode})" if summary.mode else ""
    took = f" in {fmt_duration(command_seconds)}" if command_seconds is not None else ""
    lines = [f"run {summary.name}{mode} finished: {summary.steps} steps{took} "
             f"(training {fmt_duration(summary.wall_seconds)}, the sum of step times)"]  # fmt: skip
    lines.append(_row("held-out accuracy", _accuracy(summary)))
    if summary.final_pass_at_k is not None:
        lines.append(_row("pass@k", f"{summary.final_pass_at_k:.3f} at the last evaluation"))
    lines.append(_row("reward (trained)", _smoothed(summary.trained_reward)))
    lines.append(_row("reward (all rows)", _smoothed(summary.unfiltered_reward, every_row=True)))
    if summary.groups:
        lines.append(_row("groups", " · ".join(f"{_count(n)} {label}" for label, n in summary.groups.items())))
    final = run_dir / "final"
    lines.append(_row("trained policy", _trained_policy(run_dir)))
    present = [name for name in RUN_FILES if (run_dir / name.rstrip("/")).exists()]
    lines.append(_row("run files", f"{run_dir}/  ({', '.join(present)})"))
    lines.append("next:")
    if final.is_dir():  # groupwise eval RUN_DIR evaluates final/: suggest it only where there is one
        lines.append(f"  groupwise eval {run_dir}      held-out accuracy (and pass@k) of final/")
    lines.append(f"  groupwise report {run_dir}    writes {run_dir / 'report.md'} with plots in {run_dir / 'plots'}/")
    return "\n".join(lines)


RUN_FILES = ("metrics.jsonl", "events.log", "fates.jsonl", "train_data/", "tensorboard/", "wandb/", "mlflow.db",
             "checkpoints/", "final/")


def _trained_policy(run_dir: Path) -> str:
    final = run_dir / "final"
    if final.is_dir():
        return f"{final}  (Hugging Face format: loads with transformers)"
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is not None:
        return f"not saved (checkpoint.save_final is false); the last checkpoint is {checkpoint}"
    return "not saved (checkpoint.save_final is false and checkpoint.every is 0: no weights were written)"


def _row(label: str, text: str) -> str:
    return f"  {label:<{LABEL_WIDTH}} {text}"


def _accuracy(summary: RunSummary) -> str:
    acc = summary.accuracy
    if acc is None:
        return "— (no evaluation ran: eval.at_start, eval.every and eval.at_end are all off)"
    if acc.start_step == acc.final_step:
        return f"{acc.final:.3f} (one evaluation, at step {acc.final_step})"
    return (
        f"{acc.start:.3f} → {acc.final:.3f}  (step {acc.start_step} → step {acc.final_step}; "
        f"best {acc.best:.3f} at step {acc.best_step})"
    )


def _smoothed(value: Smoothed | None, every_row: bool = False) -> str:
    if value is None:
        return "— (not logged)"
    what = "every generated row" if every_row else "trained rows"
    return f"{value.start:.3f} → {value.end:.3f}  (mean over {what} of the first / last {value.window} steps)"


def _count(value: int | float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def kept_after_failure(run_dir: Path) -> str:
    """What a failed run kept: its newest complete checkpoint, and the steps ``metrics.jsonl`` records after it,
    which a resume trains again (a run saves every ``checkpoint.every`` steps, 0 = only at the end)."""
    kept = latest_checkpoint(run_dir)
    line = f"kept: {kept or 'no complete checkpoint'} (resume with --resume)"
    try:
        last = max((record["step"] for record in read_metrics(RunDir(run_dir).metrics_path)), default=0)
    except (OSError, ValueError):  # no metrics yet, or a damaged file: say what is known
        return line
    since = (checkpoint_step(kept) or 0) if kept is not None else 0
    if last <= since:
        return line
    one = last == since + 1
    steps = f"step {last}" if one else f"steps {since + 1}–{last}"
    after = "trained after it" if kept is not None else "trained"
    return (f"{line}; {steps} {after} {'is' if one else 'are'} not kept: a resume trains {'it' if one else 'them'} "
            "again (checkpoint.every saves more often)")
