"""The compiled decode step against the eager ones and the machine's bound: SmolLM2-135M fp32 at 16 and 128 rows.

    taskset -c 1 env OMP_NUM_THREADS=1 .venv/bin/python bench/compiled_decode.py --threads 1   # ~15 min, 1 core
    .venv/bin/python bench/compiled_decode.py --smoke                                          # a tiny model

Three engines on the same model and requests (P prompts × 8 samples, every row runs to the end, as in
``bench/roofline.py``), their timed calls alternating within each repeat so a load change hits all three alike:

* **eager** — what a CPU run uses without ``generation.compile``: the fast step on the compacting loop;
* **eager slots** — the same step on the static slots (``cuda_graphs='eager'``), the code the compiler compiles;
* **compiled** — ``compile_step=True``: the slot step compiled by torch's compiler (inductor).

A step's time is the marginal one, ``(t(1 + N) − t(1)) / N`` for N new tokens, best of ``--repeats``; the bound and
the rates are ``bench/roofline.py``'s (``max(FLOPs / matmul rate, bytes / copy rate)``, rates measured just before
each row and after each repeat, the best kept: on a shared core, rates measured in one moment of sharing and steps
taken as their best of several would make a bound the steps can beat). The compile's own cost is the compiled
engine's ``compile_seconds`` (its first call of each bucket).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from roofline import (
    GROUP_SIZE,
    SMOKE_TINY,
    Shape,
    chat_prompts,
    cpu_model,
    decode_bytes,
    decode_flops,
    machine_rates,
    never_drawn_token,
)

from groupwise.generation.engine import Engine
from groupwise.model.loading import Policy, load_policy
from groupwise.types import GenerationRequest, SamplingParams

ENGINES = {"eager": {}, "eager slots": {"cuda_graphs": "eager"}, "compiled": {"compile_step": True}}
TARGETS = {16: 1.5, 128: 1.3}  # rows -> the ratio to the bound to meet (the compiled step)


def timed(engine: Engine, requests: list[GenerationRequest], new_tokens: int) -> float:
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
    start = time.perf_counter()
    engine.generate(requests, sampling)
    return time.perf_counter() - start


def measure_row(policy: Policy, rows: int, new: int, args) -> list[str]:
    rates = machine_rates(args)
    prompts = chat_prompts(policy, rows // GROUP_SIZE)
    requests = [GenerationRequest(p, GROUP_SIZE, seed=i) for i, p in enumerate(prompts)]
    eos = [never_drawn_token(policy)]
    engines = {name: Engine(policy.model, policy.tokenizer, eos, max_batch_rows=max(256, rows), **kwargs)
               for name, kwargs in ENGINES.items()}  # fmt: skip
    for engine in engines.values():  # warm-up: the probe, slots, oneDNN primitives, the compile
        timed(engine, requests, 1 + new)
    graphs = engines["compiled"].decode_graphs
    compile_s = graphs.compile_seconds if graphs is not None else float("nan")
    short: dict[str, list[float]] = {name: [] for name in engines}
    long: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            short[name].append(timed(engine, requests, 1))
            long[name].append(timed(engine, requests, 1 + new))
        now = machine_rates(args)  # the best rates seen, as the steps are their best (module docstring)
        rates = (max(rates[0], now[0]), max(rates[1], now[1]))
    context = statistics.mean(len(p) for p in prompts) + 1 + (new + 1) / 2
    shape = Shape.of(policy.model.config)
    bound = max(decode_flops(shape, rows, context) / rates[0], decode_bytes(shape, rows, context) / rates[1])
    steps = {name: (min(long[name]) - min(short[name])) / new for name in engines}
    eager = steps["eager"]
    lines = []
    for name, step in steps.items():
        verdict = ""
        if name == "compiled":
            verdict = "met" if step / bound <= TARGETS.get(rows, 1.5) else "missed"
            verdict = f"≤ {TARGETS.get(rows, 1.5)}× {verdict}; compile {compile_s:.1f} s"
        lines.append(
            f"| {rows} | {name} | {rates[0] / 1e9:.0f} / {rates[1] / 1e9:.1f} | {1e3 * bound:.1f} "
            f"| {1e3 * step:.1f} | **{step / bound:.2f}×** | {step / eager:.2f} | {verdict} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 128], help="decode batch sizes")
    parser.add_argument("--new-tokens", type=int, default=48, help="decode steps timed per call")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="a small random Llama and few steps")
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.new_tokens, args.repeats = [16], 4, 1
    torch.set_num_threads(args.threads)
    print(
        f"# {cpu_model()}, {os.cpu_count()} CPUs, torch {torch.__version__}, threads {args.threads}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    policy = (
        load_policy("tiny", tiny=SMOKE_TINY, device="cpu")
        if args.smoke
        else load_policy("gguf", "smollm2", device="cpu")
    )
    print("| rows | engine | rates GFLOP/s / GB/s | bound ms | step ms | × bound | vs eager | target |")
    print("|---|---|---|---|---|---|---|---|")
    with torch.inference_mode():
        for rows in args.rows:
            for line in measure_row(policy, rows, args.new_tokens, args):
                print(line, flush=True)
    print(f"# load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
