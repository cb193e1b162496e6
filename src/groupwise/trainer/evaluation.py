"""Held-out evaluation: greedy accuracy and pass@k.

A completion (an episode, with ``episode.environment``) is *correct* when its raw reward is at least 1.0 (the
verifiers' full-credit value). Greedy
accuracy = correct greedy completions / prompts. pass@k = prompts with at least one correct completion among k
samples at the training temperature (reported only when ``eval.pass_k > 1``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from groupwise.data.scoring import CORRECT_REWARD
from groupwise.seeding import derive_seed
from groupwise.types import Prompt, SamplingParams

if TYPE_CHECKING:
    from groupwise.config import RunConfig
    from groupwise.generation.base import Generator
    from groupwise.trainer.parts import GroupRollouts



def evaluated_prompts(prompts: Sequence[Prompt], cfg: RunConfig) -> list[Prompt]:
    """The held-out prompts an evaluation scores: the first ``eval.num_prompts`` of them (all when null)."""
    return list(prompts) if cfg.eval.num_prompts is None else list(prompts)[: cfg.eval.num_prompts]


def evaluate_policy(
    engine: Generator, rollouts: GroupRollouts, prompts: Sequence[Prompt], cfg: RunConfig
) -> dict[str, float]:
    """Greedy accuracy (``eval/accuracy``) and, when ``eval.pass_k > 1``, ``eval/pass_at_k``."""
    prompts = evaluated_prompts(prompts, cfg)
    if not prompts:
        return {}
    greedy = replace(rollouts.sampling, temperature=0.0, top_p=1.0, top_k=0)
    metrics = {"eval/accuracy": _fraction_correct(engine, rollouts, prompts, greedy, 1, cfg)}
    if cfg.eval.pass_k > 1:
        metrics["eval/pass_at_k"] = _fraction_correct(
            engine, rollouts, prompts, rollouts.sampling, cfg.eval.pass_k, cfg
        )
    return metrics


def _fraction_correct(
    engine: Generator,
    rollouts: GroupRollouts,
    prompts: Sequence[Prompt],
    sampling: SamplingParams,
    k: int,
    cfg: RunConfig,
) -> float:
    batch = max(1, cfg.generation.micro_batch_groups)
    solved = 0
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        seeds = [derive_seed("eval", cfg.run.seed, p.uid) for p in chunk]
        for rewards in rollouts.sample_rewards(engine, chunk, sampling, k, seeds):
            solved += any(r >= CORRECT_REWARD for r in rewards)
    return solved / len(prompts)
