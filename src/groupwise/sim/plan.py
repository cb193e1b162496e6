"""``groupwise plan``: simulate one job under every setting of a grid and rank them (``docs/simulator.md``).

The job is a config with ``sim.job`` (and optionally ``sim.plan``, the grid; :class:`PlanSection` defaults
otherwise). Each point of the grid is the job's config with these keys replaced, then validated like any config:

* sync: ``mode: sync``, every GPU both generates and trains (``cluster.colocated: true``, ``rollout_gpus =
  train_gpus =`` the job's ``rollout_gpus + train_gpus``), no ``async`` section;
* async: ``mode: async``, ``async.sampler`` (``name`` and its window knob), ``async.partial_rollouts`` (off: each
  weight sync waits for the engines to drain, ``sim.weight_sync_drains: true``, as an engine holding one copy of the
  weights must; continue: no sync waits), the GPUs split by a rollout fraction (rounded to whole replicas, at least
  one replica and one training GPU), ``async.max_buffered_rollouts`` raised to the sampler's need ``P × (window +
  1)``, ``async.max_inflight_prompts`` = enough prompts to fill every replica (``⌈replicas × max_seqs / G⌉``, at most
  the buffer), ``loss.importance_sampling: true``, and ``on_dropped_prompt: shrink`` for ``windowed`` (it keeps no
  spare pool).

Each point runs the real sync loop or controller without writing files, first over ``sim.plan.screen_steps``
steps (6 by default), then — the sync point and the ``sim.plan.finalists`` fastest async points only — over
``sim.plan.steps`` steps (30) standing for the run's ``run.max_steps``: what changes by weight version over the
run — the median length's drift and the learning curve — is compressed into them (``drift_steps`` and
``sim.learning_rate_groups`` scaled by ``steps / run.max_steps``), so the mean step covers the whole run;
``steps: null`` simulates every step, ``screen_steps: null`` every point in full. Its row: time per step
(virtual wall ÷ steps), trained completion tokens per second, generator utilisation (share of replica-time with
a sequence running or waiting), staleness p99 and max, wasted share of generated tokens, and the speed-up over
the sync point (trained tokens per second ÷ sync's). The best row is the one :mod:`groupwise.sim.plan_verdict`
stars, if any.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from groupwise.config import ConfigError, ConfigIssue, config_from_dict
from groupwise.config.job_schema import default_plan
from groupwise.controller.settings import ControllerSettings
from groupwise.sim.job_checks import (
    check_cluster,
    check_job,
    check_layout,
    episode_issues,
    training_memory_issue,
    uses_reference,
)
from groupwise.sim.plan_verdict import VERL_H20, error_band, star
from groupwise.sim.simulation import SimRun, simulate_async, simulate_sync
from groupwise.sim.summary import summarize
from groupwise.sim.workload import SimWorkload
from groupwise.trainer.preflight import prompt_count_issues

if TYPE_CHECKING:
    from groupwise.config import RunConfig
    from groupwise.config.job_schema import JobSection

#: The error band of every plan's speed-ups (:mod:`groupwise.sim.plan_verdict`).
CALIBRATION_BAND = error_band(VERL_H20.speedup_log_errors)
WINDOW_KNOB = {"in_order": "max_lookahead_versions", "ready_first": "max_staleness_versions",
               "windowed": "max_staleness_versions"}  # fmt: skip


@dataclass(frozen=True)
class PlanPoint:
    """One setting of the grid."""

    mode: str
    rollout_gpus: int
    train_gpus: int
    sampler: str | None = None
    window: int | None = None
    partial_rollouts: str | None = None

    @property
    def verdict_name(self) -> str:
        """The setting in a verdict sentence: ``async ready_first, staleness 2, partial continue, split 24:8``."""
        if self.mode == "sync":
            return f"sync, colocated on {self.rollout_gpus} GPUs"
        knob = "lookahead" if self.sampler == "in_order" else "staleness"
        return (f"async {self.sampler}, {knob} {self.window}, partial {self.partial_rollouts}, split "
                f"{self.rollout_gpus}:{self.train_gpus}")  # fmt: skip

    @property
    def label(self) -> str:
        if self.mode == "sync":
            return f"sync, colocated on {self.rollout_gpus} GPUs"
        knob = "lookahead" if self.sampler == "in_order" else "staleness"
        return (f"async {self.sampler} {knob} {self.window}, partial {self.partial_rollouts}, "
                f"{self.rollout_gpus}:{self.train_gpus} GPUs")  # fmt: skip


@dataclass
class PlanRow:
    """What one point predicts (``error`` when it stopped with a named error)."""

    point: PlanPoint
    steps: int = 0
    step_seconds: float | None = None
    trained_tokens_per_s: float | None = None
    generator_utilisation: float | None = None
    staleness_p99: int | None = None
    staleness_max: int | None = None
    waste_fraction: float | None = None
    speedup: float | None = None
    run_hours: float | None = None  # time per step × run.max_steps
    error: str | None = None
    best: bool = False
    screened: bool = False  # simulated for sim.plan.screen_steps only: not a finalist
    summary: dict[str, Any] = field(default_factory=dict, repr=False)


def plan_points(cfg: RunConfig) -> list[PlanPoint]:
    """Every point of the grid ``cfg.sim.plan`` (its defaults when unset) for the job's GPUs."""
    job = cfg.sim.job
    if job is None:
        raise ConfigError([ConfigIssue("sim.job", None, "groupwise plan needs a job to plan: sim.job is not set",
                                       "describe the job under sim.job (see examples/plan/)")])  # fmt: skip
    grid = cfg.sim.plan or default_plan()
    total = all_gpus(job)
    tp = job.cluster.tensor_parallel
    points: list[PlanPoint] = []
    if "sync" in grid.modes:
        points.append(PlanPoint("sync", total, total))
    if "async" in grid.modes:
        splits = sorted({split_gpus(total, fraction, tp) for fraction in grid.rollout_fractions})
        for rollout, train in splits:
            for sampler in grid.samplers:
                for window in grid.windows:
                    for partial in grid.partial_rollouts:
                        points.append(PlanPoint("async", rollout, train, sampler, window, partial))
    return points


def all_gpus(job: JobSection) -> int:
    """The job's GPUs: ``rollout_gpus``, plus ``train_gpus`` unless colocated (the sync point's)."""
    return job.cluster.rollout_gpus + (0 if job.cluster.colocated else job.cluster.train_gpus)


def split_gpus(total: int, fraction: float, tensor_parallel: int) -> tuple[int, int]:
    """``(rollout, train)`` GPUs: ``fraction × total`` rounded to whole replicas, at least one replica and one
    training GPU."""
    replicas = max(1, round(fraction * total / tensor_parallel))
    replicas = min(replicas, (total - 1) // tensor_parallel)
    if replicas < 1:
        raise ConfigError([ConfigIssue(
            "sim.job.cluster.rollout_gpus", total, f"{total} GPUs cannot hold one rollout replica of tensor_parallel "
            f"{tensor_parallel} GPUs and one training GPU in async mode", "plan more GPUs, or lower tensor_parallel",
        )])  # fmt: skip
    return replicas * tensor_parallel, total - replicas * tensor_parallel


def point_config(cfg: RunConfig, point: PlanPoint, steps: int | None | Literal["plan"] = "plan") -> RunConfig:
    """The job's config at ``point`` (see the module docstring) simulated for ``steps`` steps (``"plan"``:
    ``sim.plan.steps``; ``None``: every step), validated."""
    data = cfg.model_dump(mode="json", by_alias=True)
    data["mode"] = point.mode
    sim = data["sim"]
    sim["write_fates"] = False
    if steps == "plan":
        steps = (cfg.sim.plan or default_plan()).steps
    if steps is not None and cfg.run.max_steps is not None and steps < cfg.run.max_steps:
        scale = steps / cfg.run.max_steps  # the run in fewer steps: what moves by version moves faster
        data["run"]["max_steps"] = steps
        lengths = sim["job"]["lengths"]
        lengths["drift_steps"] = max(1, round(lengths["drift_steps"] * scale))
        sim["learning_rate_groups"] = sim["learning_rate_groups"] * scale
    cluster = sim["job"]["cluster"]
    cluster.update(rollout_gpus=point.rollout_gpus, train_gpus=point.train_gpus, colocated=point.mode == "sync")
    if point.mode == "sync":
        grid = cfg.sim.plan or default_plan()
        if grid.sync_tensor_parallel is not None:
            cluster["tensor_parallel"] = grid.sync_tensor_parallel
        if grid.sync_memory_fraction is not None:
            cluster["memory_fraction"] = grid.sync_memory_fraction
        if grid.sync_train_layout is not None:
            sim["job"]["train_layout"] = grid.sync_train_layout.model_dump(mode="json")
        data.pop("async", None)
        sim["weight_sync_drains"] = False
        return config_from_dict(data)
    assert point.sampler is not None and point.window is not None
    P, G = cfg.grpo.num_prompts_per_step, cfg.grpo.num_generations_per_prompt
    section = data["async"]
    capacity = max(section["max_buffered_rollouts"], P * (point.window + 1))
    replicas = point.rollout_gpus // cluster["tensor_parallel"]
    section.update(
        sampler={"name": point.sampler, WINDOW_KNOB[point.sampler]: point.window},
        partial_rollouts=point.partial_rollouts, max_buffered_rollouts=capacity,
        max_inflight_prompts=min(capacity, math.ceil(replicas * cluster["max_seqs_per_replica"] / G)),
    )  # fmt: skip
    if point.partial_rollouts == "off":
        section["partial_rollout_kv"] = "recompute"
    if point.sampler == "windowed":
        section["rollout_failure"] = {**section["rollout_failure"], "on_dropped_prompt": "shrink"}
        for key in ("max_replacement_attempts", "replacement_reserve_prompts"):
            section["rollout_failure"].pop(key, None)
    sim["weight_sync_drains"] = point.partial_rollouts == "off"
    data["loss"]["importance_sampling"] = True
    return config_from_dict(data)


def simulate_point(cfg: RunConfig) -> tuple[SimRun, dict[str, Any]]:
    """One point's run (no files) and its summary."""
    workload = SimWorkload.from_config(cfg)
    if cfg.mode == "async":
        run = simulate_async(
            ControllerSettings.from_config(cfg), workload, max_epochs=cfg.run.max_epochs, shuffle=cfg.data.shuffle,
            max_virtual_seconds=cfg.sim.max_virtual_seconds,
            partial_rollouts=cfg.async_.partial_rollouts == "continue",
            recompute_kv=cfg.async_.partial_rollout_kv == "recompute",
        )  # fmt: skip
    else:
        run = simulate_sync(cfg.grpo, cfg.run.max_steps, workload, max_epochs=cfg.run.max_epochs,
                            shuffle=cfg.data.shuffle, max_virtual_seconds=cfg.sim.max_virtual_seconds)  # fmt: skip
    return run, summarize(run, {"mode": cfg.mode}, None)


def point_row(cfg: RunConfig, point: PlanPoint, steps: int | None | Literal["plan"] = "plan") -> PlanRow:
    """Simulate ``point`` of ``cfg`` for ``steps`` steps (as :func:`point_config`) and read its row; a point whose
    trainer cannot hold the model, or whose training GPUs the layout does not divide, is a failed row, not
    simulated."""
    at_point = point_config(cfg, point, steps)
    assert at_point.sim.job is not None  # plan_points refuses a config without one
    layout = check_layout(at_point.sim.job, point.train_gpus)
    if layout:
        return PlanRow(point, error=f"the training layout does not fit this split ({layout[0].rule})")
    memory = training_memory_issue(at_point.sim.job, point.train_gpus, uses_reference(cfg))
    if memory is not None:
        return PlanRow(point, error=f"training does not fit ({memory.rule}; {memory.fix})")
    run, summary = simulate_point(at_point)
    row = PlanRow(point, steps=run.steps_trained, summary=summary, error=summary["error"])
    wall = run.wall_seconds
    if run.steps_trained and wall > 0:
        row.step_seconds = wall / run.steps_trained
        row.run_hours = row.step_seconds * (cfg.run.max_steps or run.steps_trained) / 3600
        row.trained_tokens_per_s = (summary["trained_tokens"] or 0) / wall
        row.generator_utilisation = summary.get("generator_busy_fraction")
        row.staleness_p99, row.staleness_max = summary["staleness_p99"], summary["staleness_max"]
        row.waste_fraction = summary["waste_fraction"]
    return row


def _row_of(args: tuple[dict[str, Any], PlanPoint, int | None]) -> PlanRow:
    data, point, steps = args
    return point_row(config_from_dict(data), point, steps)


def simulate_rows(cfg: RunConfig, points: list[PlanPoint], steps: int | None, jobs: int = 1,
                  on_row: Callable[[PlanRow], None] | None = None) -> list[PlanRow]:
    """Each point simulated for ``steps`` steps (``jobs`` processes), rows in the points' order."""
    rows: list[PlanRow] = []
    if jobs <= 1:
        rows_made: Iterable[PlanRow] = (point_row(cfg, point, steps) for point in points)
        for row in rows_made:
            rows.append(row)
            if on_row is not None:
                on_row(row)
        return rows
    data = cfg.model_dump(mode="json", by_alias=True)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for row in pool.map(_row_of, [(data, point, steps) for point in points]):
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def finalists(screened: list[PlanRow], count: int) -> list[PlanPoint]:
    """The points the screen passes on: the sync point and the ``count`` async points with the highest speed-up
    (ties: fewer wasted tokens), in grid order; the rows' speed-ups must be marked."""
    ranked = sorted((r for r in screened if r.point.mode == "async" and r.speedup is not None),
                    key=lambda r: (-(r.speedup or 0.0), r.waste_fraction or 0.0))  # fmt: skip
    chosen = {r.point for r in ranked[:count]} | {r.point for r in screened if r.point.mode == "sync"}
    return [r.point for r in screened if r.point in chosen]


def plan_issues(cfg: RunConfig) -> list[ConfigIssue]:
    """Everything ``groupwise plan`` (and ``groupwise config check`` on a config with ``sim.job``) refuses, every
    problem at once: the job's own checks, a step taking more prompts than ``sim.num_prompts`` holds, and each point
    of the grid that does not validate (named with its setting)."""
    job = cfg.sim.job
    issues = check_job(cfg, train_gpus=None if job is None else all_gpus(job))  # the sync point trains on all
    issues.extend(episode_issues(cfg))
    if job is None:
        return issues or plan_points_issues(cfg)
    sync_layout = (cfg.sim.plan or default_plan()).sync_train_layout
    for key, layout in (("sim.job.train_layout", job.train_layout), ("sim.plan.sync_train_layout", sync_layout)):
        if layout is not None and layout.data_parallel is not None:
            issues.append(ConfigIssue(f"{key}.data_parallel", layout.data_parallel, "groupwise plan trains on a "
                                      "different number of GPUs at each point (all of them for sync, each split's "
                                      "share for async), so the data-parallel size is derived there: train_gpus / "
                                      "(tensor_parallel · pipeline_parallel)", f"leave {key}.data_parallel null"))
    job_ok = not issues  # a point of a refused job would repeat the job's issues
    more = f"raise sim.num_prompts (now {cfg.sim.num_prompts})"
    issues.extend(prompt_count_issues(cfg, cfg.sim.num_prompts, more))
    for point in plan_points(cfg) if job_ok else []:
        try:
            at_point = point_config(cfg, point)
            assert at_point.sim.job is not None  # the job's own
            problems = check_cluster(at_point.sim.job, at_point.mode)  # replicas and KV cache at its TP and memory
        except ConfigError as exc:
            problems = list(exc.errors)
        issues.extend(ConfigIssue(i.path, i.value, f"at plan point '{point.label}': {i.rule}", i.fix)
                      for i in problems)  # fmt: skip
    return issues


def plan_points_issues(cfg: RunConfig) -> list[ConfigIssue]:
    """The issue :func:`plan_points` raises (no ``sim.job``), as a list."""
    try:
        plan_points(cfg)
    except ConfigError as exc:
        return list(exc.errors)
    return []


def run_plan(cfg: RunConfig, jobs: int = 1, on_row: Callable[[PlanRow], None] | None = None) -> list[PlanRow]:
    """Simulate the grid (``jobs`` processes) and mark the best; rows in grid order.

    With ``sim.plan.screen_steps`` below ``steps`` every point is first simulated for ``screen_steps`` and only
    the :func:`finalists` again for ``steps``: a screened row keeps its short run's figures (``screened``) and is
    never starred. Every point's config is validated before anything is simulated, so a grid with a bad point
    fails at once with every problem."""
    problems = plan_issues(cfg)
    if problems:
        raise ConfigError(problems)
    points = plan_points(cfg)
    grid = cfg.sim.plan or default_plan()
    full = grid.steps if grid.steps is None or cfg.run.max_steps is None else min(grid.steps, cfg.run.max_steps)
    screen = grid.screen_steps
    if screen is None or (full is not None and screen >= full) or len(points) <= grid.finalists + 1:
        rows = simulate_rows(cfg, points, full, jobs, on_row)
        mark(rows)
        return rows
    rows = simulate_rows(cfg, points, screen, jobs, on_row)
    mark(rows)
    final = finalists(rows, grid.finalists)
    for row in rows:
        row.screened, row.best = True, False  # their speed-ups stay over the screened sync row
    refined = dict(zip(final, simulate_rows(cfg, final, full, jobs, on_row), strict=True))
    rows = [refined.get(row.point, row) for row in rows]
    mark(rows)
    return rows


def mark(rows: Iterable[PlanRow], band: float = CALIBRATION_BAND) -> None:
    """Speed-ups over the sync row (the first row if there is none) — trained tokens per second ÷ its, which is
    its time per step ÷ theirs when every step trains the same tokens — and the best row, the one
    :func:`~groupwise.sim.plan_verdict.star` recommends given the error ``band`` (none when sync and async are
    within it). Screened rows are left as they are."""
    rows = list(rows)
    done = [r for r in rows if r.trained_tokens_per_s and r.error is None and not r.screened]
    if not done:
        return
    base = next((r for r in done if r.point.mode == "sync"), done[0])
    for row in done:
        assert row.trained_tokens_per_s is not None and base.trained_tokens_per_s is not None
        row.speedup = row.trained_tokens_per_s / base.trained_tokens_per_s
    chosen = star(done, band)
    if chosen is not None:
        chosen.best = True


TABLE_HEADER = (
    "| setting | simulated steps | s/step | run h | trained tok/s | speed-up | generator busy | staleness p99 / max "
    "| wasted tokens |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
)


def format_table(rows: Iterable[PlanRow]) -> str:
    """The rows as a markdown table, the best one in bold with a ★; a screened row's steps say "(screen)"."""
    lines = list(TABLE_HEADER)
    for r in rows:
        if r.step_seconds is None:
            lines.append(f"| {r.point.label} | {r.steps} | — | — | — | — | — | — | failed: {r.error} |")
            continue
        label = f"**★ {r.point.label}**" if r.best else r.point.label
        util = "—" if r.generator_utilisation is None else f"{r.generator_utilisation:.0%}"
        waste = "—" if r.waste_fraction is None else f"{r.waste_fraction:.1%}"
        note = "" if r.error is None else f" (stopped: {r.error})"
        steps = f"{r.steps} (screen)" if r.screened else str(r.steps)
        lines.append(
            f"| {label}{note} | {steps} | {r.step_seconds:,.1f} | {r.run_hours or 0:,.1f} | "
            f"{r.trained_tokens_per_s or 0:,.0f} | {r.speedup or 0:.2f}× | "
            f"{util} | {r.staleness_p99} / {r.staleness_max} | {waste} |"
        )
    return "\n".join(lines)


def rows_json(rows: Iterable[PlanRow]) -> list[dict[str, Any]]:
    """The rows as plain JSON-able dicts (the point flattened in, the run summary left out)."""
    out = []
    for r in rows:
        item = asdict(r)
        item.pop("summary")
        item.update(item.pop("point"))
        item["label"] = r.point.label
        out.append(item)
    return out
