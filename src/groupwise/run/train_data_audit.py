"""The ``train_data`` part of ``groupwise audit``: the step files agree with ``fates.jsonl``, and every trained token
is within the sampler's staleness bound.

``train_data/step_<N>.jsonl`` holds the rows step N trained: RL step ``N − 1`` (0-based, as ``step`` in a fate
line), trained by the weights of version ``N − 1``. Each row carries ``version_spans``, its completion's per-token
weight versions run-length encoded (``[[v, n], ...]``: n consecutive tokens sampled under version v). The checks:

* **files match the fates** — a file exists for exactly the steps with ``trained`` fate lines (a file without them
  is a step a resume undid and left behind), it holds exactly those group ids, each with G rows; a step whose
  metrics line was written but whose file is missing lost its rows (a run stopped inside a step has neither);
* **spans are whole** — the spans of a row cover its ``completion_ids`` exactly, and start no earlier than the
  group's ``start_version`` (the version it was dispatched under);
* **no token from the future** — no version exceeds the trainer's (``N − 1``);
* **the staleness bound** — for the samplers that bound the staleness of what they train, no token is older than
  the bound: ``(N − 1) − v ≤ bound`` (:func:`staleness_bound`).

Nothing here imports torch or the simulator.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from groupwise.run.metrics import read_metrics
from groupwise.run.rundir import RunDir

if TYPE_CHECKING:
    from groupwise.config import RunConfig

_SHOWN = 10


def staleness_bound(cfg: RunConfig) -> tuple[int | None, str]:
    """``(bound, what sets it)``: the most versions a trained token may lag its step, or None where the schedule
    bounds no such thing (``ready_first`` selects without a bound; a custom sampler is unknown; a sync run that
    carries surplus groups may carry one several times).

    Async ``windowed`` and ``weight_fifo`` select only groups whose start version is within
    ``max_staleness_versions`` of the trainer; ``in_order`` trains batch d at step d and admits it only once the
    trainer is at most ``max_lookahead_versions`` behind. A sync step trains what the current weights generated.
    Tokens are never older than their group's start version, so the bound holds for every token."""
    if cfg.mode == "sync":
        ds = cfg.grpo.dynamic_sampling
        if ds.enabled and ds.surplus == "carry":
            return None, "sync with grpo.dynamic_sampling.surplus carry"
        return 0, "sync (each step trains what the current weights generated)"
    sampler = cfg.async_.sampler
    if sampler.name in ("windowed", "weight_fifo"):
        return sampler.max_staleness_versions, f"async.sampler {sampler.name} max_staleness_versions"
    if sampler.name == "in_order":
        return sampler.max_lookahead_versions, "async.sampler in_order max_lookahead_versions"
    return None, f"async.sampler {sampler.name} (no bound on selection)"


@dataclass
class TrainDataAudit:
    """What the train_data checks found (each list: offending steps or rows, as text)."""

    files: int = 0
    rows: int = 0
    bound: int | None = None
    bound_source: str = ""
    max_staleness: int | None = None
    extra_files: list[str] = field(default_factory=list)
    missing_files: list[str] = field(default_factory=list)
    group_mismatches: list[str] = field(default_factory=list)
    bad_spans: list[str] = field(default_factory=list)
    future_tokens: list[str] = field(default_factory=list)
    too_stale: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return sum(len(v) for v in (self.extra_files, self.missing_files, self.group_mismatches, self.bad_spans,
                                    self.future_tokens, self.too_stale))  # fmt: skip

    @property
    def ok(self) -> bool:
        return self.violations == 0

    def format_lines(self) -> list[str]:
        """The audit's train_data lines: what was checked, then every kind of violation found."""
        bound = "no bound checked" if self.bound is None else f"bound {self.bound}"
        out = [f"train_data: {self.files} step file(s), {self.rows} row(s); token staleness max "
               f"{'-' if self.max_staleness is None else self.max_staleness} ({bound}: {self.bound_source})"]
        for title, items in (
            ("train_data files of steps with no trained fates (left by an undone step)", self.extra_files),
            ("steps with trained fates and a metrics line but no train_data file", self.missing_files),
            ("train_data groups that differ from the trained fates", self.group_mismatches),
            ("rows whose version_spans do not cover their tokens", self.bad_spans),
            ("rows with a token from a version later than the trainer's", self.future_tokens),
            ("rows with a token older than the staleness bound", self.too_stale),
        ):
            if items:
                more = f" (and {len(items) - _SHOWN} more)" if len(items) > _SHOWN else ""
                out.append(f"{title}: {', '.join(items[:_SHOWN])}{more}")
        return out


def audit_train_data(run_dir: RunDir, fate_lines: Sequence[dict[str, Any]], cfg: RunConfig) -> TrainDataAudit | None:
    """Check ``run_dir``'s train_data files against ``fate_lines`` (see the module docstring); None when the run
    writes no train data (``logging.train_data: false``)."""
    if not cfg.logging.train_data:
        return None
    bound, source = staleness_bound(cfg)
    audit = TrainDataAudit(bound=bound, bound_source=source)
    trained: dict[int, set[int]] = defaultdict(set)
    for line in fate_lines:
        if line["fate"] == "trained" and line["step"] is not None:
            trained[line["step"] + 1].add(line["group_id"])
    files = dict(run_dir.train_data_files())
    logged = {int(r["step"]) for r in read_metrics(run_dir.metrics_path) if "loss/total" in r} \
        if run_dir.metrics_path.is_file() else set()  # fmt: skip
    audit.extra_files = [f"step_{n}.jsonl" for n in sorted(set(files) - set(trained))]
    audit.missing_files = [f"step {n}" for n in sorted((set(trained) - set(files)) & logged)]
    size = cfg.grpo.num_generations_per_prompt
    for number, path in sorted(files.items()):
        rows = [json.loads(text) for text in path.read_text(encoding="utf-8").splitlines() if text.strip()]
        audit.files += 1
        audit.rows += len(rows)
        _check_groups(audit, number, rows, trained.get(number, set()), size)
        for index, row in enumerate(rows, start=1):
            _check_row(audit, number, index, row)
    return audit


def _check_groups(audit: TrainDataAudit, number: int, rows: list[dict[str, Any]], fated: set[int],
                  size: int) -> None:  # fmt: skip
    per_group: dict[int, int] = defaultdict(int)
    for row in rows:
        per_group[row["group_id"]] += 1
    if fated and set(per_group) != fated:
        only_file, only_fates = sorted(set(per_group) - fated), sorted(fated - set(per_group))
        audit.group_mismatches.append(f"step {number} (only in the file: {only_file}, only in fates: {only_fates})")
    short = sorted(g for g, n in per_group.items() if n != size)
    if short:
        audit.group_mismatches.append(f"step {number} (groups without {size} rows: {short})")


def _check_row(audit: TrainDataAudit, number: int, index: int, row: dict[str, Any]) -> None:
    where = f"step {number} line {index}"
    spans = row.get("version_spans")
    if spans is None:
        return  # written before train_data carried versions
    covered = sum(count for _, count in spans)
    if covered != len(row["completion_ids"]) or any(count < 1 for _, count in spans):
        audit.bad_spans.append(f"{where} ({covered} tokens in spans, {len(row['completion_ids'])} in the completion)")
        return
    if not spans:
        return
    versions = [version for version, _ in spans]
    trainer = number - 1
    if min(versions) < row["start_version"]:
        audit.bad_spans.append(f"{where} (a token of version {min(versions)} before start_version "
                               f"{row['start_version']})")
    if max(versions) > trainer:
        audit.future_tokens.append(f"{where} (version {max(versions)} at trainer version {trainer})")
    staleness = trainer - min(versions)
    audit.max_staleness = staleness if audit.max_staleness is None else max(audit.max_staleness, staleness)
    if audit.bound is not None and staleness > audit.bound:
        audit.too_stale.append(f"{where} (staleness {staleness} > {audit.bound})")
