"""Learner-step peak memory and time on a Qwen2.5-shaped model with random weights: old path vs new path.

    .venv/bin/python bench/memory.py                  # every setting, one fresh subprocess each (~30 min, 2 cores)
    .venv/bin/python bench/memory.py --smoke          # tiny shapes: proves the script runs and prints its table
    .venv/bin/python bench/memory.py --only new       # the settings whose label contains "new"

The model: Qwen2.5-0.5B's shape (vocabulary 151,936, hidden 896, 14 heads / 2 KV heads, intermediate 4864,
tied embeddings) with 2 layers, so it runs on a CPU. A step is rows × completion tokens (prompts of 64 tokens)
trained as one learner step: one optimizer update, all rows in one micro-batch at 4 × 1,024 and 4 × 512,
4 rows per micro-batch at 8 × 2,048.

* **old**: the plain path (``optimizer.logprob_chunk_tokens: null``): full ``[rows, T, V]`` float32 logits
  and a softmax of the same size, plus their gradients;
* **new**: the chunked LM-head path (the default ``optimizer.logprob_chunk_tokens``, 512 positions per chunk),
  padding dropped before the head.

Each setting runs in a fresh subprocess: build the model and learner, take one warm-up step on a tiny batch
(AdamW allocates its state there), read the resident set size (RSS), take the measured step, then read the
process's maximum RSS (``resource.getrusage``). **peak** = max RSS − RSS before the step: the memory the step
itself added (activations, logits, gradients). Settings whose plain-path logits alone would exceed
``--limit-gib`` are not started, and each subprocess's heap is capped at that limit + 4 GiB, so a setting that
does not fit fails alone (the row says so). Times are wall-clock seconds of the measured step; on a
shared machine they mean nothing — run the script on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from groupwise.config.algorithm import OptimizerSection

QWEN = dict(vocab_size=151_936, hidden_size=896, num_attention_heads=14, num_key_value_heads=2,
            intermediate_size=4864, num_hidden_layers=2, tie_word_embeddings=True, max_position_embeddings=4096)
SMOKE = dict(vocab_size=2048, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
             num_hidden_layers=2, tie_word_embeddings=True, max_position_embeddings=512)
PROMPT_TOKENS = 64
CHUNK = OptimizerSection().logprob_chunk_tokens  # the default of optimizer.logprob_chunk_tokens


@dataclass(frozen=True)
class Setting:
    path: str  # "old" (plain, full logits) or "new" (chunked)
    rows: int
    tokens: int  # completion tokens per row
    checkpointing: bool
    lora: bool
    rows_per_micro_batch: int

    def __str__(self) -> str:
        return (f"{self.path} {self.rows}x{self.tokens}" + (" ckpt" if self.checkpointing else "")
                + (" lora" if self.lora else ""))


def settings(smoke: bool) -> list[Setting]:
    """4 × 1,024: old and new, checkpointing and LoRA on/off, every row in one micro-batch. 4 × 512: old and new
    once, a size where the old path fits. 8 × 2,048: the new path four ways, 4 rows per micro-batch, and the
    old path once (it only shows that it does not fit)."""
    sizes = ((4, 64), (4, 32), (8, 128)) if smoke else ((4, 1024), (4, 512), (8, 2048))
    (small_rows, small_tokens), (mid_rows, mid_tokens), (large_rows, large_tokens) = sizes
    grid = [(ckpt, lora) for ckpt in (False, True) for lora in (False, True)]
    small = [Setting(path, small_rows, small_tokens, ckpt, lora, small_rows) for path in ("old", "new")
             for ckpt, lora in grid]
    mid = [Setting(path, mid_rows, mid_tokens, False, False, mid_rows) for path in ("old", "new")]
    large = [Setting("old", large_rows, large_tokens, False, False, 4)]
    large += [Setting("new", large_rows, large_tokens, ckpt, lora, 4) for ckpt, lora in grid]
    return small + mid + large


def plain_logits_gib(setting: Setting, vocab: int) -> float:
    """Float32 ``[rows, T + 1, V]`` logits: the plain path's smallest full-vocabulary tensor (it keeps several)."""
    return setting.rows_per_micro_batch * (setting.tokens + 1) * vocab * 4 / 2**30


def _rss_kib() -> int:
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * resource.getpagesize() // 1024


def child(setting: Setting, smoke: bool, limit_gib: float) -> dict:
    """Build, warm up, measure one step; runs inside the fresh subprocess, its heap capped at ``limit_gib`` + 4 GiB
    (the model, AdamW state and libraries) so a setting that does not fit fails alone instead of starving the
    machine."""
    cap = int((limit_gib + 4) * 2**30)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from groupwise.config.algorithm import LossSection, OptimizerSection
    from groupwise.model.lora import apply_lora, lora_config
    from groupwise.trainer.builder import enable_gradient_checkpointing
    from groupwise.trainer.learner import Learner, LearnerSettings

    torch.manual_seed(0)
    config = Qwen2Config(**(SMOKE if smoke else QWEN))
    config._attn_implementation = "sdpa"
    model = Qwen2ForCausalLM(config)
    if setting.checkpointing:
        enable_gradient_checkpointing(model)
    if setting.lora:
        model = apply_lora(model, lora_config(16, 32.0, 0.0, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                              "up_proj", "down_proj"]))
    optimizer = OptimizerSection(lr=1e-5, micro_batch_rows=setting.rows_per_micro_batch,
                                 logprob_chunk_tokens=None if setting.path == "old" else CHUNK)
    learner = Learner(model, LearnerSettings(loss=LossSection(), optimizer=optimizer, total_steps=10, temperature=1.0))
    learner.train_step(_rows(1, 8, config.vocab_size, seed=1))  # AdamW state is allocated here
    rows = _rows(setting.rows, setting.tokens, config.vocab_size, seed=2)
    before = _rss_kib()
    start = time.perf_counter()
    metrics = learner.train_step(rows)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"peak_gib": (peak - before) / 2**20, "before_gib": before / 2**20, "seconds": seconds,
            "loss": metrics["loss/total"], "logprob_path": learner.logprob_path.split(":")[0]}


def _rows(rows: int, tokens: int, vocab: int, seed: int):
    import torch

    from groupwise.batch import RowBatch

    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, vocab, (rows, PROMPT_TOKENS), generator=gen).tolist()
    completions = torch.randint(1, vocab, (rows, tokens), generator=gen).tolist()
    return RowBatch({
        "group_id": [r // 2 for r in range(rows)],
        "prompt_ids": prompts,
        "completion_ids": completions,
        "generation_logprobs": (-torch.rand(rows, tokens, generator=gen) * 10 - 5).tolist(),
        "version_spans": [((0, tokens),)] * rows,
        "advantage": torch.tensor([1.0 if r % 2 else -1.0 for r in range(rows)]),
    })  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, to check the script runs")
    parser.add_argument("--only", default="", help="run the settings whose label contains this text")
    parser.add_argument("--limit-gib", type=float, default=10.0, help="skip old-path settings above this")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(Setting(**json.loads(args.child)), args.smoke, args.limit_gib)))
        return
    vocab = (SMOKE if args.smoke else QWEN)["vocab_size"]
    print(f"model: {'smoke' if args.smoke else 'Qwen2.5-0.5B shape'}, 2 layers, V={vocab}; prompts "
          f"{PROMPT_TOKENS} tokens; peak = max RSS − RSS before the step (one fresh process per setting)\n")
    print("| setting | path | rows/micro-batch | peak (GiB) | RSS before (GiB) | step (s) |")
    print("|---|---|---|---|---|---|")
    for setting in settings(args.smoke):
        if args.only not in str(setting):
            continue
        if setting.path == "old" and 3 * plain_logits_gib(setting, vocab) > args.limit_gib:
            print(f"| {setting} | plain | {setting.rows_per_micro_batch} | not run: ≥ 3 × "
                  f"{plain_logits_gib(setting, vocab):.1f} GiB of logits > {args.limit_gib:g} GiB | | |")
            continue
        command = [sys.executable, __file__, "--child", json.dumps(asdict(setting)), "--limit-gib",
                   str(args.limit_gib)] + (["--smoke"] if args.smoke else [])
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["?"])[-1][:80]
            print(f"| {setting} | | {setting.rows_per_micro_batch} | failed: {tail} | | |")
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"| {setting} | {result['logprob_path']} | {setting.rows_per_micro_batch} | {result['peak_gib']:.2f} "
              f"| {result['before_gib']:.2f} | {result['seconds']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
