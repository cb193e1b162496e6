"""``groupwise audit RUN_DIR``: check from ``fates.jsonl`` and the dataset that no prompt was lost or trained twice.

The run's training prompts are rebuilt from its ``config.yaml``: the task's (``groupwise.data.registry.build_task``),
or, for a directory ``groupwise simulate`` wrote, the simulator's (``groupwise.sim.workload.make_sim_prompts``). Each
prompt of each epoch that appears in ``fates.jsonl`` was dispatched; its outcome is decided from its lines in
file order (every attempt and group of that prompt in that epoch):

* ``trained`` — at least one ``trained`` line (more than one in the epoch: **trained twice**, a violation);
* otherwise the prompt's last line decides: ``filtered``; ``evicted/aborted``; ``charged`` (failed, lost for good
  and charged to a step); ``failed`` (failed and replaced, uncharged or fatal); ``discarded`` (sync surplus);
  ``pending`` (in flight or buffered when the run stopped, or carried at the end of a sync run);
* ``no fate`` — the last line is interim (:func:`groupwise.run.fates_file.is_interim`: a retry, a requeue at resume, a
  carry) and nothing follows it: the prompt was dispatched and then lost track of, a violation.

``skipped (no signal)`` counts prompts whose only lines in the epoch are ``skipped_no_signal``: the loader skipped
their draw before dispatch (``data.skip_no_signal``), so they were neither trained nor lost, are not counted as
dispatched, and are never a violation. ``never dispatched`` counts the dataset's prompts with no line in an epoch
that has lines. Fate lines naming a
prompt the dataset lacks, or one group id naming two prompts, are violations too (the file does not belong to
this data). For a run that writes ``train_data``, :mod:`groupwise.run.train_data_audit` also checks the step files
against the fates and every trained token against the sampler's staleness bound. The exit code is 0 when there is
no violation and 1 otherwise.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from groupwise.run.fates_file import is_interim, read_fates
from groupwise.run.train_data_audit import TrainDataAudit, audit_train_data

if TYPE_CHECKING:
    from groupwise.config import RunConfig

CATEGORIES = ("trained", "filtered", "charged", "evicted/aborted", "failed", "discarded", "pending", "no fate")
SKIPPED_FATE = "skipped_no_signal"
SKIPPED = "skipped (no signal)"  # the column of prompts skipped before dispatch: not dispatched, not lost
_SHOWN = 10  # offending prompts listed per kind


def prompt_outcome(lines: Sequence[dict[str, Any]]) -> tuple[str, int]:
    """``(category, times trained)`` of one prompt in one epoch from its fate lines in file order (``skipped`` for a
    prompt whose draw was skipped before dispatch and which has no other line)."""
    dispatched = [line for line in lines if line["fate"] != SKIPPED_FATE]
    if not dispatched:
        return SKIPPED, 0
    lines = dispatched
    trained = sum(1 for line in lines if line["fate"] == "trained")
    if trained:
        return "trained", trained
    last = lines[-1]
    if is_interim(last):
        return "no fate", 0
    fate, resolution = last["fate"], last.get("resolution")
    if fate in ("evicted", "aborted"):
        return "evicted/aborted", 0
    if fate == "failed":
        return ("charged" if resolution == "charged" else "failed"), 0
    return fate, 0  # filtered, discarded, pending


@dataclass
class EpochAudit:
    """One epoch: prompts per outcome category, never-dispatched prompts, and the violations."""

    epoch: int | None
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    skipped_no_signal: int = 0
    never_dispatched: int = 0
    trained_twice: list[str] = field(default_factory=list)
    no_fate: list[str] = field(default_factory=list)

    @property
    def dispatched(self) -> int:
        return sum(self.counts.values())


@dataclass
class AuditReport:
    """The audit of one fates file against one dataset."""

    source: str
    num_lines: int
    dataset_size: int
    epochs: list[EpochAudit]
    unknown_prompts: list[str]
    conflicting_groups: list[int]
    train_data: TrainDataAudit | None = None  # None: not checked (no train data written, or fates only)

    @property
    def trained_twice(self) -> int:
        return sum(len(e.trained_twice) for e in self.epochs)

    @property
    def without_fate(self) -> int:
        return sum(len(e.no_fate) for e in self.epochs)

    @property
    def ok(self) -> bool:
        fates_ok = not (self.trained_twice or self.without_fate or self.unknown_prompts or self.conflicting_groups)
        return fates_ok and (self.train_data is None or self.train_data.ok)

    def format(self) -> str:
        """The human-readable report: a table per epoch, then every violation found."""
        header: list[object] = ["epoch", "dispatched", *CATEGORIES, SKIPPED, "never dispatched", "trained twice"]
        rows: list[list[object]] = [
            [_epoch_name(e.epoch), e.dispatched, *(e.counts[c] for c in CATEGORIES), e.skipped_no_signal,
             e.never_dispatched, len(e.trained_twice)]
            for e in self.epochs
        ]  # fmt: skip
        widths = [max(len(str(x)) for x in column) for column in zip(*[header, *rows], strict=True)]
        table = [
            "  ".join(str(x).rjust(w) for x, w in zip(row, widths, strict=True)) for row in [header, *rows]
        ]
        out = [
            f"audit of {self.source}: {self.num_lines} fate lines, {self.dataset_size} training prompts, "
            f"{len(self.epochs)} epoch(s)",
            *table,
        ]
        for e in self.epochs:
            out += _listing(f"epoch {_epoch_name(e.epoch)}: trained twice", e.trained_twice)
            out += _listing(f"epoch {_epoch_name(e.epoch)}: dispatched without a fate", e.no_fate)
        out += _listing("fate lines name prompts the dataset does not have", self.unknown_prompts)
        out += _listing("group ids whose lines name different prompts", [str(g) for g in self.conflicting_groups])
        if self.train_data is not None:
            out += self.train_data.format_lines()
        data_ok = " and train_data matches them" if self.train_data is not None else ""
        if self.ok:
            out.append(f"OK: no prompt trained twice in an epoch, every dispatched prompt has a fate{data_ok}")
        else:
            data = f", {self.train_data.violations} train_data problem(s)" if self.train_data is not None else ""
            out.append(
                f"FAILED: {self.trained_twice} prompt(s) trained twice in an epoch, {self.without_fate} dispatched "
                f"prompt(s) without a fate, {len(self.unknown_prompts)} unknown prompt(s), "
                f"{len(self.conflicting_groups)} conflicting group id(s){data}"
            )
        return "\n".join(out)


def _epoch_name(epoch: int | None) -> str:
    return "?" if epoch is None else str(epoch)


def _listing(title: str, items: Sequence[str]) -> list[str]:
    if not items:
        return []
    more = f" (and {len(items) - _SHOWN} more)" if len(items) > _SHOWN else ""
    return [f"{title}: {', '.join(items[:_SHOWN])}{more}"]


def audit_fates(lines: Sequence[dict[str, Any]], dataset_uids: Sequence[str], source: str = "fates") -> AuditReport:
    """Audit fate ``lines`` (file order) against the training prompts' uids (see the module docstring)."""
    known = set(dataset_uids)
    by_prompt: dict[tuple[int | None, str], list[dict[str, Any]]] = defaultdict(list)
    group_uid: dict[int, str] = {}
    conflicting: set[int] = set()
    for line in lines:
        by_prompt[(line["epoch"], line["prompt_uid"])].append(line)
        if line["group_id"] is None:  # a slot-less line (a prompt waiting to retry at the stop) names no group
            continue
        seen = group_uid.setdefault(line["group_id"], line["prompt_uid"])
        if seen != line["prompt_uid"]:
            conflicting.add(line["group_id"])
    epochs: dict[int | None, EpochAudit] = {}
    for (epoch, uid), prompt_lines in by_prompt.items():
        audit = epochs.setdefault(epoch, EpochAudit(epoch))
        category, times = prompt_outcome(prompt_lines)
        if category == SKIPPED:
            audit.skipped_no_signal += 1
            continue
        audit.counts[category] += 1
        if times > 1:
            audit.trained_twice.append(f"{uid} ({times}x)")
        if category == "no fate":
            audit.no_fate.append(uid)
    numbered = [e for e in epochs if e is not None]
    for epoch in range(max(numbered) + 1 if numbered else 0):
        epochs.setdefault(epoch, EpochAudit(epoch))
    for epoch, audit in epochs.items():
        if epoch is not None:
            seen_uids = {uid for (e, uid) in by_prompt if e == epoch}
            audit.never_dispatched = len(known - seen_uids)
        audit.trained_twice.sort()
        audit.no_fate.sort()
    ordered = sorted(epochs.values(), key=lambda e: (e.epoch is None, e.epoch or 0))
    unknown = sorted({uid for (_, uid) in by_prompt} - known)
    return AuditReport(source, len(lines), len(known), ordered, unknown, sorted(conflicting))


TrainingUids = Callable[["RunConfig", bool], Sequence[str]]
"""The uids of the prompts a run trained on, from its config and whether it was simulated (the caller knows where
prompts come from: a task, or the simulator's workload; :func:`groupwise.cli.run_prompts.training_uids`)."""


def audit_run(run_dir: str | Path, training_uids: TrainingUids) -> AuditReport:
    """Audit ``RUN_DIR/fates.jsonl`` against the training prompts of the run's own ``config.yaml``."""
    from groupwise.config import config_from_dict
    from groupwise.config.load import read_config_file
    from groupwise.run.rundir import RunDir

    run = RunDir.of(Path(run_dir))
    for path, what in ((run.config_path, "config.yaml"), (run.fates_path, "fates.jsonl")):
        if not path.is_file():
            raise FileNotFoundError(
                f"{run.path} has no {what}; give the directory of a run that groupwise train wrote (runs/<name>)"
            )
    # a config.yaml that is not YAML, or not a valid config, is a ConfigError naming the file (exit 2, no traceback)
    cfg = config_from_dict(read_config_file(run.config_path), source=str(run.config_path))
    lines = read_fates(run.fates_path)
    report = audit_fates(lines, training_uids(cfg, run.is_simulation), source=str(run.path))
    if not run.is_simulation:  # the simulator trains no model and writes no train_data
        report.train_data = audit_train_data(run, lines, cfg)
    return report
