"""Supervised fine-tuning on task demonstrations: how the shipped warm-start model is made.

Loss: mean token cross-entropy on the demonstration tokens and the closing EOS,
``L = −(1/N) Σ_rows Σ_t∈answer log π(y_t | prompt, y_<t)`` with N the number of answer tokens of the batch.
Batches are drawn from the train split with a generator seeded from the run seed, so the recipe is
reproducible. Training stops after ``sft.steps`` or, when ``sft.stop_at_accuracy`` is set, at the first
evaluation whose held-out greedy accuracy reaches it — that is how the warm start lands on a chosen skill level.
Progress goes to the console as ``train``'s does (:mod:`groupwise.run.progress`: a bar on a terminal, else a line
every 10 steps and after every slow one), showing the step's loss and the latest held-out accuracy.
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
from groupwise.run.progress import RunProgress, format_sft_stats
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


def _train_batch(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: list[tuple[tuple[int, ...], list[int]]]
) -> float:
    """One optimizer step on ``batch`` (prompt ids, demonstration ids); the batch's mean token loss."""
    model.train()
    logprobs, _, mask = completion_logprobs(model, [b[0] for b in batch], [b[1] for b in batch], 1.0)
    loss = -(logprobs * mask).sum() / mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


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
    with RunProgress(sft.steps, enabled=cfg.logging.progress, stats=format_sft_stats) as progress:
        for step in range(1, sft.steps + 1):
            batch = [examples[rng.randrange(len(examples))] for _ in range(sft.batch_size)]
            started = time.perf_counter()
            loss = _train_batch(model, optimizer, batch)
            metrics: dict[str, float] = {
                "step": step, "sft/loss": loss, "perf/elapsed_seconds": time.perf_counter() - start,
            }  # fmt: skip
            if step % sft.eval_every == 0 or step == sft.steps:
                engine.load_weights(model.state_dict(), step)
                metrics.update(evaluate_policy(engine, rollouts, task.eval_prompts(), cfg))
                writer.event(f"sft step {step}: loss={loss:.4f} accuracy={metrics['eval/accuracy']:.3f}")
            writer.log(step, metrics)
            target = sft.stop_at_accuracy
            reached = target is not None and metrics.get("eval/accuracy", -1.0) >= target
            progress.update(step, {**metrics, "perf/step_seconds": time.perf_counter() - started}, last=reached)
            if reached:
                writer.event(f"held-out greedy accuracy {metrics['eval/accuracy']:.3f} reached {target}: stopping")
                break
    policy.save(run_dir.final_dir)
    writer.event(f"saved the fine-tuned policy to {run_dir.final_dir}")
    writer.close()
    return run_dir.final_dir
