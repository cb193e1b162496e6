"""Console progress for one run: a rich progress bar on a terminal, a compact line every N steps elsewhere.

Shown per RL step: step/total, reward over every generated row (unfiltered) and over trained rows, the
zero-variance group fraction, generation rounds, generation tokens/s, the latest held-out accuracy (from the
most recent evaluation, ``—`` before the first), and the ETA (``groupwise sft`` shows its loss and the latest
held-out accuracy instead: :func:`format_sft_stats`). The bar is used only
when ``enabled`` (config ``logging.progress``) and the console is a terminal; otherwise (CI logs, files,
``logging.progress: false``) a plain line is printed every ``print_every`` steps and on the last step,
so redirected output stays readable. A slow step (``perf/step_seconds`` ≥ ``slow_step_s``) always gets its line,
with its time, followed by ``step N/T started`` for the next one, and the first step says it started: when a step
takes minutes, every step shows where it starts and ends. ``print_every=0`` silences those lines too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

T = TypeVar("T")

MISSING = "—"
SLOW_STEP_S = 10.0


def format_step_stats(metrics: Mapping[str, Any], accuracy: float | None = None) -> str:
    """The per-step figures as one short string; a key absent from ``metrics`` shows as ``—``.
    ``accuracy`` is the latest held-out accuracy (the step's own when it has one)."""
    return (
        f"reward {_fmt(metrics.get('reward/unfiltered_mean'), '.3f')} "
        f"(trained {_fmt(metrics.get('reward/trained_mean'), '.3f')}) "
        f"zero-var {_fmt(metrics.get('ds/zero_variance_fraction'), '.2f')} "
        f"rounds {_fmt(metrics.get('ds/gen_rounds'), 'g')} "
        f"gen {_fmt(metrics.get('perf/gen_tokens_per_s'), '.0f')} tok/s "
        f"acc {_fmt(_first_known(metrics.get('eval/accuracy'), accuracy), '.3f')}"
    )


def format_sft_stats(metrics: Mapping[str, Any], accuracy: float | None = None) -> str:
    """``groupwise sft``'s per-step figures: the step's loss and the latest held-out accuracy."""
    return (f"loss {_fmt(metrics.get('sft/loss'), '.4f')} "
            f"acc {_fmt(_first_known(metrics.get('eval/accuracy'), accuracy), '.3f')}")  # fmt: skip


StepStats = Callable[[Mapping[str, Any], "float | None"], str]
"""What a progress line shows of a step: its metrics and the latest accuracy as text."""


def _first_known(*values: T | None) -> T | None:
    return next((v for v in values if v is not None), None)


def format_eta(seconds: float | None) -> str:
    """``H:MM:SS``, or ``—`` before there is a rate to extrapolate from."""
    if seconds is None:
        return MISSING
    total = int(round(max(seconds, 0.0)))
    return f"{total // 3600}:{total % 3600 // 60:02d}:{total % 60:02d}"


class RunProgress:
    """Progress of one run over ``total`` optimizer steps; use as a context manager.

    ``start`` is the step a resumed run continues from (the ETA only counts this session's pace).
    ``accuracy`` is the held-out accuracy of the latest evaluation before the first update (None if none yet).
    ``console`` defaults to a rich console on stdout; ``clock`` is injectable for tests. ``stats`` writes a step's
    figures (:func:`format_step_stats` for ``train``, :func:`format_sft_stats` for ``sft``).
    """

    def __init__(
        self,
        total: int,
        *,
        start: int = 0,
        enabled: bool = True,
        run_name: str = "",
        print_every: int = 10,
        slow_step_s: float = SLOW_STEP_S,
        accuracy: float | None = None,
        console: Console | None = None,
        clock: Callable[[], float] = time.monotonic,
        stats: StepStats = format_step_stats,
    ) -> None:
        if total < 1:
            raise ValueError(f"total (steps) must be >= 1, got {total}")
        if not 0 <= start <= total:
            raise ValueError(f"start step must be within 0..{total}, got {start}")
        if print_every < 0:
            raise ValueError(f"print_every must be >= 0 (0 = no compact lines), got {print_every}")
        self.total_steps = total
        self.run_name = run_name
        self.start_step = start
        self.print_every = print_every
        self.slow_step_s = slow_step_s
        self.accuracy = accuracy
        self.console = console if console is not None else Console()
        self.clock = clock
        self.stats = stats
        self.use_bar = enabled and self.console.is_terminal
        self._started_at: float | None = None
        self._bar: Progress | None = None
        self._task = TaskID(0)  # the bar's task, once there is a bar

    def __enter__(self) -> RunProgress:
        self._started_at = self.clock()
        if self.use_bar:
            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self._bar.start()
            self._task = self._bar.add_task(
                self.run_name or "train", total=self.total_steps, completed=self.start_step, stats=""
            )
        elif self.print_every and self.start_step < self.total_steps:
            self._print(f"step {self.start_step + 1}/{self.total_steps} started")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def eta_seconds(self, step: int) -> float | None:
        """Remaining time at this session's pace: ``elapsed / (step − start_step) × (total − step)``."""
        done = step - self.start_step
        if self._started_at is None or done <= 0:
            return None
        return (self.clock() - self._started_at) / done * max(self.total_steps - step, 0)

    def update(self, step: int, metrics: Mapping[str, Any], last: bool = False) -> None:
        """Report that optimizer step ``step`` finished with these metrics (``last``: the run stops after it
        before ``total``, so it gets its line)."""
        if self._started_at is None:
            raise RuntimeError("RunProgress.update called outside `with RunProgress(...)`")
        if metrics.get("eval/accuracy") is not None:
            self.accuracy = metrics["eval/accuracy"]
        stats = self.stats(metrics, self.accuracy)
        if self._bar is not None:
            self._bar.update(self._task, completed=step, stats=stats)
            return
        if not self.print_every:
            return
        seconds = metrics.get("perf/step_seconds")
        slow = seconds is not None and seconds >= self.slow_step_s
        if slow or last or step % self.print_every == 0 or step >= self.total_steps:
            took = f" in {format_eta(seconds)}" if slow else ""
            self._print(f"step {step}/{self.total_steps}{took} {stats} eta {format_eta(self.eta_seconds(step))}")
        if slow and not last and step < self.total_steps:
            self._print(f"step {step + 1}/{self.total_steps} started")

    def _print(self, text: str) -> None:
        prefix = f"[{self.run_name}] " if self.run_name else ""
        self.console.print(prefix + text, markup=False, highlight=False, soft_wrap=True)


def _fmt(value: object, spec: str) -> str:
    if value is None:
        return MISSING
    return format(value, spec)
