"""Breakdown of one sync step of the default job: where does the time go?

    .venv/bin/python bench/step.py [--steps 30] [--warmup 5] [--config examples/addition.yaml] [KEY=VALUE ...]
    .venv/bin/python bench/step.py optimizer.micro_batch_tokens=512    # the same job with token-budget packing

Wraps the real components with timers (no copies of the loop) and runs the real sync loop: engine sampling,
scoring (reward functions + group building), forward/backward (logprobs, loss, backward), the optimizer step,
and the step's edges (metrics, train_data, events). "Loop overhead" is everything in the step that is not
sampling, forward/backward or the optimizer step; the target is ≤ 10% of the step. The mean
``perf/padding_fraction`` of the measured steps (deterministic: it depends on the rows, not the machine) is
printed last.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict

import torch

from groupwise.config import load_config
from groupwise.trainer.builder import build_session
from groupwise.trainer.sync_loop import train_one_step

TIMERS: dict[str, float] = defaultdict(float)


def timed(name, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TIMERS[name] += time.perf_counter() - start

    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="examples/addition.yaml")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            f"run.output_dir={tmp}", "run.name=bench", f"run.max_steps={args.steps + args.warmup}",
            "logging.progress=false", "eval.at_start=false", "eval.every=0", "checkpoint.every=0", *args.overrides,
        ]  # fmt: skip
        session = build_session(load_config(args.config, overrides))
        engine, learner, rollouts = session.engine, session.learner, session.rollouts
        engine.generate = timed("sample (engine)", engine.generate)
        rollouts.generate_groups = timed("_rollout", rollouts.generate_groups)
        learner.train_chunk = timed("forward + backward", learner.train_chunk)
        learner.finish_step = timed("optimizer step", learner.finish_step)
        session.end_step = timed("metrics + train_data + events", session.end_step)
        for _ in range(args.warmup):
            train_one_step(session, session.state.step)
        TIMERS.clear()
        padding = []
        start = time.perf_counter()
        for _ in range(args.steps):
            train_one_step(session, session.state.step)
            padding.append(session.last_metrics["perf/padding_fraction"])
        total = time.perf_counter() - start
    rollout = TIMERS.pop("_rollout")
    TIMERS["score (rewards + groups)"] = rollout - TIMERS["sample (engine)"]
    core = TIMERS["sample (engine)"] + TIMERS["forward + backward"] + TIMERS["optimizer step"]
    TIMERS["rest of the loop (filter, rows, advantages)"] = total - sum(TIMERS.values())
    print(
        f"config {args.config}, {args.steps} steps after {args.warmup} warm-up, torch threads {torch.get_num_threads()}"
    )
    print("| part | ms/step | share |\n|---|---|---|")
    for name, seconds in sorted(TIMERS.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {1000 * seconds / args.steps:.1f} | {seconds / total:.1%} |")
    print(f"| **step** | {1000 * total / args.steps:.1f} | 100% |")
    print(
        f"\nloop overhead (step − sampling − forward/backward − optimizer): {(total - core) / total:.1%} (target ≤ 10%)"
    )
    print(f"perf/padding_fraction (mean of the measured steps): {sum(padding) / len(padding):.3f}")


if __name__ == "__main__":
    main()
