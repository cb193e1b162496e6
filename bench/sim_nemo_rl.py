"""The job model against NeMo RL's published sync and async GRPO step times: a check on runs it was not fitted on.

    .venv/bin/python bench/sim_nemo_rl.py             # 20 simulated steps per run
    .venv/bin/python bench/sim_nemo_rl.py --steps 10  # a quicker look

Source: NVIDIA-NeMo/RL, ``docs/about/performance-summary.md``, "Nemo RL v0.4", GRPO on OpenMathInstruct-2,
DGX-H100, BF16, Megatron-core training; the recipes it names, ``examples/configs/recipes/llm/performance/
{grpo,async-grpo}-{llama3.1-8b-instruct-2n8g,qwen3-30ba3b-4n8g}.yaml`` on top of ``examples/configs/
grpo_math_1B.yaml``. Per row the page gives the GPUs, the generation and training layouts, the mean generated
sequence length and the total step time (generation, policy logprobs, training and refit). Each step is 64 prompts
× 32 generations, trained in mini-batches of 512 sequences (4 updates), with a KL penalty (0.01: a reference
forward) and the old logprobs recomputed by the trainer; sequences are at most 4,096 tokens, prompt included.
Sync is colocated (vLLM at ``gpu_memory_utilization`` 0.6); "1-step off" is NeMo RL's async GRPO with
``max_trajectory_age_steps: 1`` on separate generation and training GPUs (0.8).

| run | GPUs | generation TP | training TP, EP, PP | mean length | s/step |
|---|---:|---:|---|---:|---:|
| Llama-3.1-8B sync | 16 | 1 | 1, 1, 2 | 1,060 | 97.7 |
| Llama-3.1-8B 1-step off | 8 + 8 | 1 | 1, 1, 2 | 1,129 | 74.6 |
| Qwen3-30B-A3B sync | 32 | 4 | 2, 8, 1 | 3,154 | 225 |
| Qwen3-30B-A3B 1-step off | 16 + 16 | 2 | 1, 8, 2 | 3,158 | 244 |

Nothing here is fitted: the H20 constants fitted on verl's sync runs (``sim_calibration.FITTED``) are used as they
are on H100 — the point is whether the model, layouts included, gets the sign and size of the speed-up on another
GPU, recipe and trainer. Assumed, as the page does not give them: the prompt (150 tokens; the mean length is taken
as prompt + completion), the spread of the completions (log-normal, p99/p50 = 4, its median set so that the mean
after the cap is the published one), the weight syncs (10 s colocated, 4 s + bytes ÷ bandwidth over NCCL), the
async split (the recipes' generation nodes: 8 + 8 and 16 + 16), and the async mapping: ``in_order`` with
lookahead 1 (generation one step ahead of training); Llama waits for the engines to drain before a weight sync,
Qwen3-30B-A3B updates the weights in flight (``in_flight_weight_updates: true``: partial rollouts, the KV cache
kept).
"""

from __future__ import annotations

import argparse
import copy
import math
import platform
import sys
import time
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from sim_calibration import FITTED

from groupwise.config import config_from_dict
from groupwise.sim.plan import simulate_point
from groupwise.sim.workload import lognormal_sigma

P, G, UPDATES = 64, 32, 4
PROMPT_TOKENS, MAX_SEQUENCE, P99_OVER_P50 = 150, 4096, 4.0


@dataclass(frozen=True)
class Mode:
    """One published run: its GPUs, engine and trainer layouts, mean length and step time."""

    rollout_gpus: int
    train_gpus: int  # = rollout_gpus when colocated (sync)
    generation_tp: int
    layout: dict[str, int]
    mean_length: float  # prompt + completion
    step_s: float


@dataclass(frozen=True)
class Case:
    name: str
    model: dict[str, Any]
    sync: Mode
    async_: Mode
    in_flight_updates: bool


CASES = [
    Case("Llama-3.1-8B", {"params": 8.03e9, "layers": 32, "hidden": 4096, "kv_heads": 8, "head_dim": 128},
         Mode(16, 16, 1, {"pipeline_parallel": 2}, 1060, 97.7),
         Mode(8, 8, 1, {"pipeline_parallel": 2}, 1129, 74.6), in_flight_updates=False),
    Case("Qwen3-30B-A3B", {"params": 30.5e9, "active_params": 3.3e9, "experts_per_token": 8, "layers": 48,
                           "hidden": 2048, "kv_heads": 4, "head_dim": 128},
         Mode(32, 32, 4, {"tensor_parallel": 2, "expert_parallel": 8}, 3154, 225.0),
         Mode(16, 16, 2, {"expert_parallel": 8, "pipeline_parallel": 2}, 3158, 244.0), in_flight_updates=True),
]  # fmt: skip


def truncated_mean(median: float, sigma: float, cap: float) -> float:
    """``E[min(X, cap)]`` of a log-normal ``X`` with this median and σ:
    ``e^(μ+σ²/2)·Φ((ln cap − μ − σ²)/σ) + cap·(1 − Φ((ln cap − μ)/σ))``, ``μ = ln median``."""
    mu, phi = math.log(median), NormalDist().cdf
    z = (math.log(cap) - mu) / sigma
    return math.exp(mu + sigma * sigma / 2) * phi(z - sigma) + cap * (1 - phi(z))


def median_for_mean(mean: float, cap: float) -> float:
    """The median whose capped log-normal (p99/p50 = 4) has mean ``mean`` (bisection in log space)."""
    sigma, lo, hi = lognormal_sigma(P99_OVER_P50), math.log(1.0), math.log(cap)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if truncated_mean(math.exp(mid), sigma, cap) < mean else (lo, mid)
    return math.exp((lo + hi) / 2)


def config_data(case: Case, mode: str, steps: int) -> dict[str, Any]:
    """The run config of one published run."""
    run = case.sync if mode == "sync" else case.async_
    cap = MAX_SEQUENCE - PROMPT_TOKENS
    job: dict[str, Any] = {
        "model": copy.deepcopy(case.model),
        "cluster": {"gpu": "H100", "rollout_gpus": run.rollout_gpus, "train_gpus": run.train_gpus,
                    "colocated": mode == "sync", "tensor_parallel": run.generation_tp, "max_seqs_per_replica": 256,
                    "memory_fraction": 0.6 if mode == "sync" else 0.8},
        "lengths": {"prompt_tokens": PROMPT_TOKENS, "p99_over_p50": P99_OVER_P50, "max_tokens": cap,
                    "median_tokens": round(median_for_mean(run.mean_length - PROMPT_TOKENS, cap), 1)},
        "training": {"gradient_checkpointing": True, "recompute_old_logprobs": True, "reference_forward": True},
        "train_layout": dict(run.layout),
        "weight_sync": {"fixed_s": 10.0 if mode == "sync" else 4.0},
        "efficiency": dict(FITTED),
    }  # fmt: skip
    data: dict[str, Any] = {
        "mode": mode, "run": {"name": f"nemo-{mode}", "max_steps": steps, "seed": 0},
        "model": {"source": "tiny"}, "logging": {"tensorboard": False},
        "grpo": {"num_prompts_per_step": P, "num_generations_per_prompt": G, "dynamic_sampling": {"enabled": False}},
        "optimizer": {"mini_batches_per_step": UPDATES},
        "sim": {"num_prompts": 10_000, "write_fates": False, "job": job, "weight_sync_drains": False},
    }  # fmt: skip
    if mode == "async":
        replicas = run.rollout_gpus // run.generation_tp
        data["async"] = {"sampler": {"name": "in_order", "max_lookahead_versions": 1}, "max_buffered_rollouts": 2 * P,
                         "max_inflight_prompts": min(2 * P, math.ceil(replicas * 256 / G)),
                         "partial_rollouts": "continue" if case.in_flight_updates else "off"}  # fmt: skip
        if case.in_flight_updates:
            data["async"]["partial_rollout_kv"] = "keep"
        data["loss"] = {"importance_sampling": True}
        data["sim"]["weight_sync_drains"] = not case.in_flight_updates
    return data


def step_seconds(case: Case, mode: str, steps: int) -> float:
    """Mean simulated seconds per step of one run."""
    run, summary = simulate_point(config_from_dict(config_data(case, mode, steps)))
    if run.error is not None:
        raise RuntimeError(f"{case.name} {mode}: {summary['error']}")
    return run.wall_seconds / run.steps_trained


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps simulated per run (default 20)")
    args = parser.parse_args(argv)
    started = time.process_time()
    print("| run | published s/step | predicted s/step | error |\n|---|---:|---:|---:|")
    speedups = []
    for case in CASES:
        sync, async_ = step_seconds(case, "sync", args.steps), step_seconds(case, "async", args.steps)
        for mode, ours, theirs in (("sync", sync, case.sync.step_s), ("1-step off", async_, case.async_.step_s)):
            print(f"| {case.name} {mode} | {theirs:.1f} | {ours:.1f} | {ours / theirs - 1:+.1%} |")
        speedups.append((case.name, case.sync.step_s / case.async_.step_s, sync / async_))
    print("\n| run | published speed-up | predicted | error | faster mode right |\n|---|---:|---:|---:|---|")
    for name, theirs, ours in speedups:
        print(f"| {name} | {theirs:.2f} | {ours:.2f} | {ours / theirs - 1:+.1%} | {(ours > 1) == (theirs > 1)} |")
    print(f"\n{args.steps} simulated steps per run; {time.process_time() - started:.0f} s of CPU; "
          f"{platform.machine()}, Python {platform.python_version()}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
