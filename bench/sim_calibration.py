"""The job model against published runs: verl's fully-async recipe, Qwen2.5-Math-7B DAPO on H20 GPUs.

    .venv/bin/python bench/sim_calibration.py                  # fit on the sync rows, predict the rest: the table
    .venv/bin/python bench/sim_calibration.py --no-fit         # the table with the committed constants (FITTED)
    .venv/bin/python bench/sim_calibration.py --steps 30       # shorter runs (a quick look)

Source: volcengine/verl, ``docs/advance/fully_async.md`` (last updated 10/18/2025; the recipe scripts under
``recipe/fully_async_policy/exp/qwen2-7B-math*``). Qwen2.5-Math-7B, DAPO without dynamic sampling, responses up to
28K tokens, n = 16, 512 prompts per step, PPO mini-batch 32 prompts (16 updates per step), vLLM with tensor
parallel 4 and ``gpu_memory_utilization`` 0.8, FSDP2 training with gradient checkpointing; colocated sync recomputes
the old logprobs, fully async takes them from the rollout. Fully async: ``require_batches`` 4 × mini-batch 32 =
streaming chunks of 128 prompts, a parameter sync every 4 of them (every 512 prompts: one RL step here), the
rollouter running at most 16 prompts per vLLM server (``max_concurrent_samples``), partial rollouts on.

What is fitted, on the **synchronous** rows only (generation time and training time = ``old_log_prob +
update_actor`` at 32, 64 and 128 GPUs; least squares of the log ratio): the four constants of
``sim.job.efficiency``. Generation is fitted first on engine-only rounds of 512 × 16 (the sync loop's rounds),
then ``train_mfu`` in closed form (training time is ``compute / train_mfu + updates``).

What is assumed and not fitted (the page does not publish it): the lengths — prompt 150 tokens, completions
log-normal with median 1,200 and p99/p50 = 6, truncated at 28,672 — and the weight syncs (fixed 10 s colocated, the
reshard into vLLM with its wake-up and sleep; 4 s over NCCL for fully async, plus bytes ÷ bandwidth).

A second table is a diagnostic, not a calibration: the async rows again with ``train_mfu`` read off one async figure
(the 64:64 row's published ``update_actor``, in closed form like the sync fit), to separate the trainer's speed,
which the sync rows cannot give, from the pipeline (overlap, staleness gate, partial rollouts) the simulator adds.

How verl's ``staleness_threshold`` s maps onto the controller: s = 0 is ``in_order`` with lookahead 0 (the rollouter
produces one step's prompts per version and the trainer streams them); s > 0 is ``windowed`` (no eviction in these
runs: window 8) with ``max_buffered_rollouts = ⌈(1 + s) · 512⌉`` — at most (1 + s) · 512 prompts generating or
waiting untrained — and ``partial_rollouts: continue`` (a sync pauses the engines and the completions in flight
resume under the new weights after re-prefilling their context). verl counts the quota from the last parameter sync,
the controller frees a prompt's place when the trainer takes it: the controller's gate is up to one step looser.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import math
import platform
import sys
import time
from dataclasses import dataclass
from typing import Any

from groupwise.config import config_from_dict
from groupwise.config.job_schema import JobSection
from groupwise.sim.job_engine import JobEngine, poll_seconds
from groupwise.sim.job_lengths import JobVariates, LengthModel
from groupwise.sim.job_model import JobCosts
from groupwise.sim.plan import simulate_point
from groupwise.sim.virtual_time import run_in_virtual_time

P, G = 512, 16
STEPS_PUBLISHED = 400
#: The constants bench/sim_calibration.py fitted (committed; examples/plan/math_7b_*.yaml carry the same).
FITTED = {"train_mfu": 0.537, "inference_mfu": 0.2177, "decode_bandwidth_efficiency": 0.5862,
          "decode_step_overhead_s": 0.0029}  # fmt: skip
TOLERANCE = 0.15

JOB: dict[str, Any] = {
    "model": {"params": 7.62e9, "layers": 28, "hidden": 3584, "kv_heads": 4, "head_dim": 128},
    "cluster": {"gpu": "H20", "rollout_gpus": 64, "train_gpus": 64, "tensor_parallel": 4,
                "max_seqs_per_replica": 1024, "memory_fraction": 0.8},
    "lengths": {"prompt_tokens": 150, "median_tokens": 1200.0, "p99_over_p50": 6.0, "max_tokens": 28672},
    "training": {"gradient_checkpointing": True},
    "efficiency": dict(FITTED),
}  # fmt: skip


@dataclass(frozen=True)
class Published:
    """One published figure: what it is, its value, and how to compute ours."""

    name: str
    value: float
    unit: str
    fit: bool  # a fit target (sync) rather than a prediction


# The published sync rows (seconds per step): step, gen, old_log_prob + update_actor.
SYNC = {
    32: (790.10, 357.41, 107.71 + 313.81),
    64: (365.28, 150.72, 70.26 + 133.41),
    128: (356.30, 177.85, 53.92 + 113.81),
}
# The published async rows (GPUs → step seconds, speed-up at 400 steps), staleness 0.5.
ASYNC = {32: (294.77, 2.66), 64: (189.26, 1.92), 128: (150.63, 2.35)}
SPEEDUP_128_AT_100 = 2.67
# The staleness ablation at 128 GPUs (64:64), partial rollouts: hours for 400 steps.
ABLATION = {0.0: 25 + 53 / 60, 0.1: 19 + 59 / 60, 0.3: 17 + 20 / 60, 0.5: 17 + 22 / 60}


def config_data(mode: str, gpus: int, efficiency: dict[str, float], steps: int, staleness: float = 0.5,
                median_scale: float = 1.0) -> dict:
    """The run config of one published row (``median_scale``: the completion median's factor, for the length scan)."""
    job = copy.deepcopy(JOB)
    job["efficiency"] = dict(efficiency)
    job["lengths"]["median_tokens"] *= median_scale
    data: dict[str, Any] = {
        "mode": mode, "run": {"name": f"cal-{mode}-{gpus}", "max_steps": steps, "seed": 0},
        "model": {"source": "tiny"}, "logging": {"tensorboard": False},
        "grpo": {"num_prompts_per_step": P, "num_generations_per_prompt": G, "dynamic_sampling": {"enabled": False}},
        "optimizer": {"mini_batches_per_step": 16},
        "sim": {"num_prompts": 17_398, "write_fates": False, "job": job},  # DAPO-Math-17k
    }  # fmt: skip
    cluster = job["cluster"]
    if mode == "sync":
        cluster.update(rollout_gpus=gpus, train_gpus=gpus, colocated=True)
        job["training"]["recompute_old_logprobs"] = True
        job["weight_sync"] = {"fixed_s": 10.0}
        return data
    cluster.update(rollout_gpus=gpus // 2, train_gpus=gpus // 2, max_seqs_per_replica=256)
    job["weight_sync"] = {"fixed_s": 4.0}
    servers = gpus // 2 // cluster["tensor_parallel"]
    section: dict[str, Any] = {"min_groups_for_streaming_train": 128}
    if staleness == 0:
        section.update(sampler={"name": "in_order", "max_lookahead_versions": 0}, max_buffered_rollouts=P,
                       max_inflight_prompts=min(P, 16 * servers))  # fmt: skip
    else:
        capacity = math.ceil((1 + staleness) * P)
        section.update(sampler={"name": "windowed", "max_staleness_versions": 8}, max_buffered_rollouts=capacity,
                       max_inflight_prompts=min(capacity, 16 * servers), partial_rollouts="continue",
                       rollout_failure={"on_dropped_prompt": "shrink"})  # fmt: skip
        data["loss"] = {"importance_sampling": True}
    data["async"] = section
    return data


# The published update_actor of the async rows (staleness 0.5); the diagnostic reads the trainer's speed off 64:64's.
ASYNC_UPDATE = {32: 269.80, 64: 156.98, 128: 113.16}


def simulate_row(mode: str, gpus: int, efficiency: dict[str, float], steps: int, staleness: float = 0.5,
                 median_scale: float = 1.0) -> dict:
    """Seconds per step (mean over the run) of one row: step, and for sync its generation and training."""
    cfg = config_from_dict(config_data(mode, gpus, efficiency, steps, staleness, median_scale))
    run, summary = simulate_point(cfg)
    if run.error is not None:
        raise RuntimeError(f"{mode} {gpus} GPUs: {summary['error']}")
    n = run.steps_trained
    out = {"step": run.wall_seconds / n, "train": run.parts.trainer.busy_seconds / n,
           "staleness_max": summary["staleness_max"]}  # fmt: skip
    if run.sync_result is not None:
        out["gen"] = run.sync_result.gen_seconds / n
    return out


# -- the fit --------------------------------------------------------------------------------------------------


def generation_round_seconds(gpus: int, efficiency: dict[str, float], rounds: int) -> float:
    """Mean seconds of one sync round of P × G completions on ``gpus`` colocated GPUs (engine only)."""
    job = copy.deepcopy(JOB)
    job["efficiency"] = dict(efficiency)
    job["cluster"].update(rollout_gpus=gpus, train_gpus=gpus, colocated=True)
    section = JobSection.model_validate(job)
    costs, lengths, variates = JobCosts.from_job(section), LengthModel(section.lengths), JobVariates(0)
    seconds: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for _ in range(rounds):
            engine = JobEngine(costs, poll_seconds(costs, lengths.start), track_versions=False)
            start = loop.time()
            tickets = [engine.submit(lengths.lengths(variates.normals(G), 0), loop.time()) for _ in range(P)]
            await asyncio.gather(*(t.future for t in tickets))
            seconds.append(loop.time() - start)

    run_in_virtual_time(main, 1e9)
    return sum(seconds) / len(seconds)


def fit_generation(rounds: int) -> dict[str, float]:
    """``inference_mfu``, ``decode_bandwidth_efficiency``, ``decode_step_overhead_s`` by a pattern search in log
    space minimising Σ log(predicted / published generation time)² over the sync rows."""
    keys = ("inference_mfu", "decode_bandwidth_efficiency", "decode_step_overhead_s")
    upper = {"inference_mfu": 1.0, "decode_bandwidth_efficiency": 1.0, "decode_step_overhead_s": 0.1}
    point = {"train_mfu": FITTED["train_mfu"], "inference_mfu": 0.4, "decode_bandwidth_efficiency": 0.7,
             "decode_step_overhead_s": 0.003}  # fmt: skip

    def loss(p: dict[str, float]) -> float:
        return sum(math.log(generation_round_seconds(g, p, rounds) / SYNC[g][1]) ** 2 for g in SYNC)

    best, factor = loss(point), 1.5
    while factor > 1.02:
        improved = False
        for key in keys:
            for f in (factor, 1 / factor):
                trial = {**point, key: min(upper[key], point[key] * f)}
                value = loss(trial)
                if value < best - 1e-9:
                    point, best, improved = trial, value, True
        if not improved:
            factor = math.sqrt(factor)
    return point


def training_parts(mode: str, gpus: int, efficiency: dict[str, float], steps: int) -> tuple[float, float]:
    """``(compute × train_mfu, updates)`` seconds per step: training is ``compute / train_mfu + updates``."""
    cfg = config_from_dict(config_data(mode, gpus, efficiency, steps))
    updates = 16 * JobCosts.from_job(cfg.sim.job).update_s  # type: ignore[arg-type]
    train = simulate_row(mode, gpus, efficiency, steps)["train"]
    return (train - updates) * efficiency["train_mfu"], updates


def fit_train_mfu(efficiency: dict[str, float], steps: int) -> float:
    """``train_mfu`` minimising Σ log(predicted / published training time)² over the sync rows."""
    parts = [(*training_parts("sync", gpus, efficiency, steps), SYNC[gpus][2]) for gpus in SYNC]
    lo, hi = 0.05, 1.0
    for _ in range(60):  # golden-section search on a unimodal loss
        a, b = lo + (hi - lo) * 0.382, lo + (hi - lo) * 0.618
        fa = sum(math.log((c / a + u) / pub) ** 2 for c, u, pub in parts)
        fb = sum(math.log((c / b + u) / pub) ** 2 for c, u, pub in parts)
        lo, hi = (lo, b) if fa < fb else (a, hi)
    return round((lo + hi) / 2, 3)


# -- the table ------------------------------------------------------------------------------------------------


def table(efficiency: dict[str, float], steps: int) -> list[dict[str, Any]]:
    """Every published figure with ours: ``{"figure", "published", "predicted", "error", "fit"}``."""
    rows: list[dict[str, Any]] = []

    def add(name: str, published: float, predicted: float, fit: bool = False) -> None:
        rows.append({"figure": name, "published": published, "predicted": predicted,
                     "error": predicted / published - 1, "fit": fit})  # fmt: skip
        print(f"  {name}: published {published:.2f}, predicted {predicted:.2f}", file=sys.stderr, flush=True)

    sync = {g: simulate_row("sync", g, efficiency, steps) for g in SYNC}
    for g, (step, gen, train) in SYNC.items():
        add(f"sync {g} GPUs: generation s/step", gen, sync[g]["gen"], fit=True)
        add(f"sync {g} GPUs: training s/step", train, sync[g]["train"], fit=True)
        add(f"sync {g} GPUs: s/step", step, sync[g]["step"], fit=True)
    for g, (step, speedup) in ASYNC.items():
        ours = simulate_row("async", g, efficiency, steps)
        add(f"async {g // 2}:{g // 2}: s/step", step, ours["step"])
        add(f"async {g // 2}:{g // 2}: speed-up over sync (400 steps)", speedup, sync[g]["step"] / ours["step"])
        if g == 128:
            add("async 64:64: speed-up over sync (100 steps)", SPEEDUP_128_AT_100, sync[g]["step"] / ours["step"])
    for s, hours in ABLATION.items():
        ours = simulate_row("async", 128, efficiency, steps, staleness=s)
        add(f"staleness {s}: hours for 400 steps (64:64)", hours, ours["step"] * STEPS_PUBLISHED / 3600)
    return rows


def diagnostic(efficiency: dict[str, float], steps: int) -> tuple[float, list[dict[str, Any]]]:
    """The async rows with ``train_mfu`` read off the 64:64 row's published ``update_actor`` (not a calibration)."""
    compute, updates = training_parts("async", 128, efficiency, steps)
    mfu = round(compute / (ASYNC_UPDATE[128] - updates), 3)
    trainer = {**efficiency, "train_mfu": min(1.0, mfu)}
    rows: list[dict[str, Any]] = []
    for g, (step, _) in ASYNC.items():
        ours = simulate_row("async", g, trainer, steps)["step"]
        rows.append({"figure": f"async {g // 2}:{g // 2}: s/step", "published": step, "predicted": ours,
                     "error": ours / step - 1, "fit": False})  # fmt: skip
    for s, hours in ABLATION.items():
        ours = simulate_row("async", 128, trainer, steps, staleness=s)["step"] * STEPS_PUBLISHED / 3600
        rows.append({"figure": f"staleness {s}: hours for 400 steps (64:64)", "published": hours,
                     "predicted": ours, "error": ours / hours - 1, "fit": False})  # fmt: skip
    return mfu, rows


def length_scan(efficiency: dict[str, float], steps: int) -> list[dict[str, Any]]:
    """Per async row, the completion-median factor at which the sync-fitted model gives the published step:
    ``{"row", "factor", "step", "published", "train", "update_actor"}`` (ours and the published figures).

    Not a calibration: it asks whether one length difference between the modes could explain every async row
    (the page publishes no lengths). Bisection on the factor; the step time grows with it.
    """
    rows: list[dict[str, Any]] = []
    for g, (published, _) in ASYNC.items():
        lo, hi = 0.05, 1.5
        for _ in range(12):
            mid = (lo + hi) / 2
            fast = simulate_row("async", g, efficiency, steps, median_scale=mid)["step"] < published
            lo, hi = (mid, hi) if fast else (lo, mid)
        factor = (lo + hi) / 2
        ours = simulate_row("async", g, efficiency, steps, median_scale=factor)
        rows.append({"row": f"async {g // 2}:{g // 2}", "factor": factor, "step": ours["step"],
                     "published": published, "train": ours["train"], "update_actor": ASYNC_UPDATE[g]})  # fmt: skip
    return rows


def format_length_scan(rows: list[dict[str, Any]]) -> str:
    lines = ["| row | median factor | s/step (published) | trainer s/step (published update_actor) |",
             "|---|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['row']} | {r['factor']:.2f} | {r['step']:.1f} ({r['published']:.1f}) | "
                     f"{r['train']:.1f} ({r['update_actor']:.1f}) |")  # fmt: skip
    return "\n".join(lines)


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| figure | published | predicted | error |", "|---|---:|---:|---:|"]
    for r in rows:
        mark = " (fit)" if r["fit"] else ""
        miss = "" if r["fit"] or abs(r["error"]) <= TOLERANCE else " ✗"
        lines.append(f"| {r['figure']}{mark} | {r['published']:.2f} | {r['predicted']:.2f} | "
                     f"{r['error']:+.1%}{miss} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-fit", action="store_true", help="use the committed constants (FITTED)")
    parser.add_argument("--steps", type=int, default=60, help="steps simulated per row (default 60)")
    parser.add_argument("--rounds", type=int, default=6, help="engine rounds per generation estimate in the fit")
    parser.add_argument("--length-scan", action="store_true",
                        help="only the completion-median factor that reproduces each async row (committed constants)")
    args = parser.parse_args(argv)
    started = time.process_time()
    if args.length_scan:
        print(format_length_scan(length_scan(dict(FITTED), args.steps)))
        print(f"\n{args.steps} simulated steps per row; {time.process_time() - started:.0f} s of CPU")
        return 0
    efficiency = dict(FITTED)
    if not args.no_fit:
        efficiency = fit_generation(args.rounds)
        efficiency["train_mfu"] = fit_train_mfu(efficiency, min(args.steps, 20))
        efficiency = {k: round(v, 4) for k, v in efficiency.items()}
        print(f"fitted on the sync rows: {efficiency}", file=sys.stderr, flush=True)
    rows = table(efficiency, args.steps)
    print(f"constants: {efficiency}")
    print(format_table(rows))
    mfu, diagnostic_rows = diagnostic(efficiency, args.steps)
    print(f"\ndiagnostic: the async rows with train_mfu = {mfu} (read off the 64:64 row's update_actor)")
    print(format_table(diagnostic_rows))
    print(f"\n{args.steps} simulated steps per row; {time.process_time() - started:.0f} s of CPU; "
          f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
