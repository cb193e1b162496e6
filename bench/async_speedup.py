"""Async speed-up on real models: sync vs embedded async vs Ray async, continuous batching and partial rollouts.

    .venv/bin/python bench/async_speedup.py                 # the full table (hours on a 2-core CPU)
    .venv/bin/python bench/async_speedup.py --quick         # a smoke run: 3 steps per setting, a few settings
    .venv/bin/python bench/async_speedup.py --workloads long_tail --runtimes sync,embedded --samplers ready_first

Two workloads, each run by every setting for the same number of optimizer steps (``--steps``), dynamic sampling off
(every generated group is trained, so trained groups = steps × P in every setting):

* **long_tail** — a randomly initialised tiny model (4 layers, width 128) with 64 new tokens on the addition
  prompts. Its completion lengths are long-tailed by construction: ``generation.stop`` holds seven characters, so
  each sampled token ends the completion with probability ≈ 7/91 (the model is near uniform over its 91 tokens),
  i.e. a geometric length capped at 64; the table prints the measured p50 and p99 (p99/p50 ≥ 4 is the target).
  The reward is the addition verifier (≈ 0 for a random model: accuracy is not meaningful here).
* **addition** — ``examples/addition.yaml`` (the default job: a warm-started tiny model), dynamic sampling off.

Settings: ``sync``; then for ``embedded`` and ``ray`` async, each sampler at staleness (or lookahead) 1 and 2,
with continuous batching and partial rollouts ``off/off``, ``on/off`` and ``on/on``. Each setting runs
``groupwise train`` in a subprocess of its own (fresh process, its own threads) and is read back from its
``metrics.jsonl``. Columns:

* ``groups/s`` — trained groups per wall second (Σ ``ds/groups_trained`` ÷ Σ ``perf/step_seconds``);
* ``speedup`` — over sync; ``bound`` — ``(g + t) / max(g, t)`` with g, t the mean generation and training
  seconds per step of the sync run (one generator, one learner); ``of bound`` — speedup ÷ bound (target ≥ 90 %
  for the best setting);
* ``gen util`` — generator utilisation: generated tokens per wall second during the run (Σ
  ``waste/generated_tokens`` ÷ Σ ``perf/step_seconds``) over the engine's full-batch tokens/s (measured here
  first: ``micro_batch_groups × G`` rows decoding ``max_new_tokens`` each with no stop, best of 3); target ≥ 80 %
  on long_tail;
* ``tok stale`` — mean token staleness (``staleness/token_mean``, with partial rollouts) and ``acc`` — held-out
  accuracy (``eval/accuracy``) at the end, at equal trained groups (target: within noise of sync).

Timings need a quiet machine (``OMP_NUM_THREADS=1`` per process as the CLI sets it); ``--quick`` only proves the
script runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
SAMPLERS = {"ready_first": "max_staleness_versions", "in_order": "max_lookahead_versions",
            "windowed": "max_staleness_versions", "weight_fifo": "max_staleness_versions"}  # fmt: skip
MODES = {"off/off": (False, "off"), "on/off": (True, "off"), "on/on": (True, "continue")}
LONG_TAIL_STOPS = ["0", "1", "2", "3", "4", "5", "6"]


def workload(name: str, steps: int, quick: bool) -> dict[str, Any]:
    """The base config of a workload (sync mode), as a plain dict."""
    if name == "addition":
        data = yaml.safe_load((ROOT / "examples/addition.yaml").read_text())
        data["model"]["path"] = str(ROOT / data["model"]["path"])
        data["grpo"]["dynamic_sampling"] = {"enabled": False}
        data["eval"] = {"every": 0, "at_start": False, "at_end": True, "num_prompts": 64 if quick else 200}
    else:
        data = {
            "model": {"source": "tiny"},
            "data": {"task": "addition", "addition": {"min_digits": 1, "max_digits": 2, "num_eval": 32}},
            "generation": {"max_new_tokens": 64, "stop": list(LONG_TAIL_STOPS)},
            "grpo": {"num_prompts_per_step": 16, "num_generations_per_prompt": 8,
                     "dynamic_sampling": {"enabled": False}},
            "eval": {"every": 0, "at_start": False, "at_end": True, "num_prompts": 32},
        }  # fmt: skip
    if quick:
        data["grpo"]["num_prompts_per_step"], data["grpo"]["num_generations_per_prompt"] = 4, 4
    data["mode"] = "sync"
    data["run"] = {"seed": 0, "max_steps": steps, "output_dir": "", "name": ""}
    data["logging"] = {"progress": False, "tensorboard": False}
    data["checkpoint"] = {"every": 0, "save_final": False}
    return data


def setting(base: dict[str, Any], runtime: str, sampler: str, staleness: int, mode: str) -> dict[str, Any]:
    data = json.loads(json.dumps(base))
    continuous, partial = MODES[mode]
    data["mode"] = "async"
    data["generation"]["continuous_batching"] = continuous
    p = data["grpo"]["num_prompts_per_step"]
    data["async"] = {"sampler": {"name": sampler, SAMPLERS[sampler]: staleness}, "partial_rollouts": partial,
                     "max_inflight_prompts": p * (staleness + 1), "max_buffered_rollouts": p * (staleness + 1)}
    data["loss"] = {**data.get("loss", {}), "importance_sampling": True}
    if runtime == "ray":
        data["runtime"] = {"backend": "ray"}
    return data


def train(data: dict[str, Any], out: Path, name: str) -> Path:
    """``groupwise train`` of ``data`` in a subprocess; returns its run directory."""
    data = {**data, "run": {**data["run"], "output_dir": str(out), "name": name}}
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "groupwise.cli", "train", str(path)], env=env, cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return out / name


def summarise(run_dir: Path) -> dict[str, float]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [line for line in lines if "ds/groups_trained" in line]
    evals = [line["eval/accuracy"] for line in lines if "eval/accuracy" in line]
    wall = sum(line["perf/step_seconds"] for line in steps)
    stale = [line["staleness/token_mean"] for line in steps if "staleness/token_mean" in line]
    return {
        "groups": sum(line["ds/groups_trained"] for line in steps),
        "wall": wall,
        "gen": statistics.fmean(line["perf/gen_seconds"] for line in steps),
        "train": statistics.fmean(line["perf/train_seconds"] for line in steps),
        "tokens": sum(line.get("waste/generated_tokens", 0.0) for line in steps),
        "acc": evals[-1] if evals else float("nan"),
        "token_staleness": statistics.fmean(stale) if stale else float("nan"),
    }


def completion_lengths(run_dir: Path) -> list[int]:
    return [len(json.loads(line)["completion_ids"]) for path in run_dir.glob("train_data/*.jsonl")
            for line in path.read_text().splitlines()]  # fmt: skip


def full_batch_tokens_per_s(data: dict[str, Any]) -> float:
    """The engine decoding ``micro_batch_groups × G`` rows for ``max_new_tokens`` each, no stop: tokens/s (best of
    3, in this process, after one warm-up call)."""
    import torch

    from groupwise.config import config_from_dict
    from groupwise.generation.engine import Engine
    from groupwise.trainer.builder import build_components
    from groupwise.types import GenerationRequest, SamplingParams

    cfg = config_from_dict({**data, "run": {**data["run"], "output_dir": "/tmp", "name": "full-batch"}})
    torch.set_num_threads(1)
    parts = build_components(cfg)
    never = parts.engine.model.config.vocab_size  # an id no logit can draw: no row stops before max_new_tokens
    engine = Engine(parts.engine.model, parts.policy.tokenizer, (never,), fast_decode=cfg.generation.fast_decode)
    rows = cfg.generation.micro_batch_groups * cfg.grpo.num_generations_per_prompt
    new = cfg.generation.max_new_tokens
    prompt = parts.rollouts.encode(parts.task.train_prompts()[0])
    requests = [GenerationRequest(prompt, cfg.grpo.num_generations_per_prompt, seed)
                for seed in range(cfg.generation.micro_batch_groups)]  # fmt: skip
    sampling = SamplingParams(max_new_tokens=new, temperature=cfg.generation.temperature)
    engine.generate(requests, sampling)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        engine.generate(requests, sampling)
        best = min(best, time.perf_counter() - start)
    return rows * new / best


def percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))]) if ordered else float("nan")


def run_workload(name: str, args: argparse.Namespace, out: Path) -> None:
    base = workload(name, args.steps, args.quick)
    out.mkdir(parents=True, exist_ok=True)
    full = full_batch_tokens_per_s(base)
    sync = summarise(train(base, out, f"{name}-sync"))
    lengths = completion_lengths(out / f"{name}-sync")
    bound = (sync["gen"] + sync["train"]) / max(sync["gen"], sync["train"])
    print(f"\n## {name}: {args.steps} steps, P={base['grpo']['num_prompts_per_step']}, "
          f"G={base['grpo']['num_generations_per_prompt']}; completion lengths p50 {percentile(lengths, 0.5):g}, "
          f"p99 {percentile(lengths, 0.99):g}; sync g = {sync['gen']:.3f} s, t = {sync['train']:.3f} s per step; "
          f"bound {bound:.2f}x; engine full batch {full:.0f} tok/s\n")  # fmt: skip
    header = ["setting", "groups/s", "speedup", "of bound", "gen util", "tok stale", "acc"]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    rows = [("sync", sync)]
    for runtime in args.runtimes:
        if runtime == "sync":
            continue
        for sampler in args.samplers:
            for staleness in args.staleness:
                for mode in args.modes:
                    label = f"{runtime} {sampler} s{staleness} cb/pr {mode}"
                    slug = f"{name}-{runtime}-{sampler}-s{staleness}-{mode.replace('/', '-')}"
                    rows.append((label, summarise(train(setting(base, runtime, sampler, staleness, mode), out, slug))))
    sync_rate = sync["groups"] / sync["wall"]
    for label, result in rows:
        rate = result["groups"] / result["wall"]
        speedup = rate / sync_rate
        util = result["tokens"] / result["wall"] / full
        of_bound = "—" if label == "sync" else f"{speedup / bound:.0%}"
        print(f"| {label} | {rate:.2f} | {speedup:.2f}x | {of_bound} | {util:.0%} | "
              f"{result['token_staleness']:.2f} | {result['acc']:.3f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 steps, P=G=4, a few settings")
    parser.add_argument("--workloads", default="long_tail,addition")
    parser.add_argument("--runtimes", default=None, help="of sync,embedded,ray (default all; --quick: sync,embedded)")
    parser.add_argument("--samplers", default=None, help=f"of {','.join(SAMPLERS)} (default all; --quick: ready_first)")
    parser.add_argument("--staleness", default=None, help="default 1,2 (--quick: 1)")
    parser.add_argument("--modes", default=None, help=f"continuous batching/partial rollouts, of {','.join(MODES)}")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per setting (default 60; --quick 3)")
    parser.add_argument("--out", default="runs/async_speedup")
    args = parser.parse_args()
    quick = args.quick
    args.runtimes = (args.runtimes or ("sync,embedded" if quick else "sync,embedded,ray")).split(",")
    args.samplers = (args.samplers or ("ready_first" if quick else ",".join(SAMPLERS))).split(",")
    args.staleness = [int(s) for s in (args.staleness or ("1" if quick else "1,2")).split(",")]
    args.modes = (args.modes or ",".join(MODES)).split(",")
    args.steps = args.steps or (3 if quick else 60)
    print(f"# bench/async_speedup.py {' '.join(sys.argv[1:])}\n{platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for name in args.workloads.split(","):
        run_workload(name, args, ROOT / args.out / stamp)


if __name__ == "__main__":
    main()
