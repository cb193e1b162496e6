"""Breakdown of one sync step of the default job: where does the time go?

    .venv/bin/python bench/step.py [--steps 30] [--warmup 5] [--config examples/addition.yaml] [KEY=VALUE ...]
    .venv/bin/python bench/step.py optimizer.micro_batch_tokens=1024    # the same job with token-budget packing

Wraps the real components with timers (no copies of the loop) and runs the real sync loop: engine sampling,
scoring (reward functions + group building), forward/backward (logprobs, loss, backward), the optimizer step,
and the step's edges (metrics, train_data, events). "Loop overhead" is everything in the step that is not
sampling, forward/backward or the optimizer step; the target is ≤ 10% of the step. Threads and the OpenMP wait
policy are chosen as ``groupwise train`` chooses them (``groupwise.trainer.cpu_threads``) unless you set
``OMP_NUM_THREADS`` / ``OMP_WAIT_POLICY``; the first line says what was used. The mean ``perf/padding_fraction``
of the measured steps (deterministic: it depends on the rows, not the machine) is printed last.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict

from groupwise.trainer.cpu_threads import apply_cpu_threads, prepare_openmp_environment

prepare_openmp_environment()  # before torch loads libgomp, as the groupwise command does

from groupwise.config import load_config  # noqa: E402
from groupwise.runtime.sync_run import train_steps  # noqa: E402
from groupwise.trainer.builder import build_session  # noqa: E402

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
        defaults = [
            f"run.output_dir={tmp}", "run.name=bench", f"run.max_steps={args.steps + args.warmup}",
            "logging.progress=false", "eval.at_start=false", "eval.every=0", "checkpoint.every=0",
        ]  # fmt: skip
        # a key given twice is a config error: the command line's own value replaces the bench default
        given = {override.partition("=")[0] for override in args.overrides}
        overrides = [o for o in defaults if o.partition("=")[0] not in given] + list(args.overrides)
        session = build_session(load_config(args.config, overrides))
        threads = apply_cpu_threads(session.policy.model)
        engine, learner, rollouts = session.engine, session.learner, session.rollouts
        engine.generate = timed("sample (engine)", engine.generate)
        rollouts.generate_groups = timed("_rollout", rollouts.generate_groups)
        learner.train_chunk = timed("forward + backward", learner.train_chunk)
        learner.finish_step = timed("optimizer step", learner.finish_step)
        padding: list[float] = []
        end_step = session.end_step

        def recording_end_step(step, metrics, rows):
            padding.append(metrics["perf/padding_fraction"])
            return end_step(step, metrics, rows)

        session.end_step = timed("metrics + train_data + events", recording_end_step)
        train_steps(session, args.warmup)
        TIMERS.clear()
        padding.clear()
        start = time.perf_counter()
        train_steps(session, args.warmup + args.steps)
        total = time.perf_counter() - start
    rollout = TIMERS.pop("_rollout")
    TIMERS["score (rewards + groups)"] = rollout - TIMERS["sample (engine)"]
    core = TIMERS["sample (engine)"] + TIMERS["forward + backward"] + TIMERS["optimizer step"]
    TIMERS["rest of the loop (filter, rows, advantages)"] = total - sum(TIMERS.values())
    print(f"config {args.config}, {args.steps} steps after {args.warmup} warm-up, {threads}")
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
