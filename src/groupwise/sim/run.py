"""``groupwise simulate``: run a config in virtual time and write a run directory like a real run's.

Writes ``config.yaml`` (resolved), ``metrics.jsonl`` (one line per optimizer step, the keys a real run of the
same mode logs, with simulated ``perf/*``), ``events.log``, ``tensorboard/`` (when ``logging.tensorboard``),
``fates.jsonl`` (when ``sim.write_fates``; the lines of :mod:`groupwise.run.fates_file`, as a real run of the same mode
writes them) and ``sim/summary.json``
(:mod:`groupwise.sim.summary`). There is no model: no checkpoints, ``train_data/`` or ``final/``.

The simulation reads ``mode``, ``run`` (name, output_dir, seed, max_steps, max_epochs), ``data.shuffle``,
``grpo`` (P, G, dynamic sampling), ``async`` and ``sim``; the model, generation, loss, optimizer, eval and
checkpoint sections describe a real run and are not simulated. The same config and seed give the same
``summary.json``, ``metrics.jsonl`` and ``fates.jsonl`` byte for byte.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from groupwise.config import ConfigError, ConfigIssue
from groupwise.config.issues import warning_line
from groupwise.controller.settings import ControllerSettings
from groupwise.run.fates_file import LINE_FIELDS as FATE_FIELDS
from groupwise.run.fates_file import FatesWriter
from groupwise.run.metrics import MetricsWriter
from groupwise.run.rundir import RunDir, write_text_atomic
from groupwise.run.trackers import config_trackers
from groupwise.sim.job_checks import check_job, episode_issues
from groupwise.sim.simulation import SimRun, simulate_async, simulate_sync
from groupwise.sim.summary import summarize
from groupwise.sim.workload import SimWorkload
from groupwise.trainer.preflight import prompt_count_issues
from groupwise.types import Group

if TYPE_CHECKING:
    from groupwise.config import RunConfig


def check_sync_workload(workload: SimWorkload) -> list[ConfigIssue]:
    """Issues for injected failures in mode sync (the real sync loop would stop at the first one), and for a
    draining weight sync (a sync round has ended before its weight sync: there is nothing to drain)."""
    issues = [
        ConfigIssue(
            f"sim.{name}",
            getattr(workload, name),
            f"sim.{name} injects rollout failures, but the sync loop has no failure handling (a real sync run "
            "stops at the first failed rollout), so the simulation would only show that",
            f"set sim.{name}: 0 for a sync simulation, or simulate mode: async",
        )
        for name in ("infra_failure_rate", "data_failure_rate")
        if getattr(workload, name) > 0
    ]
    if workload.weight_sync_drains:
        issues.append(ConfigIssue(
            "sim.weight_sync_drains", True, "sim.weight_sync_drains has no effect in mode sync: every round has "
            "ended before its weight sync, so there is nothing in flight to drain",
            "remove sim.weight_sync_drains, or simulate mode: async",
        ))  # fmt: skip
    return issues


def check_async_workload(cfg: RunConfig, workload: SimWorkload) -> list[ConfigIssue]:
    """A draining weight sync with partial rollouts on: they never drain (the update reaches the generations in
    flight), so the key would have no effect."""
    if workload.weight_sync_drains and cfg.async_.partial_rollouts == "continue":
        return [ConfigIssue(
            "sim.weight_sync_drains", True, "sim.weight_sync_drains has no effect with async.partial_rollouts: "
            "continue: the weight update reaches the generations in flight, so no sync waits for them",
            "remove sim.weight_sync_drains (it describes a sync under partial_rollouts: off)",
        )]  # fmt: skip
    return []


def check_engine_keys(cfg: RunConfig) -> list[ConfigIssue]:
    """Engine keys the simulator has no use for: its slots take a completion as soon as one frees (continuous
    batching always), the toy model does not charge the KV rebuild of a partial rollout (the job model does, so
    ``async.partial_rollout_kv`` acts with ``sim.job``), and its engine is a cost model whatever backend would
    generate in training."""
    issues = []
    if cfg.generation.backend != "builtin":
        issues.append(ConfigIssue(
            "generation.backend", cfg.generation.backend, "generation.backend has no effect in a simulation: the "
            "simulated engine is a cost model (the sim section), whichever backend would generate in training",
            "remove generation.backend (and generation.vllm) for groupwise simulate",
        ))  # fmt: skip
    if cfg.generation.continuous_batching:
        issues.append(ConfigIssue(
            "generation.continuous_batching", True, "generation.continuous_batching has no effect in a simulation: "
            "the simulated engine books each completion on the slot that frees first (continuous batching always)",
            "remove generation.continuous_batching for groupwise simulate",
        ))  # fmt: skip
    if cfg.async_.partial_rollout_kv != "recompute" and cfg.sim.job is None:
        issues.append(ConfigIssue(
            "async.partial_rollout_kv", cfg.async_.partial_rollout_kv, "async.partial_rollout_kv has no effect in a "
            "simulation: it does not charge rebuilding the KV cache of rows that go on under new weights",
            "remove async.partial_rollout_kv for groupwise simulate",
        ))  # fmt: skip
    return issues


def simulation_issues(cfg: RunConfig, workload: SimWorkload) -> list[ConfigIssue]:
    """Everything the simulation refuses in ``cfg``, each key once (the job checks name the toy failure keys too)."""
    issues = check_sync_workload(workload) if cfg.mode == "sync" else check_async_workload(cfg, workload)
    issues.extend(episode_issues(cfg))
    issues.extend(check_engine_keys(cfg))
    # the simulated prompts feed the real loader: fewer than one round takes would put a prompt twice in a step
    issues.extend(prompt_count_issues(cfg, workload.num_prompts, f"raise sim.num_prompts (now {workload.num_prompts})"))
    job_issues = check_job(cfg)
    named = {issue.path for issue in job_issues}
    return [issue for issue in issues if issue.path not in named] + job_issues


@dataclass
class SimulationResult:
    """The run directory written, its summary, and the in-memory run (parts, controller, meter)."""

    run_dir: RunDir
    summary: dict[str, Any]
    run: SimRun


def summary_identity(cfg: RunConfig) -> dict[str, Any]:
    """The identity fields of a summary: mode, sampler and knobs (async), seed, P, G."""
    sampler: dict[str, Any] = cfg.async_.sampler.model_dump(mode="json") if cfg.mode == "async" else {}
    return {
        "mode": cfg.mode,
        "sampler": sampler.pop("name", None),
        "sampler_knobs": sampler,
        "seed": cfg.run.seed,
        "prompts_per_step": cfg.grpo.num_prompts_per_step,
        "group_size": cfg.grpo.num_generations_per_prompt,
    }


def simulate(cfg: RunConfig) -> SimulationResult:
    """Simulate ``cfg`` (a ``RunConfig``) and write its run directory (see the module docstring).

    Raises :class:`ConfigError` for a setup the simulation refuses (failures injected in mode sync, a draining
    weight sync where nothing can drain) and ``RunDirError`` when the run directory exists; a run that stops with a
    named error still writes everything and reports ``outcome: failed`` with the error in the summary.
    """
    workload = SimWorkload.from_config(cfg)
    issues = simulation_issues(cfg, workload)
    if issues:
        raise ConfigError(issues)
    run_dir = RunDir.create(cfg.run.output_dir, cfg.run.name, cfg.to_yaml(), resume=False)
    run_dir.sim_summary_path.parent.mkdir()  # first: marks the directory as a simulation's (groupwise audit)
    writer = MetricsWriter(run_dir, trackers=config_trackers(cfg, run_dir.root))
    last_reward: list[float | None] = [None]

    def on_step_end(step: int, metrics: dict[str, float], groups: list[Group]) -> None:
        writer.log(step + 1, {**metrics, "step": step + 1, "weight_version": step + 1})
        reward = metrics.get("reward/unfiltered_mean")
        last_reward[0] = reward if reward is not None and math.isfinite(reward) else None

    writer.event(f"simulate: mode {cfg.mode}, seed {cfg.run.seed}, up to {cfg.run.max_steps} steps (virtual time)")
    for issue in cfg.warnings():
        writer.event(warning_line(issue))
    fates = BufferedFatesWriter(run_dir.fates_path) if cfg.sim.write_fates else None
    try:
        if cfg.mode == "async":
            run = simulate_async(
                ControllerSettings.from_config(cfg), workload, max_epochs=cfg.run.max_epochs,
                shuffle=cfg.data.shuffle, on_step_end=on_step_end,
                on_fate=fates.write_controller_record if fates is not None else None,
                max_virtual_seconds=cfg.sim.max_virtual_seconds,
                partial_rollouts=cfg.async_.partial_rollouts == "continue",
                recompute_kv=cfg.async_.partial_rollout_kv == "recompute",
            )  # fmt: skip
        else:
            run = simulate_sync(
                cfg.grpo, cfg.run.max_steps, workload, max_epochs=cfg.run.max_epochs, shuffle=cfg.data.shuffle,
                on_step_end=on_step_end, fates=fates, max_virtual_seconds=cfg.sim.max_virtual_seconds,
            )  # fmt: skip
    finally:
        if fates is not None:
            fates.close()
    summary = summarize(run, summary_identity(cfg), last_reward[0])
    write_text_atomic(run_dir.sim_summary_path, json.dumps(summary, indent=2, allow_nan=False) + "\n")
    if run.error is not None:
        writer.event(f"simulated run failed after {run.steps_trained} steps: {summary['error']}")
    writer.event(f"simulated run {summary['outcome']}: {format_summary(summary, one_line=True)}")
    writer.close()
    return SimulationResult(run_dir=run_dir, summary=summary, run=run)


class BufferedFatesWriter(FatesWriter):
    """``fates.jsonl`` in the format of :mod:`groupwise.run.fates_file`, through one buffered handle.

    A real run appends each line with its own ``os.write`` so a crash keeps whole lines; a simulation writes up
    to millions of lines, has no crash to survive, and rewrites its directory from scratch, so it buffers.
    """

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        self._handle: TextIO = open(self.path, "w", encoding="utf-8", buffering=1 << 20)  # noqa: SIM115

    def write(self, line: Mapping[str, Any]) -> None:
        self._handle.write(json.dumps({name: line[name] for name in FATE_FIELDS}, allow_nan=False) + "\n")
        self.lines_written += 1

    def close(self) -> None:
        self._handle.close()


SUMMARY_LINES = (
    ("steps", "steps"),
    ("wall_seconds", "virtual wall time (s)"),
    ("trained_groups_per_hour", "trained groups / h"),
    ("generated_groups", "generated groups"),
    ("filtered_groups", "filtered groups"),
    ("trained_groups", "trained groups"),
    ("dropped_groups", "dropped groups"),
    ("replaced_groups", "replaced groups"),
    ("evicted_groups", "evicted groups"),
    ("aborted_groups", "aborted groups"),
    ("wasted_tokens", "wasted tokens"),
    ("waste_fraction", "wasted share of tokens"),
    ("rollout_idle_fraction", "rollout idle fraction"),
    ("rollout_slot_idle_fraction", "rollout slot idle fraction"),
    ("trainer_idle_fraction", "trainer idle fraction"),
    ("staleness_mean", "staleness mean"),
    ("staleness_p99", "staleness p99"),
    ("staleness_max", "staleness max"),
)


def format_summary(summary: dict[str, Any], one_line: bool = False) -> str:
    """The headline numbers of a summary, one per line (or ``key=value`` pairs on one line)."""
    if one_line:
        return ", ".join(f"{key}={summary.get(key)}" for key, _ in SUMMARY_LINES)
    width = max(len(label) for _, label in SUMMARY_LINES)
    lines = [f"{label:<{width}}  {_cell(summary.get(key))}" for key, label in SUMMARY_LINES]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "—"
    return f"{value:,.3f}" if isinstance(value, float) else f"{value:,}" if isinstance(value, int) else str(value)
