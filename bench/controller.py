"""Controller and simulator at scale: bookkeeping cost per group, a million-group simulated run, throughput.

    .venv/bin/python bench/controller.py [--part bookkeeping|million|throughput|all] [--groups 1000000]
    .venv/bin/python bench/controller.py --part evidence [--out runs/sim-evidence]   # docs/samplers.md evidence
    .venv/bin/python bench/controller.py --part partial_rollouts [--steps 300]       # bench/RESULTS.md

* **bookkeeping** — the controller's own work per group, with 10^2, 10^4 and 10^6 groups buffered: one batch
  admitted (``sampler.admit``), P slots reserved and committed (tally, buffer), then evict → select → ledger
  → fates → tally → close, on the objects ``build_controller`` wires (no event loop work, no rollouts). The
  buffered groups stay buffered (in_order: stamped for a far step; ready_first / windowed: every step takes P
  and adds P). Target ≤ 10 µs per group and flat in the buffer size.
* **million** — ``simulate_async`` (the real controller in virtual time) over 10^6 groups with 4096 engine
  slots, P = 512, G = 8, ``ready_first`` with staleness 1 and a stationary workload; once with dynamic sampling
  off (every attempt is a trained group) and once with it on (filtered groups are replaced from the spare
  pool, so there are more attempts than trained groups). Target ≤ 60 s of CPU.
* **throughput** — ``examples/sim/*.yaml`` (generation ≈ 70 % of a sync step) and the same workload at the
  ``sim`` defaults' training cost: trained groups per hour of each async sampler ÷ sync.
* **evidence** — ``groupwise simulate`` of the four ``examples/sim`` configs into ``--out``, then ``groupwise
  compare`` of them plus rows from their ``sim/summary.json``: the evidence section of ``docs/samplers.md``.
* **partial_rollouts** — ``examples/sim/partial_rollouts.yaml`` (the long-tailed workload, p99/p50 = 8) for each
  gated sampler and windowed at staleness 1 and 2: partial rollouts off with a draining weight sync, on, and off
  with the simulator's overlapping sync (the model the other examples use): trained groups per hour, trainer
  idle fraction, token staleness. Simulated figures: deterministic, so measurable on any machine.

CPU time is ``time.process_time()`` around the measured call (imports excluded).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import time
from pathlib import Path
from typing import Any

from groupwise.algo.filter import GroupFilter
from groupwise.config import RolloutFailureSection, load_config, sampler_config
from groupwise.controller.controller import build_controller
from groupwise.controller.fate_records import FateRecord
from groupwise.controller.settings import ControllerSettings
from groupwise.sim.simulation import simulate_async, simulate_sync
from groupwise.sim.workload import SimWorkload
from groupwise.types import Completion, Group, Prompt

ROOT = Path(__file__).resolve().parents[1]
P_BOOKKEEPING = 64
KNOBS = {
    "in_order": {"max_lookahead_versions": 1},
    "ready_first": {"max_staleness_versions": 1},
    "windowed": {"max_staleness_versions": 10**9},  # a window that never expires the buffered groups
}


def _group(group_id: int, prompt: Prompt, blank: list[Completion]) -> Group:
    return Group(group_id, prompt, (), blank, [0.0, 1.0], [0.0, 1.0])


async def _bookkeeping(sampler: str, buffered: int, steps: int) -> float:
    """Seconds of controller bookkeeping per group, in steady state with ``buffered`` groups in the buffer."""
    P = P_BOOKKEEPING
    settings = ControllerSettings(
        prompts_per_step=P, group_size=2, sampler=sampler_config(sampler, **KNOBS[sampler]),
        max_buffered_rollouts=buffered + 2 * P, max_inflight_prompts=buffered + 2 * P,
    )  # fmt: skip
    ctx = build_controller(settings, loader=None, rollouts=None, trainer=None).ctx  # type: ignore[arg-type]
    prompt, blank = Prompt(uid="p", answer=""), [Completion((), (), "", "stop", 0)] * 2
    far = 10**9  # in_order: a step never reached, so these groups stay buffered
    for _ in range(buffered):
        slot_id = ctx.buffer.reserve(0, far if sampler == "in_order" else None)
        ctx.buffer.commit(slot_id, _group(slot_id, prompt, blank), 0)
    started = time.process_time()
    for step in range(steps):
        target = await ctx.sampler.admit(ctx.clock)  # one batch of P
        for _ in range(P):
            slot_id = ctx.buffer.reserve(ctx.generator_version, target)
            group = _group(slot_id, prompt, blank)
            group.target_step = target
            ctx.tally.record_generated(group, filtering=True)
            ctx.buffer.commit(slot_id, group, ctx.generator_version)
        ctx.sampler.evict(step)
        slots = ctx.sampler.select(step, P, P)
        assert slots is not None and len(slots) == P, "the benchmark's step must fill"
        ctx.ledger.record_selected(step, P)
        for slot in slots:
            ctx.record_fate(FateRecord(slot.slot_id, "p", 0, slot.start_version, "trained", step))
        ctx.tally.record_trained(step, [slot.group for slot in slots if slot.group is not None])
        ctx.ledger.close(step)
        ctx.tally.pop_metrics(step)
        ctx.generator_version = ctx.clock.advance()
    elapsed = time.process_time() - started
    assert len(ctx.buffer) == buffered, f"the buffer should hold {buffered} groups, holds {len(ctx.buffer)}"
    return elapsed / (steps * P)


def bookkeeping_table() -> list[str]:
    lines = ["| sampler | 10^2 buffered | 10^4 buffered | 10^6 buffered |", "|---|---|---|---|"]
    for sampler in KNOBS:
        cells = [f"{asyncio.run(_bookkeeping(sampler, n, steps=200)) * 1e6:.1f} µs" for n in (10**2, 10**4, 10**6)]
        lines.append(f"| {sampler} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    return lines


def million(groups: int, dynamic_sampling: bool) -> dict[str, Any]:
    P = 512
    settings = ControllerSettings(
        prompts_per_step=P, group_size=8, sampler=sampler_config("ready_first", max_staleness_versions=1),
        max_inflight_prompts=1024, max_buffered_rollouts=2048, dynamic_sampling=GroupFilter(enabled=dynamic_sampling),
        max_steps=-(-groups // P),
        failure=RolloutFailureSection(
            on_dropped_prompt="replace" if dynamic_sampling else "shrink", max_replacement_attempts=16,
            replacement_reserve_prompts=4096 if dynamic_sampling else 1, min_step_batch_fraction=0.5,
        ),
    )  # fmt: skip
    # Stationary: the learning curve is flat, so the zero-variance rate stays near its starting value (~1/3).
    workload = SimWorkload(group_size=8, rollout_slots=4096, num_prompts=50_000, learning_rate_groups=1e15,
                           train_s_per_token=0.0002 / 32)  # a trainer fast enough for 4096 slots of generation
    started = time.process_time()
    run = simulate_async(settings, workload)
    cpu = time.process_time() - started
    counters = run.parts.rollouts.counters
    return {
        "dynamic sampling": "on" if dynamic_sampling else "off",
        "trained groups": run.parts.trainer.trained_groups,
        "attempts": counters.attempts,
        "outcome": "completed" if run.error is None else f"{type(run.error).__name__}: {run.error}",
        "virtual hours": run.wall_seconds / 3600,
        "CPU s": cpu,
        "µs per attempt": cpu / counters.attempts * 1e6,
    }


def million_table(groups: int) -> list[str]:
    lines = ["| dynamic sampling | trained groups | attempts | virtual time | CPU | per attempt | outcome |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for ds in (False, True):
        r = million(groups, ds)
        lines.append(
            f"| {r['dynamic sampling']} | {r['trained groups']:,} | {r['attempts']:,} | {r['virtual hours']:.1f} h "
            f"| {r['CPU s']:.1f} s | {r['µs per attempt']:.1f} µs | {r['outcome']} |"
        )
        print(lines[-1], flush=True)
    return lines


def _rate(run: Any) -> float:
    return run.parts.trainer.trained_groups / run.wall_seconds * 3600


def throughput_table() -> list[str]:
    lines = ["| workload | sync gen. share | sync groups/h | in_order (L=2) | ready_first (S=2) | windowed (S=2) |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for label, overrides in (("examples/sim (train_s_per_token 0.0005)", []),
                             ("sim defaults (train_s_per_token 0.0002)", ["sim.train_s_per_token=0.0002"])):
        cfg = load_config(ROOT / "examples/sim/sync.yaml", overrides)
        sync = simulate_sync(cfg.grpo, cfg.run.max_steps, SimWorkload.from_config(cfg))
        cells = [label, f"{sync.sync_result.gen_seconds / sync.wall_seconds:.0%}", f"{_rate(sync):,.0f}"]
        for name in ("in_order", "ready_first", "windowed"):
            cfg = load_config(ROOT / f"examples/sim/{name}.yaml", overrides)
            run = simulate_async(ControllerSettings.from_config(cfg), SimWorkload.from_config(cfg))
            staleness = run.meter.staleness if run.meter else {}
            cells.append(f"{_rate(run):,.0f} = {_rate(run) / _rate(sync):.2f}× (max staleness {max(staleness)})")
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    return lines


EVIDENCE_ROWS = (
    ("generation_wall_fraction", "generation share of wall time (sync)"),
    ("rollout_slot_idle_fraction", "engine slot capacity unused"),
    ("attempts", "rollout attempts"),
    ("lost_groups", "groups lost for good"),
    ("spare_substitutions", "spare-pool substitutions"),
    ("staleness_p50", "staleness p50"),
    ("staleness_p99", "staleness p99"),
    ("staleness_max", "staleness max"),
    ("final_success_logit", "final success logit"),
)


def evidence(out_dir: Path) -> list[str]:
    """Simulate the four example configs into ``out_dir``, then print ``groupwise compare`` and summary rows."""
    import json
    import shutil

    from groupwise.run.report import fmt, run_compare
    from groupwise.sim.run import simulate

    names = ("sync", "in_order", "ready_first", "windowed")
    for name in names:
        shutil.rmtree(out_dir / f"sim-{name}", ignore_errors=True)
        simulate(load_config(ROOT / f"examples/sim/{name}.yaml", [f"run.output_dir={out_dir}"]))
    runs = [out_dir / f"sim-{name}" for name in names]
    lines = run_compare(runs).splitlines()
    summaries = [json.loads((run / "sim" / "summary.json").read_text()) for run in runs]
    lines += ["", "| from sim/summary.json | " + " | ".join(f"sim-{n}" for n in names) + " |",
              "|---|" + "---|" * len(names)]  # fmt: skip
    for key, label in EVIDENCE_ROWS:
        lines.append(f"| {label} | " + " | ".join(fmt(s[key]) for s in summaries) + " |")
    print("\n".join(lines), flush=True)
    return lines


PARTIAL_SETTINGS = (
    ("off (sync drains)", []),
    ("on (continue)", ["async.partial_rollouts=continue", "sim.weight_sync_drains=false"]),
    ("off (sync overlaps)", ["sim.weight_sync_drains=false"]),
)
WINDOW_KNOB = {"in_order": "max_lookahead_versions", "ready_first": "max_staleness_versions",
               "windowed": "max_staleness_versions"}  # fmt: skip


def partial_rollouts_table(steps: int) -> list[str]:
    """Per sampler, window and setting: trained groups/h (÷ partial rollouts off with draining syncs), trainer idle
    fraction, staleness of the trained groups and of their tokens, wasted share of the generated tokens."""
    lines = ["| sampler | window | partial rollouts | trained groups/h | ÷ off (drains) | trainer idle | staleness "
             "(groups) | staleness (tokens) | wasted share of tokens |", "|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for name, knob in WINDOW_KNOB.items():
        for window in (1, 2):
            base = None
            for label, overrides in PARTIAL_SETTINGS:
                cfg = load_config(ROOT / "examples/sim/partial_rollouts.yaml", [
                    f"run.max_steps={steps}", f"async.sampler={{name: {name}, {knob}: {window}}}", *overrides])
                run = simulate_async(ControllerSettings.from_config(cfg), SimWorkload.from_config(cfg),
                                     partial_rollouts=cfg.async_.partial_rollouts == "continue")  # fmt: skip
                assert run.completed and run.meter is not None and run.generation is not None, run.error
                rate = _rate(run)
                base = base or rate
                trained = sum(run.meter.staleness.values())
                staleness = sum(v * n for v, n in run.meter.staleness.items()) / trained
                totals = run.generation.totals()
                cells = [name, str(window), label, f"{rate:,.0f}", f"{rate / base:.2f}×",
                         f"{1 - run.parts.trainer.busy_seconds / run.wall_seconds:.3f}", f"{staleness:.3f}",
                         f"{run.meter.token_staleness_mean:.3f}", f"{totals['waste_fraction']:.3f}"]  # fmt: skip
                lines.append("| " + " | ".join(cells) + " |")
                print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parts = ["bookkeeping", "million", "throughput", "evidence", "partial_rollouts", "all"]
    parser.add_argument("--part", choices=parts, default="all")
    parser.add_argument("--steps", type=int, default=300, help="steps of each --part partial_rollouts run")
    parser.add_argument("--groups", type=int, default=1_000_000, help="trained groups in the million-group run")
    parser.add_argument("--out", type=Path, default=Path("runs/sim-evidence"), help="run dirs of --part evidence")
    args = parser.parse_args()
    if args.part == "evidence":  # the docs/samplers.md evidence: markdown only
        evidence(args.out)
        return
    print(f"# {time.strftime('%Y-%m-%d')}, Python {platform.python_version()}, {sys.platform}", flush=True)
    if args.part in ("bookkeeping", "all"):
        print("\nController bookkeeping per group (admit → commit → select → close), P = 64:", flush=True)
        bookkeeping_table()
    if args.part in ("million", "all"):
        print(f"\nSimulated run, {args.groups:,} trained groups, 4096 slots, P = 512, G = 8, ready_first S=1:")
        million_table(args.groups)
    if args.part in ("throughput", "all"):
        print("\nTrained groups per hour, async ÷ sync, 300 steps, P = 16, G = 8, 64 slots:", flush=True)
        throughput_table()
    if args.part in ("partial_rollouts", "all"):
        print(f"\nPartial rollouts on the long-tailed workload (p99/p50 = 8), {args.steps} steps, P = 16, G = 8, "
              "64 slots:", flush=True)
        partial_rollouts_table(args.steps)


if __name__ == "__main__":
    main()
