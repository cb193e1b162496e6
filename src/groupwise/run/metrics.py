"""Per-step metrics to ``metrics.jsonl`` and the run's trackers, and human-readable events to ``events.log``.

``metrics.jsonl`` holds one JSON object per optimizer step, ``{"step": N, <key>: <value>, ...}``, with
strictly increasing steps (step 0 = before the first update, e.g. the initial eval). Each new line is
appended whole (:func:`groupwise.run.journal.append_line`), so a crash leaves whole lines (at worst a
torn last line, which :func:`read_metrics` ignores); rewrites (same-step merge, resume truncation) go
through a temporary file and ``os.replace``. Non-finite floats are written as JSON ``null`` (strict JSON
for every reader) and noted in ``events.log``. On resume, :meth:`MetricsWriter.truncate_after` drops
lines past the checkpoint's step, so the resumed run continues without gaps or duplicates; TensorBoard
is told the same through ``purge_step``. The trackers (TensorBoard, W&B, trackio, MLflow:
:mod:`groupwise.run.trackers`) get each logged line's finite values at the same step.
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from groupwise.run.journal import append_line, read_json_lines, write_run_file
from groupwise.run.rundir import RunDir
from groupwise.run.trackers import TensorBoardTracker, Tracker

_DEFAULT_KEYS = object()
_NAME = re.compile(r"[a-z0-9_]{1,64}")  # a name in an open namespace (groupwise.run.metric_keys)


class MetricsWriter:
    """Writes the metrics of one run to ``metrics.jsonl`` and to ``trackers``; ``tensorboard=True`` adds a
    TensorBoard tracker (a run's trackers come from ``logging.backends``: :func:`groupwise.run.trackers.trackers_for`).

    ``known_keys`` is the closed set of accepted metric keys (default: ``groupwise.run.metric_keys.METRIC_KEYS``,
    each defined in ``docs/metrics.md``); ``None`` accepts any key. Log all of a step's metrics in one
    :meth:`log` call where possible; a later call for the same step merges into that step's line.
    """

    def __init__(
        self, run_dir: RunDir | str | Path, tensorboard: bool = False,
        known_keys: Iterable[str] | None | object = _DEFAULT_KEYS, *, trackers: Sequence[Tracker] = (),
    ):  # fmt: skip
        run_dir = RunDir.of(run_dir)
        self.metrics_path: Path = run_dir.metrics_path
        self.events_path: Path = run_dir.events_path
        self.tensorboard_dir: Path = run_dir.tensorboard_dir
        self.trackers: list[Tracker] = list(trackers)
        if tensorboard and not any(t.name == "tensorboard" for t in self.trackers):
            self.trackers.insert(0, TensorBoardTracker(self.tensorboard_dir))
        self.namespaces: tuple[str, ...] = ()
        if known_keys is _DEFAULT_KEYS:
            from groupwise.run.metric_keys import METRIC_KEYS, METRIC_NAMESPACES

            known_keys, self.namespaces = METRIC_KEYS, METRIC_NAMESPACES
        self.known_keys: frozenset[str] | None = (
            None if known_keys is None else frozenset(cast("Iterable[str]", known_keys))  # not the sentinel any more
        )
        existing = read_metrics(self.metrics_path) if self.metrics_path.exists() else []
        self.last_step: int | None = existing[-1]["step"] if existing else None
        if self.metrics_path.exists():
            self._repair_torn_tail(existing)

    def _repair_torn_tail(self, records: list[dict[str, Any]]) -> None:
        # A crash mid-append leaves a last line without its newline; appending after it would glue the next
        # line onto it and corrupt the middle of the file. Drop the fragment before writing anything.
        with self.metrics_path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() == 0:
                return
            handle.seek(-1, os.SEEK_END)
            complete = handle.read(1) == b"\n"
        if not complete:
            self._rewrite(records)
            self.event("metrics.jsonl ended in a torn line (an interrupted write); the fragment was dropped")

    def log(self, step: int, metrics: Mapping[str, float | int]) -> None:
        """Write ``{"step": step, **metrics}`` to metrics.jsonl and each finite scalar to every tracker.

        A new step appends one line. Logging again for the step of the last line (an end-of-run eval, say)
        merges the new keys into that line, so the file keeps one object per step; re-logging a key with
        another value, or logging an earlier step, raises. ``metrics`` may repeat ``"step"`` if it equals
        ``step``.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"metrics step must be a non-negative int, got {step!r}")
        if "step" in metrics and metrics["step"] != step:
            raise ValueError(f"metrics['step'] is {metrics['step']!r} but log() was called for step {step}")
        values = {key: self._checked_value(key, value) for key, value in metrics.items() if key != "step"}
        if self.last_step is not None and step < self.last_step:
            raise ValueError(
                f"metrics for step {step} come after step {self.last_step} in {self.metrics_path}; steps must not "
                "go back. On resume call truncate_after(checkpoint_step) first"
            )
        if step == self.last_step:
            self._merge_into_last_line(step, values)
        else:
            append_line(self.metrics_path, json.dumps({"step": step, **values}, allow_nan=False) + "\n")
        self.last_step = step
        non_finite = [f"{key}={metrics[key]}" for key, value in values.items() if value is None]
        if non_finite:
            self.event(f"step {step}: non-finite metrics written as null: {', '.join(non_finite)}")
        scalars = {key: float(value) for key, value in values.items() if value is not None}
        if scalars:
            self._send(step, scalars)

    def _send(self, step: int, scalars: dict[str, float]) -> None:
        """Hand ``scalars`` to each tracker; one that fails is closed, dropped and named in events.log (the run and
        metrics.jsonl go on)."""
        for tracker in list(self.trackers):
            try:
                tracker.log(step, scalars)
            except Exception as err:  # noqa: BLE001 — any tracker failure: the file stays the record
                self.trackers.remove(tracker)
                with contextlib.suppress(Exception):
                    tracker.close()
                message = (f"tracker {tracker.name} failed at step {step} ({type(err).__name__}: {err}); it is off for "
                           "the rest of this run, metrics.jsonl goes on")  # fmt: skip
                self.event(message)
                print(f"groupwise: {message}", file=sys.stderr, flush=True)

    def _merge_into_last_line(self, step: int, values: dict[str, float | int | None]) -> None:
        records = read_metrics(self.metrics_path)
        last = records[-1]
        clashes = {k: (last[k], v) for k, v in values.items() if k in last and last[k] != v}
        if clashes:
            raise ValueError(
                f"step {step} already has different values for {clashes} (old, new) in {self.metrics_path}; "
                "a metric is logged once per step"
            )
        last.update(values)
        self._rewrite(records)

    def _rewrite(self, records: list[dict[str, Any]]) -> None:
        # Through a temporary sibling and os.replace: a crash keeps the old or the new file, never half.
        tmp = self.metrics_path.with_name(f".{self.metrics_path.name}.tmp-{os.getpid()}")
        write_run_file(tmp, "".join(json.dumps(r, allow_nan=False) + "\n" for r in records).encode("utf-8"))
        os.replace(tmp, self.metrics_path)  # replaces a link itself, never writes through it

    def _in_namespace(self, key: str) -> bool:
        """``key`` is ``<namespace><name>`` for an open namespace and a name of ``[a-z0-9_]`` (metric_keys)."""
        return any(key.startswith(ns) and _NAME.fullmatch(key[len(ns) :]) for ns in self.namespaces)

    def _checked_value(self, key: str, value: object) -> float | int | None:
        if self.known_keys is not None and key not in self.known_keys and not self._in_namespace(key):
            raise ValueError(
                f"unknown metric key {key!r}; every key must be listed in groupwise.run.metric_keys.METRIC_KEYS and "
                "defined in docs/metrics.md — add it to both, or fix the spelling"
            )
        if isinstance(value, bool):
            return int(value)
        if not isinstance(value, numbers.Real):
            raise TypeError(
                f"metric {key!r} must be an int or float, got {type(value).__name__} {value!r}; "
                "convert tensors with .item()"
            )
        if isinstance(value, numbers.Integral):
            return int(value)
        as_float = float(value)
        return as_float if math.isfinite(as_float) else None

    def event(self, message: str) -> None:
        """Append ``<UTC ISO time>  <message>`` to ``events.log`` (one line per line of ``message``)."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        lines = str(message).splitlines() or [""]
        append_line(self.events_path, "".join(f"{stamp}  {line}\n" for line in lines))

    def truncate_after(self, step: int) -> int:
        """Drop metric lines with ``step`` greater than ``step`` (the resumed checkpoint's); return how many.

        The trackers hear it too (TensorBoard readers discard earlier sessions' events from ``step + 1`` on).
        """
        records = read_metrics(self.metrics_path) if self.metrics_path.exists() else []
        kept = [r for r in records if r["step"] <= step]
        self._rewrite(kept)
        self.last_step = kept[-1]["step"] if kept else None
        for tracker in self.trackers:
            tracker.purge_after(step)
        dropped = len(records) - len(kept)
        if dropped and step >= 0:
            self.event(f"resume: dropped {dropped} metrics line(s) after step {step}")
        return dropped

    def close(self) -> None:
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception as err:  # noqa: BLE001 — a tracker that cannot flush must not fail a finished run
                self.event(f"tracker {tracker.name} failed to close ({type(err).__name__}: {err})")

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The metric records of a ``metrics.jsonl`` file, in file order.

    A torn last line (no newline and not valid JSON: the process died mid-write) is ignored with a
    warning; any other unreadable line raises, naming the file and line number.
    """
    records: list[dict[str, Any]] = []
    for number, line, record in read_json_lines(path):
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise ValueError(f"{path} line {number} is not a metrics object with an integer 'step': {line[:200]!r}")
        records.append(record)
    return records

