"""Benchmark: groupwise on one GPU — generation vs Hugging Face ``generate``, the learner step, a learning check.

One command prints one table and writes it (with every raw number) as JSON. Sections, each time-boxed so the
whole run fits ``--budget`` seconds (480 = 8 minutes on one H200; what does not fit is skipped and listed):

- **check**: CUDA-graph replays against the same slot step run eagerly (bf16, bit-identical expected), again
  after an in-place weight update (no recapture), and the graph path against the compacting path (float32);
- **generation**: tokens/s and ms/step, the engine (CUDA graphs) vs HF ``generate`` (default dynamic cache),
  bf16, random weights of the SmolLM2-135M and Qwen2.5-0.5B shapes, at 64 x 256, 256 x 256 (also as
  32 prompts x G = 8), 1024 x 256 (rows x new tokens); random prompts of 16–48 tokens, temperature 1, EOS id 0
  (random weights rarely draw it, so rows run to the end). The engine: best of ``--repeats`` after a warm-up
  run that captures its graphs; HF: one run after a 4-token warm-up. Peak memory: what the call needs beyond
  the weights (the engine's static slots and graph pools included);
- **vllm**: the vLLM backend (``generation.backend: vllm``) against the built-in engine at the generation settings
  and shapes (interleaved, ratio = vLLM ÷ engine), its start time and one weight sync (``bench/gpu_vllm.py``);
  one skipped row where vllm is not installed;
- **learner**: ``Learner.train_step`` on 16 x 1,024 and 64 x 1,024 tokens (64 prompt + 960 completion): step
  time, tokens/s, peak memory (``torch.cuda.max_memory_allocated``, whole process) and model-FLOPs utilisation
  ``MFU = (6·N·tokens + 6·L·H·D·Σ T²) / step time / peak``: N the matmul parameters (the tied LM head once, no
  embedding lookup), the second term causal attention (forward 2·H·D·T² per layer and sequence, backward
  twice that). Peak: ``--peak-tflops`` (default 989, the H200 dense bf16 spec; the bf16 matmul rate measured
  at start, ~790 on these machines, is printed beside it);
- **learning**: the SFT recipe (``recipes/warm_start_addition.yaml``) trains the tiny addition model on the
  device, then GRPO with dynamic sampling (``examples/addition.yaml``) from it, time-boxed: held-out greedy
  accuracy at the start of GRPO -> at its end;
- **profile**: torch.profiler over a short engine call and a short HF call: device-busy fraction in the table,
  the top kernels in ``<out>_profile.txt``.

Targets (checked at the end): engine >= 3x HF tok/s at 256 x 256 on SmolLM2, >= 2x on Qwen2.5; learner MFU
>= 30% on Qwen2.5 at 64 x 1,024; the learning check gains >= 30 points.

The device command (the GPU image lacks pydantic and its dependencies; ``scripts/gpu_wheels.sh`` fetches
them into ``.whl/``, which must travel with the tree)::

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:src python3 bench/gpu.py --out $OUT/gpu.json

``--smoke`` runs every section on CPU with tiny shapes in seconds (a CI test): the engine's slot path with
eager replays instead of graphs.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import transformers
from gpu_learning import learning_check
from gpu_runs import (
    SHAPES,
    SMOKE_SHAPES,
    Setting,
    generation_rows,
    gpu_checks,
    learner_rows,
    profile_rows,
)
from gpu_vllm import vllm_rows

GENERATION_SETTINGS = "64x256,256x256,256x256/8,1024x256"
SMOKE_GENERATION_SETTINGS = "4x8,8x8/4"
LEARNER_SHAPES = ((16, 1024), (64, 1024))
SMOKE_LEARNER_SHAPES = ((4, 32),)
# Seconds per section (the total is --budget; unused time passes to the next sections).
SHARES = {"check": 25, "generation": 170, "vllm": 90, "learner": 70, "learning": 190, "profile": 25}
COLUMNS = ("section", "model", "shape", "method", "time", "rate", "peak_mib", "ratio", "note")


class Clock:
    """The run's deadline and each section's: a section may use its share plus what earlier ones left."""

    def __init__(self, budget: float, scale: float) -> None:
        self.start = time.perf_counter()
        self.deadline = self.start + budget
        self.scale = scale
        self.section_deadline = self.deadline
        self._planned = self.start

    def begin(self, section: str) -> None:
        self._planned = max(self._planned, time.perf_counter()) + SHARES[section] * self.scale
        self.section_deadline = min(self.deadline, self._planned)

    def left(self) -> float:
        return self.section_deadline - time.perf_counter()

    def allows(self, estimate: float) -> bool:
        return self.left() >= estimate


def measure_matmul_tflops(device: str) -> float | None:
    """bf16 dense matmul rate (8192³, median of 10 after 3 warm-ups), the practical peak for MFU."""
    if device != "cuda":
        return None
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    del a, b
    torch.cuda.empty_cache()
    return 2 * 8192**3 / sorted(times)[len(times) // 2] / 1e12


def machine(device: str) -> dict[str, Any]:
    info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "device": device, "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    if device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        info.update(gpu=properties.name, memory_gib=round(properties.total_memory / 2**30, 1),
                    multiprocessors=properties.multi_processor_count,
                    capability=f"{properties.major}.{properties.minor}")  # fmt: skip
    else:
        info.update(cpu=platform.processor() or platform.machine())
    return info


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, each met / missed / not measured, read off the result rows."""

    def find(section: str, model: str, shape: str, method: str | None = None) -> dict[str, Any] | None:
        for row in rows:
            if (row["section"], row["model"].split(" ")[0], row["shape"]) == (section, model, shape) and (
                method is None or row["method"] == method
            ):
                return row
        return None

    wanted = [
        ("engine >= 3x HF tok/s, smollm2-135m 256 x 256", find("generation", "smollm2-135m", "256 x 256",
                                                               "groupwise engine"), "speedup", 3.0),
        ("engine >= 2x HF tok/s, qwen2.5-0.5b 256 x 256", find("generation", "qwen2.5-0.5b", "256 x 256",
                                                               "groupwise engine"), "speedup", 2.0),
        ("learner MFU >= 30%, qwen2.5-0.5b 64 x 1,024", find("learner", "qwen2.5-0.5b", "64 x 1,024"), "mfu", 0.30),
        ("learning check gains >= 30 points", next((r for r in rows if r["section"] == "learning"), None),
         "gain_points", 30.0),
    ]  # fmt: skip
    out = []
    for what, row, key, threshold in wanted:
        value = None if row is None else row.get(key)
        status = "not measured" if value is None else ("met" if value >= threshold else "MISSED")
        out.append({"target": what, "value": value, "status": status})
    return out


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        print("| " + " | ".join("" if row.get(c) is None else str(row.get(c)) for c in COLUMNS) + " |")


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = "cpu" if args.smoke else "cuda"
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    clock = Clock(args.budget, scale=args.budget / sum(SHARES.values()))
    peak_measured = measure_matmul_tflops(device)
    rows: list[dict[str, Any]] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = [Setting.parse(s) for s in (args.settings or (SMOKE_GENERATION_SETTINGS if args.smoke
                                                              else GENERATION_SETTINGS)).split(",")]  # fmt: skip
    sections = args.sections.split(",")
    seconds: dict[str, float] = {}
    for section in SHARES:
        if section not in sections:
            continue
        clock.begin(section)
        started = time.perf_counter()
        print(f"# {section} ({clock.left():.0f} s)", file=sys.stderr, flush=True)
        if section == "check":
            rows += gpu_checks(shapes["smollm2-135m"], device, args.smoke)
        elif section == "generation":
            for shape in shapes.values():
                rows += generation_rows(shape, settings, device, args.repeats, clock.allows, args.smoke)
        elif section == "vllm":
            for shape in shapes.values():
                rows += vllm_rows(shape, settings, device, args.repeats, clock.allows, args.smoke)
        elif section == "learner":
            learner_shapes = SMOKE_LEARNER_SHAPES if args.smoke else LEARNER_SHAPES
            for shape in shapes.values():
                rows += learner_rows(shape, list(learner_shapes), device, args.learner_micro_rows, args.learner_dtype,
                                     args.peak_tflops, clock.allows, args.smoke)  # fmt: skip
        elif section == "learning":
            with tempfile.TemporaryDirectory() as workdir:
                rows += learning_check(device, Path(workdir), clock.left, args.smoke)
        elif section == "profile":
            rows += profile_rows(shapes["smollm2-135m"], device, out.with_name(out.stem + "_profile.txt"), args.smoke)
        seconds[section] = round(time.perf_counter() - started, 1)
        out.write_text(json.dumps({"partial": True, "rows": rows}, indent=1, default=str))  # survives a kill
    info = machine(device)
    info.update(measured_bf16_matmul_tflops=peak_measured, mfu_peak_tflops=args.peak_tflops, smoke=args.smoke,
                seconds=round(time.perf_counter() - clock.start, 1), section_seconds=seconds)  # fmt: skip
    return {"machine": info, "rows": rows, "targets": [] if args.smoke else targets(rows),
            "skipped": [r for r in rows if str(r.get("note", "")).startswith("skipped")]}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write (the profile goes beside it)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU, every section in seconds")
    parser.add_argument("--budget", type=float, default=None, help="seconds for the whole run (default 480; smoke 60)")
    parser.add_argument("--sections", default=",".join(SHARES), help=f"comma-separated subset of {', '.join(SHARES)}")
    parser.add_argument("--settings", help=f"generation ROWSxNEW[/G] list (default {GENERATION_SETTINGS})")
    parser.add_argument("--repeats", type=int, help="timed engine runs per setting, best kept (default 2; smoke 1)")
    parser.add_argument("--learner-micro-rows", type=int, default=8, help="optimizer.micro_batch_rows")
    parser.add_argument("--learner-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="the peak MFU is measured against")
    args = parser.parse_args()
    if args.budget is None:
        args.budget = 60.0 if args.smoke else 480.0
    if args.repeats is None:
        args.repeats = 1 if args.smoke else 2
    if not args.smoke and not torch.cuda.is_available():
        print("bench/gpu.py needs a CUDA GPU; --smoke runs the same code paths on CPU", file=sys.stderr)
        return 2
    torch.set_num_threads(1 if args.smoke else torch.get_num_threads())
    result = run(args)
    print(f"# {json.dumps(result['machine'])}")
    print_table(result["rows"])
    if args.smoke:
        print("# targets: not checked with --smoke (tiny shapes on CPU)")
    for target in result["targets"]:
        value = "" if target["value"] is None else f" ({target['value']:.3g})"
        print(f"# target: {target['target']}: {target['status']}{value}")
    for skipped in result["skipped"]:
        print(f"# skipped: {skipped['section']} {skipped['model']} {skipped['shape']} ({skipped['note']})")
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
