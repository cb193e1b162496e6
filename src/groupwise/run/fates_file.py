"""``fates.jsonl``: where every dispatched prompt attempt ended, one JSON line each (auditable: invariant 4 in
docs/design.md).

One line per decision, appended as it is made::

    {"group_id": 17, "prompt_uid": "addition/train/42", "epoch": 0, "attempt": 0, "start_version": 3,
     "fate": "trained", "step": 4, "resolution": null, "detail": "", "mode": "async", "tokens": 61}

``fate`` is one of

* ``trained`` — trained in RL step ``step`` (0-based: the step's optimizer update makes weight version step + 1);
* ``filtered`` — zero reward variance under dynamic sampling; ``resolution`` says what became of its dispatch
  slot in async mode (``replaced`` by a spare, ``charged`` as a loss to ``step``, ``uncharged``);
* ``failed`` — the attempt raised (``detail`` = error class and message); ``retried`` (another attempt of the same
  prompt follows), ``replaced``, ``charged`` (lost for good, charged to ``step``), ``uncharged`` or ``fatal``;
* ``evicted`` — a ready group no sampler could select any more (``step`` = trainer version then);
* ``aborted`` — an in-flight attempt cancelled as stale (``detail`` names the trainer version; charged or not);
* ``discarded`` / ``carried`` — sync mode: a valid group beyond P, discarded, or carried into the next step
  (where a later ``trained`` line for the same group id supersedes it);
* ``pending`` — still in flight or buffered when the run stopped. Written at shutdown; with resolution
  ``requeued`` it marks an attempt that was in flight at the checkpoint a resumed run started from: its prompt
  was dispatched again, and a later attempt carries the prompt's fate. A prompt backing off after a
  ``failed``/``retried`` attempt when the run stopped gets a ``pending`` line with ``group_id`` and
  ``start_version`` null: no attempt was running and no group was reserved.
* ``skipped_no_signal`` — never dispatched: the prompt's last groups all had zero variance, so the loader skipped
  this draw (``data.skip_no_signal``); ``detail`` gives that history and the retry probability the draw missed,
  ``group_id`` and ``start_version`` are null, ``attempt`` and ``tokens`` 0. Not the same as the prompts the
  async failure budget skips (``async.rollout_failure.max_skipped_prompts``): those are ``failed`` lines.

``tokens`` is the attempt's completion tokens: what the generator spent on it (:mod:`groupwise.algo.waste`; 0 for
an attempt still in flight when the run stopped). Every line of a group id carries the same count (a sync group
carried and then trained has two lines): count each group id once, by its last line, and the lines add up to the
tokens the run generated. Generation seconds, a wall-clock measurement, stay out of the file, so the same run
writes the same lines (resume equals continuing); they are in the ``waste/*`` metrics. Files written before
tokens were recorded lack the key (:data:`COST_FIELDS`); readers treat it as 0.

Crash safety: each line is appended whole (:func:`groupwise.run.journal.append_line`), so a kill leaves whole
lines (at worst a torn last one, which :func:`read_fates` skips). A checkpoint stores :meth:`FatesWriter.offset`
(the file size, fsynced); resuming from it calls :meth:`FatesWriter.rollback`, which cuts the file back to that
size: the lines after it describe a timeline the resume undid (the model rolled back too), and keeping them would
show the prompts trained again after the resume as trained twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from groupwise.data.signal_history import SkippedDraw
from groupwise.run.journal import append_line, open_run_file, read_json_lines
from groupwise.types import Group

FATES = (
    "trained", "filtered", "failed", "evicted", "aborted", "discarded", "carried", "pending", "skipped_no_signal",
)  # fmt: skip
FIELDS = (
    "group_id", "prompt_uid", "epoch", "attempt", "start_version", "fate", "step", "resolution", "detail", "mode",
)  # fmt: skip
FILTERED_DETAIL = "zero variance: raw rewards all equal"
COST_FIELDS = ("tokens",)  # written on every line; optional when read (older files lack it)
LINE_FIELDS = FIELDS + COST_FIELDS


def is_interim(line: Mapping[str, Any]) -> bool:
    """True for a line that does not settle its prompt: a later line or attempt must follow.

    ``failed``+``retried`` (the next attempt follows), ``pending``+``requeued`` (dispatched again after a resume)
    and ``carried`` (trained, carried again or discarded in the next step). A prompt whose last line is interim
    when the run has finished was dispatched and has no fate.
    """
    fate, resolution = line["fate"], line.get("resolution")
    return (
        (fate == "failed" and resolution == "retried")
        or (fate == "pending" and resolution == "requeued")
        or fate == "carried"
    )


@dataclass(frozen=True)
class RollbackResult:
    """What :meth:`FatesWriter.rollback` did: bytes and whole lines dropped, or how many bytes were missing."""

    dropped_bytes: int
    dropped_lines: int
    missing_bytes: int


class GroupFates(Protocol):
    """Where the sync loop's fate lines go: a :class:`FatesWriter`, or the loop's own counter in front of one."""

    def write_groups(self, groups: Iterable[Group], fate: str, step: int | None, detail: str = "") -> None: ...


class FateLineSource(Protocol):
    """A record that gives its fate line's fields (the async controller's ``FateRecord``)."""

    def as_dict(self) -> dict[str, object]: ...


class FatesWriter:
    """Appends fate lines to ``path`` (created on the first line, or by :meth:`create`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.lines_written = 0

    def create(self) -> None:
        """Make the file, empty, when it does not exist yet (a run that stops before any decision has one)."""
        append_line(self.path, "")

    def write(self, line: Mapping[str, Any]) -> None:
        """Append one fate line; ``line`` needs every key of :data:`LINE_FIELDS` and a known ``fate``."""
        append_line(self.path, fate_line_json(line))
        self.lines_written += 1

    def write_controller_record(self, record: FateLineSource, mode: str = "async") -> None:
        """Append a :class:`groupwise.controller.fate_records.FateRecord` (the async controller's ``on_fate``)."""
        self.write({**record.as_dict(), "mode": mode})

    def write_groups(self, groups: Iterable[Group], fate: str, step: int | None, detail: str = "") -> None:
        """Append one sync-mode line per group, all with the same fate and step (each with its group's cost)."""
        for group in groups:
            self.write(
                {
                    "group_id": group.group_id,
                    "prompt_uid": group.prompt.uid,
                    "epoch": group.epoch,
                    "attempt": group.attempt,
                    "start_version": group.start_version,
                    "fate": fate,
                    "step": step,
                    "resolution": None,
                    "detail": detail,
                    "mode": "sync",
                    "tokens": group.num_completion_tokens,
                }
            )

    def write_skipped(self, draws: Iterable[SkippedDraw]) -> None:
        """Append a sync-mode ``skipped_no_signal`` line per draw the loader skipped (see the module docstring)."""
        for draw in draws:
            self.write(
                {
                    "group_id": None, "prompt_uid": draw.prompt_uid, "epoch": draw.epoch, "attempt": 0,
                    "start_version": None, "fate": "skipped_no_signal", "step": None, "resolution": None,
                    "detail": draw.detail, "mode": "sync", "tokens": 0,
                }
            )  # fmt: skip

    def offset(self, sync: bool = True) -> int:
        """The file's size in bytes: what a checkpoint records to roll back to. ``sync`` fsyncs the file first
        (a checkpoint must not name lines a machine crash could still lose; a kill cannot lose written lines)."""
        if not self.path.exists():
            return 0
        fd = os.open(self.path, os.O_RDONLY)
        try:
            if sync:
                os.fsync(fd)
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def rollback(self, offset: int) -> RollbackResult:
        """Cut the file back to ``offset`` bytes (a checkpoint's :meth:`offset`); see the module docstring.

        A file shorter than ``offset`` (lost to a machine crash after the checkpoint) is left alone and the
        shortfall reported, so the caller can log it; the audit then reports the prompts whose fates were lost.
        """
        if offset < 0:
            raise ValueError(f"fates rollback offset must be >= 0, got {offset}")
        size = self.path.stat().st_size if self.path.exists() else 0
        if size <= offset:
            return RollbackResult(0, 0, offset - size)
        with os.fdopen(open_run_file(self.path, os.O_RDWR), "r+b") as handle:  # never through a link
            handle.seek(offset)
            tail = handle.read()
            handle.truncate(offset)
            handle.flush()
            os.fsync(handle.fileno())
        return RollbackResult(size - offset, tail.count(b"\n"), 0)


def fate_line_json(line: Mapping[str, Any]) -> str:
    """``line`` as one JSON line (keys in :data:`LINE_FIELDS` order); a missing key or an unknown fate raises."""
    missing = [name for name in LINE_FIELDS if name not in line]
    if missing or line["fate"] not in FATES:
        raise ValueError(
            f"fate line {dict(line)!r} is missing {missing} or has an unknown fate; a line needs every key of "
            f"{list(LINE_FIELDS)} and a fate from {list(FATES)}"
        )
    return json.dumps({name: line[name] for name in LINE_FIELDS}, allow_nan=False) + "\n"


def read_fates(path: str | Path) -> list[dict[str, Any]]:
    """The fate lines of ``path`` in file order. A torn last line (no newline, not JSON: the writer was killed
    mid-line) is skipped with a warning; any other bad line raises, naming the file and line number."""
    lines: list[dict[str, Any]] = []
    for number, piece, line in read_json_lines(path):
        missing = [name for name in FIELDS if name not in line] if isinstance(line, dict) else list(FIELDS)
        if missing or line["fate"] not in FATES:
            raise ValueError(
                f"{path} line {number} is not a fate line (missing {missing} or unknown fate): {piece[:200]!r}"
            )
        lines.append(line)
    return lines


def write_sync_step_fates(
    writer: GroupFates, step: int, generated: Sequence[Group], trained: Sequence[Group], surplus: Sequence[Group],
    surplus_carried: bool, filtered: Sequence[Group],
) -> None:  # fmt: skip
    """The fates of one trained sync step, from the accumulator's selection: every trained group (carried-in ones
    included), the surplus (carried or discarded), and the groups the filter dropped. Every generated group must be
    in exactly one of them (an AssertionError names the one that is not: the step's accounting is broken)."""
    settled = [g.group_id for part in (trained, surplus, filtered) for g in part]
    missing = sorted({g.group_id for g in generated} - set(settled))
    repeated = sorted(gid for gid in set(settled) if settled.count(gid) > 1)
    if missing or repeated:
        raise AssertionError(
            f"sync step {step}: group(s) {missing} were generated but are neither trained, surplus nor filtered, "
            f"and group(s) {repeated} are in more than one of them; the step's accounting is broken"
        )
    writer.write_groups(trained, "trained", step)
    writer.write_groups(surplus, "carried" if surplus_carried else "discarded", step)
    writer.write_groups(filtered, "filtered", step, detail=FILTERED_DETAIL)


def write_untrained_step_fates(
    writer: GroupFates, step: int, groups: Sequence[Group], filtered: Sequence[Group], reason: str
) -> None:
    """The fates of a sync step that was never trained (the data ran out, dynamic sampling gave up, a round or the
    optimizer step failed), one line per group of ``groups`` in order: those the filter dropped (``filtered``, as
    the accumulator recorded them) are ``filtered``, the rest (carried-in ones included) stay ``pending``."""
    dropped = {group.group_id for group in filtered}
    for group in groups:
        if group.group_id in dropped:
            writer.write_groups([group], "filtered", step, detail=FILTERED_DETAIL)
        else:
            writer.write_groups([group], "pending", step, detail=f"step {step} was not trained: {reason}")
