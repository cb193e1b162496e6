"""Leave-one-out check of the job model on verl's published fully-async runs (docs/simulator.md).

    .venv/bin/python bench/sim_loo.py                # the three folds (20 steps per run), then the fit on all three
    .venv/bin/python bench/sim_loo.py --steps 10     # shorter runs (a quick look)

The three folds took about 25 minutes of CPU at 20 steps on the shared project VM.

The runs are ``bench/sim_calibration.py``'s: Qwen2.5-Math-7B DAPO on H20, three cases — 32, 64 and 128 GPUs, each
a colocated sync run and a fully-async run on half and half (staleness 0.5, partial rollouts). A fold holds one
case out, fits on the other two, and predicts the held-out case's sync and async step times and the speed-up.

Fitted per fold (the training side, which decides the async rows):

* the network bandwidth per GPU and ``colocated_train_mfu`` on the two sync training times (``old_log_prob +
  update_actor``): training is ``C / colocated_train_mfu + 16 · update_seconds(bandwidth)``, ``C`` the step's
  training FLOPs ÷ peak (a grid over the bandwidth, a golden-section search for the MFU);
* ``train_mfu`` (the separate trainer of the async runs) on the two async step times, each evaluation simulating
  both runs.

Not left out: the generation constants (``inference_mfu``, ``decode_bandwidth_efficiency``,
``decode_step_overhead_s``), fitted by ``bench/sim_calibration.py`` on all three sync generation times, and the
assumed lengths and weight-sync costs (``bench/sim_calibration.py``'s docstring).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

from sim_calibration import ASYNC, FITTED, SYNC, config_data

from groupwise.config import config_from_dict
from groupwise.sim.gpus import GPUS
from groupwise.sim.job_model import update_seconds
from groupwise.sim.plan import simulate_point

PARAMS = 7.62e9
UPDATES = 16
BANDWIDTHS = [5.0 * 1.1**i for i in range(30)]  # GB/s per GPU, 5 … 80


def simulate(mode: str, gpus: int, efficiency: dict[str, float], network: float, steps: int) -> dict[str, float]:
    """Seconds per step of one published run under these constants: step, trainer busy, and sync generation."""
    data = config_data(mode, gpus, efficiency, steps)
    data["sim"]["job"]["cluster"]["network_gbytes_per_s"] = network
    run, summary = simulate_point(config_from_dict(data))
    if run.error is not None:
        raise RuntimeError(f"{mode} {gpus} GPUs: {summary['error']}")
    n = run.steps_trained
    out = {"step": run.wall_seconds / n, "train": run.parts.trainer.busy_seconds / n}
    if run.sync_result is not None:
        out["gen"] = run.sync_result.gen_seconds / n
    return out


def updates(gpus: int, network: float) -> float:
    """Seconds of a step's 16 optimizer updates on ``gpus`` GPUs at ``network`` GB/s beyond a node."""
    return UPDATES * update_seconds(PARAMS, gpus, GPUS["H20"], network * 1e9)


def golden(loss: Any, lo: float, hi: float, rounds: int) -> float:
    """The minimiser of a unimodal ``loss`` on ``[lo, hi]``."""
    for _ in range(rounds):
        a, b = lo + (hi - lo) * 0.382, lo + (hi - lo) * 0.618
        lo, hi = (lo, b) if loss(a) < loss(b) else (a, hi)
    return (lo + hi) / 2


def fit_sync_training(compute: dict[int, float], cases: list[int]) -> tuple[float, float]:
    """``(network GB/s, colocated_train_mfu)`` minimising Σ log(predicted / published training time)² over the
    sync runs of ``cases`` (``compute[g]``: training seconds at MFU 1)."""
    best: tuple[float, float, float] | None = None
    for network in BANDWIDTHS:

        def loss(mfu: float, network: float = network) -> float:
            return sum(math.log((compute[g] / mfu + updates(g, network)) / SYNC[g][2]) ** 2 for g in cases)

        mfu = golden(loss, 0.05, 1.0, 40)
        if best is None or loss(mfu) < best[0]:
            best = (loss(mfu), network, mfu)
    assert best is not None
    return best[1], best[2]


def fit_async_mfu(efficiency: dict[str, float], network: float, cases: list[int], steps: int) -> float:
    """``train_mfu`` minimising Σ log(predicted / published async step time)² over ``cases`` (log-space search)."""

    def loss(log_mfu: float) -> float:
        trial = {**efficiency, "train_mfu": math.exp(log_mfu)}
        return sum(math.log(simulate("async", g, trial, network, steps)["step"] / ASYNC[g][0]) ** 2 for g in cases)

    return round(math.exp(golden(loss, math.log(0.1), math.log(1.0), 10)), 4)


def fit(cases: list[int], compute: dict[int, float], steps: int) -> tuple[dict[str, float], float]:
    """The fitted constants and network bandwidth on ``cases``."""
    network, colocated = fit_sync_training(compute, cases)
    efficiency = {**FITTED, "colocated_train_mfu": round(colocated, 4)}
    efficiency["train_mfu"] = fit_async_mfu(efficiency, network, cases, steps)
    return efficiency, round(network, 2)


def predict(case: int, efficiency: dict[str, float], network: float, steps: int) -> dict[str, float]:
    """The held-out case: sync and async step times and the speed-up."""
    sync = simulate("sync", case, efficiency, network, steps)["step"]
    async_ = simulate("async", case, efficiency, network, steps)["step"]
    return {"sync": sync, "async": async_, "speedup": sync / async_}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps simulated per run (default 20)")
    args = parser.parse_args(argv)
    started = time.process_time()
    base = {**FITTED, "colocated_train_mfu": 1.0}
    compute = {}
    for g in SYNC:  # training seconds at MFU 1: the simulated trainer time less its updates, times its MFU
        compute[g] = simulate("sync", g, base, 50.0, args.steps)["train"] - updates(g, 50.0)
    lines = ["| held out | fitted on | constants (network GB/s) | sync s/step | async s/step | speed-up | error |",
             "|---|---|---|---:|---:|---:|---:|"]  # fmt: skip
    errors = []
    for held in SYNC:
        cases = [g for g in SYNC if g != held]
        efficiency, network = fit(cases, compute, args.steps)
        ours = predict(held, efficiency, network, args.steps)
        published = {"sync": SYNC[held][0], "async": ASYNC[held][0], "speedup": ASYNC[held][1]}
        error = ours["speedup"] / published["speedup"] - 1
        errors.append(math.log(ours["speedup"] / published["speedup"]))
        constants = (f"train {efficiency['train_mfu']}, colocated {efficiency['colocated_train_mfu']} "
                     f"({network})")  # fmt: skip
        lines.append(f"| {held} GPUs | {' + '.join(map(str, cases))} | {constants} | "
                     f"{ours['sync']:.0f} (pub. {published['sync']:.0f}) | {ours['async']:.0f} (pub. "
                     f"{published['async']:.0f}) | {ours['speedup']:.2f} (pub. {published['speedup']:.2f}) | "
                     f"{error:+.1%} |")  # fmt: skip
        print(lines[-1], file=sys.stderr, flush=True)
    efficiency, network = fit(list(SYNC), compute, args.steps)
    print("\n".join(lines))
    print(f"\nlog errors of the speed-ups: {[round(e, 4) for e in errors]}")
    print(f"fitted on all three: {efficiency}, network_gbytes_per_s {network}")
    print(f"{args.steps} simulated steps per run; {time.process_time() - started:.0f} s of CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
