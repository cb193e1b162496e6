"""Supervised fine-tuning on task demonstrations: how the shipped warm-start model is made.

Loss: mean token cross-entropy on the demonstration tokens and the closing EOS,
``L = −(1/N) Σ_rows Σ_t∈answer log π(y_t | prompt, y_<t)`` with N the number of answer tokens of the batch.
Batches are drawn from the train split with a generator seeded from the run seed, so the recipe is
reproducible. Training stops after ``sft.steps`` or, when ``sft.stop_at_accuracy`` is set, at the first
evaluation whose held-out greedy accuracy reaches it — that is how the warm start lands on a chosen skill level.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from groupwise.config import ConfigError
from groupwise.model.loading import eos_token_ids
from groupwise.model.logprobs import completion_logprobs
from groupwise.run.metrics import MetricsWriter
from groupwise.run.rundir import RunDir, start_problems
from groupwise.run.trackers import config_trackers
from groupwise.seeding import derive_seed
from groupwise.trainer.builder import build_components
from groupwise.trainer.cpu_threads import apply_cpu_threads
from groupwise.trainer.evaluation import evaluate_policy

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from groupwise.config import RunConfig


def demonstration_ids(tokenizer: PreTrainedTokenizerBase, text: str, eos_id: int) -> list[int]:
    """Token ids of a demonstration completion followed by EOS (no BOS: it continues the prompt)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [eos_id]


def run_sft(cfg: RunConfig) -> Path:
    """Fine-tune ``cfg.model`` on ``cfg.data``'s demonstrations; returns the saved ``final/`` directory."""
    torch.manual_seed(cfg.run.seed)
    sft = cfg.sft
    problems = start_problems(cfg.run.output_dir, cfg.run.name, resume=False)
    if problems:  # refused before the model loads, like train
        raise ConfigError(problems)
    parts = build_components(cfg, group_size=1)
    run_dir = RunDir.create(cfg.run.output_dir, cfg.run.name, cfg.to_yaml(), resume=False)
    writer = MetricsWriter(run_dir, trackers=config_trackers(cfg, run_dir.root))
    writer.event(apply_cpu_threads(parts.policy.model))  # the `groupwise sft` command's thread choice, as `train`'s
    policy, task, engine, rollouts = parts.policy, parts.task, parts.engine, parts.rollouts
    tokenizer, model = policy.tokenizer, policy.model
    eos = eos_token_ids(tokenizer, model)
    prompts = task.train_prompts()
    examples = [(rollouts.encode(p), demonstration_ids(tokenizer, task.demonstration(p), eos[0])) for p in prompts]
    optimizer = torch.optim.AdamW(model.parameters(), lr=sft.lr, weight_decay=0.0)
    rng = random.Random(derive_seed("sft", cfg.run.seed))
    start = time.perf_counter()
    for step in range(1, sft.steps + 1):
        batch = [examples[rng.randrange(len(examples))] for _ in range(sft.batch_size)]
        model.train()
        logprobs, _, mask = completion_logprobs(model, [b[0] for b in batch], [b[1] for b in batch], 1.0)
        loss = -(logprobs * mask).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        metrics: dict[str, float] = {
            "step": step,
            "sft/loss": float(loss.detach()),
            "perf/elapsed_seconds": time.perf_counter() - start,
        }
        if step % sft.eval_every == 0 or step == sft.steps:
            engine.load_weights(model.state_dict(), step)
            metrics.update(evaluate_policy(engine, rollouts, task.eval_prompts(), cfg))
            writer.event(f"sft step {step}: loss={float(loss.detach()):.4f} accuracy={metrics['eval/accuracy']:.3f}")
        writer.log(step, metrics)
        target = sft.stop_at_accuracy
        if target is not None and metrics.get("eval/accuracy", -1.0) >= target:
            writer.event(f"held-out greedy accuracy {metrics['eval/accuracy']:.3f} reached {target}: stopping")
            break
    policy.save(run_dir.final_dir)
    writer.event(f"saved the fine-tuned policy to {run_dir.final_dir}")
    writer.close()
    return run_dir.final_dir
