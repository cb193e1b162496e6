"""Learner-step peak memory and time on a Qwen2.5-shaped model with random weights: old path vs new path.

    .venv/bin/python bench/memory.py                  # every setting, one fresh subprocess each (~30 min, 2 cores)
    .venv/bin/python bench/memory.py --smoke          # tiny shapes: proves the script runs and prints its table
    .venv/bin/python bench/memory.py --only new       # the settings whose label contains "new"
    .venv/bin/python bench/memory.py --shape smollm2  # SmolLM2-135M's shape: full fine-tuning vs LoRA (~3 min)

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
does not fit fails alone (the row says so). **process** = max RSS − RSS after the imports: everything the
learner holds at its peak (weights, gradients, AdamW state, the step). Times are wall-clock seconds of the
measured step; on a shared machine they mean nothing — run the script on a quiet one. The subprocesses inherit
the environment, so ``MALLOC_MMAP_THRESHOLD_=1048576`` (glibc's mmap threshold pinned at 1 MiB; see docs/learner.md)
measures a step with freed large tensors going back to the system.

``--shape smollm2``: SmolLM2-135M's shape (Llama, V = 49,152, hidden 576, 9 / 3 heads, intermediate 1536, 30
layers, tied embeddings), full fine-tuning against LoRA (rank 16 on every projection) at two step sizes: 16 rows
× 48 tokens and 64 rows × 12 (the times-tables example's step). LoRA's process peak should sit below full
fine-tuning's by at least the AdamW state full fine-tuning keeps for the weights LoRA freezes (two float32
moments: 8 bytes per frozen parameter); the script prints that comparison under the table.
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
SMOLLM2 = dict(vocab_size=49_152, hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
               intermediate_size=1536, num_hidden_layers=30, tie_word_embeddings=True, max_position_embeddings=2048,
               rope_theta=100_000.0, rms_norm_eps=1e-5)
SHAPES = {"qwen": QWEN, "smollm2": SMOLLM2}
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


def smollm2_settings(smoke: bool) -> list[Setting]:
    """Full fine-tuning and LoRA on the chunked path at 16 × 48 and 64 × 12, one micro-batch each."""
    sizes = ((4, 8), (8, 4)) if smoke else ((16, 48), (64, 12))
    return [Setting("new", rows, tokens, False, lora, rows) for rows, tokens in sizes for lora in (False, True)]


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


def child(setting: Setting, shape: str, smoke: bool, limit_gib: float) -> dict:
    """Build, warm up, measure one step; runs inside the fresh subprocess, its heap capped at ``limit_gib`` + 4 GiB
    (the model, AdamW state and libraries) so a setting that does not fit fails alone instead of starving the
    machine."""
    cap = int((limit_gib + 4) * 2**30)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from groupwise.config.algorithm import LossSection, OptimizerSection
    from groupwise.model.lora import apply_lora, lora_config
    from groupwise.trainer.builder import enable_gradient_checkpointing
    from groupwise.trainer.learner import Learner, LearnerSettings

    start = _rss_kib()
    torch.manual_seed(0)
    llama = shape == "smollm2"
    config_class, model_class = (LlamaConfig, LlamaForCausalLM) if llama else (Qwen2Config, Qwen2ForCausalLM)
    config = config_class(**(SMOKE if smoke else SHAPES[shape]))
    config._attn_implementation = "sdpa"
    model = model_class(config)
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
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)  # LoRA: every base weight
    return {"peak_gib": (peak - before) / 2**20, "before_gib": before / 2**20, "seconds": seconds,
            "process_gib": (peak - start) / 2**20, "frozen_adamw_gib": 8 * frozen / 2**30,
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
    parser.add_argument("--shape", default="qwen", choices=sorted(SHAPES), help="the model shape (module docstring)")
    parser.add_argument("--only", default="", help="run the settings whose label contains this text")
    parser.add_argument("--limit-gib", type=float, default=10.0, help="skip old-path settings above this")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(Setting(**json.loads(args.child)), args.shape, args.smoke, args.limit_gib)))
        return
    shape = SMOKE if args.smoke else SHAPES[args.shape]
    vocab, layers = shape["vocab_size"], shape["num_hidden_layers"]
    print(f"model: {'smoke' if args.smoke else args.shape} shape, {layers} layers, V={vocab}; prompts {PROMPT_TOKENS} "
          "tokens; peak = max RSS − RSS before the step, process = max RSS − RSS after the imports (one fresh process "
          "per setting)\n")
    print("| setting | path | rows/micro-batch | peak (GiB) | RSS before (GiB) | process (GiB) | step (s) |")
    print("|---|---|---|---|---|---|---|")
    results: dict[str, dict] = {}
    for setting in smollm2_settings(args.smoke) if args.shape == "smollm2" else settings(args.smoke):
        if args.only not in str(setting):
            continue
        if setting.path == "old" and 3 * plain_logits_gib(setting, vocab) > args.limit_gib:
            print(f"| {setting} | plain | {setting.rows_per_micro_batch} | not run: ≥ 3 × "
                  f"{plain_logits_gib(setting, vocab):.1f} GiB of logits > {args.limit_gib:g} GiB | | | |")
            continue
        command = [sys.executable, __file__, "--child", json.dumps(asdict(setting)), "--limit-gib",
                   str(args.limit_gib), "--shape", args.shape] + (["--smoke"] if args.smoke else [])
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["?"])[-1][:80]
            print(f"| {setting} | | {setting.rows_per_micro_batch} | failed: {tail} | | | |")
            continue
        result = results[str(setting)] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"| {setting} | {result['logprob_path']} | {setting.rows_per_micro_batch} | {result['peak_gib']:.2f} "
              f"| {result['before_gib']:.2f} | {result['process_gib']:.2f} | {result['seconds']:.1f} |", flush=True)
    print_lora_savings(results)


def print_lora_savings(results: dict[str, dict]) -> None:
    """For every size measured with and without LoRA: how far LoRA's process peak sits below full fine-tuning's,
    against the AdamW state of the weights LoRA freezes."""
    for label, lora in results.items():
        full = results.get(label.removesuffix(" lora")) if label.endswith(" lora") else None
        if full is None:
            continue
        saved, needed = full["process_gib"] - lora["process_gib"], lora["frozen_adamw_gib"]
        verdict = "met" if saved >= needed else "missed"
        print(
            f"\n{label.removesuffix(' lora')}: LoRA's process peak is {saved:.2f} GiB below full fine-tuning's; "
            f"the frozen weights' AdamW state is {needed:.2f} GiB: {verdict}"
        )


if __name__ == "__main__":
    main()
