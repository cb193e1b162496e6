"""Learner step time on 1 and N data-parallel ranks (``learner.num_ranks``), with the all-reduce alone beside it.

    .venv/bin/python bench/learner_scaling.py                       # CPU, gloo: one learner in-process, then 2 ranks
    .venv/bin/python bench/learner_scaling.py --sharding fsdp
    .venv/bin/python bench/learner_scaling.py --device cuda --ranks 1 2 4 --hidden 1024 --layers 16
    .venv/bin/python bench/learner_scaling.py --smoke               # seconds: proves the script runs

Every configuration trains the same steps of synthetic rows (whole groups of random prompts and completions,
fixed seed) on a tiny Llama sized by ``--hidden`` / ``--layers`` (default ≈ 26M parameters, so the step dominates
the driver's overhead). "in-process" is the one-learner path of a run (no ranks); "N ranks" sends each step to N
spawned rank processes, which split it by whole groups; each rank runs on cores ÷ N threads (the run's own
split). The one learner runs once per thread count in ``--baseline-threads`` (default: 1 and every core), and
every speed-up is against the fastest of those: ranks must beat the best single process on the same cores,
not a handicapped one. The step time is the driver's wall time for
``train_step`` (median over the measured steps). "all-reduce" is one ``torch.distributed.all_reduce`` of a
float32 tensor the size of the trained parameters among N fresh processes of the same backend: the
communication DDP adds per optimizer update, timed alone (median of ``--steps`` calls); under DDP it overlaps
with the backward pass, so the step pays at most that.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from groupwise.batch import RowBatch
from groupwise.config import config_from_dict
from groupwise.runtime.learner_ranks import LearnerRanks, RankedLearner, free_port
from groupwise.trainer.builder import build_learner, load_policy_from_config


def synthetic_rows(seed: int, groups: int, size: int, prompt_len: int, completion_len: int, vocab: int) -> RowBatch:
    rng = random.Random(seed)
    cols: dict[str, list] = {k: [] for k in ("group_id", "prompt_ids", "completion_ids", "generation_logprobs",
                                             "version_spans", "advantage")}
    for group in range(groups):
        prompt = [1] + [rng.randrange(4, vocab) for _ in range(prompt_len - 1)]
        for _ in range(size):
            length = rng.randrange(completion_len // 2, completion_len + 1)
            completion = [rng.randrange(4, vocab) for _ in range(length)]
            cols["group_id"].append(group)
            cols["prompt_ids"].append(prompt)
            cols["completion_ids"].append(completion)
            cols["generation_logprobs"].append([-3.0] * len(completion))
            cols["version_spans"].append(((0, len(completion)),))
            cols["advantage"].append(rng.uniform(-1.0, 1.0))
    return RowBatch({**cols, "advantage": torch.tensor(cols["advantage"], dtype=torch.float32)})


def config(args: argparse.Namespace, ranks: int):
    tiny = {"vocab": "full", "num_layers": args.layers, "hidden_size": args.hidden,
            "num_heads": max(1, args.hidden // 64), "intermediate_size": 4 * args.hidden,
            "max_position_embeddings": 512}
    data = {"model": {"source": "tiny", "device": args.device, "tiny": tiny},
            "optimizer": {"micro_batch_rows": args.micro_batch_rows}, "grpo": {"num_prompts_per_step": args.groups}}
    if ranks > 1:
        data["learner"] = {"num_ranks": ranks, "sharding": args.sharding}
    return config_from_dict(data)


def step_seconds(learner, steps: list[RowBatch], warmup: int) -> float:
    times = []
    for index, rows in enumerate(steps):
        start = time.perf_counter()
        learner.train_step(rows)
        if index >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _all_reduce_rank(rank: int, world: int, port: int, numel: int, repeats: int, device: str, out) -> None:
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    where = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    tensor = torch.ones(numel, dtype=torch.float32, device=where)
    times = []
    for _ in range(repeats + 1):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    if rank == 0:
        out.put(statistics.median(times[1:]))
    dist.destroy_process_group()


def all_reduce_seconds(world: int, numel: int, repeats: int, device: str) -> float:
    context = mp.get_context("spawn")
    out = context.Queue()
    port = free_port()
    procs = [context.Process(target=_all_reduce_rank, args=(r, world, port, numel, repeats, device, out))
             for r in range(world)]
    for proc in procs:
        proc.start()
    result = out.get(timeout=600)
    for proc in procs:
        proc.join(60)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sharding", default="ddp", choices=["ddp", "fsdp"])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2], help="rank counts (≥ 2) after the in-process row")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--completion-len", type=int, default=128)
    parser.add_argument("--micro-batch-rows", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--baseline-threads", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}),
                        help="torch threads of the one-learner rows; speed-ups are against the fastest")
    parser.add_argument("--smoke", action="store_true", help="a tiny model and two steps: proves the script runs")
    args = parser.parse_args()
    if args.smoke:
        args.hidden, args.layers, args.groups, args.group_size = 64, 2, 4, 2
        args.prompt_len, args.completion_len, args.steps, args.warmup = 8, 8, 2, 1
    vocab = 91
    steps = [synthetic_rows(seed, args.groups, args.group_size, args.prompt_len, args.completion_len, vocab)
             for seed in range(args.steps + args.warmup)]
    cfg = config(args, 1)
    rows = []
    for threads in args.baseline_threads:
        torch.set_num_threads(threads)
        torch.manual_seed(cfg.run.seed)
        learner = build_learner(cfg, load_policy_from_config(cfg).model)
        numel = sum(p.numel() for p in learner.model.parameters() if p.requires_grad)
        rows.append((f"in-process, {threads} thread(s)", 1, threads, step_seconds(learner, steps, args.warmup), None))
        del learner
    cores = os.cpu_count() or 1
    for ranks in args.ranks:
        ranks_obj = LearnerRanks(config(args, ranks))
        try:
            ranks_obj.wait_started()
            seconds = step_seconds(RankedLearner(ranks_obj), steps, args.warmup)
        finally:
            ranks_obj.close()
        reduce_s = all_reduce_seconds(ranks, numel, args.steps, args.device)
        rows.append((f"{ranks} rank(s), {args.sharding}", ranks, max(1, cores // ranks), seconds, reduce_s))
    tokens = sum(len(c) for c in steps[0]["completion_ids"])
    print(f"device {args.device}, {numel / 1e6:.1f}M trained parameters, {args.groups} x {args.group_size} rows, "
          f"~{tokens} completion tokens per step, {cores} cores; speed-up against the fastest in-process row")
    print(f"{'learner':<26} {'ranks':>5} {'threads':>7} {'step s':>9} {'speed-up':>9} {'all-reduce s':>13}")
    base = min(seconds for name, ranks, _, seconds, _ in rows if ranks == 1)
    for name, ranks, threads, seconds, reduce_s in rows:
        reduce_text = f"{reduce_s:13.4f}" if reduce_s is not None else f"{'-':>13}"
        threads_text = f"{threads} each" if ranks > 1 else str(threads)
        print(f"{name:<26} {ranks:>5} {threads_text:>7} {seconds:9.3f} {base / seconds:9.2f} {reduce_text}")

if __name__ == "__main__":
    main()
