"""Held-out evaluation: greedy accuracy, pass@k and, for episodes, the turns a solved one took.

A completion (an episode, with ``episode.environment``) is *correct* when its raw reward is at least 1.0 (the
verifiers' full-credit value). Greedy accuracy = correct greedy completions / prompts. pass@k = prompts with at
least one correct completion among k samples at the training temperature (reported only when ``eval.pass_k > 1``).
With episodes, ``eval/solved_turns_mean`` = mean model turns of the correct greedy episodes: on the same held-out
prompts at every evaluation, it falls as a policy learns to use the environment's answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from groupwise.data.scoring import CORRECT_REWARD
from groupwise.seeding import derive_seed
from groupwise.types import Prompt, SampleOutcome, SamplingParams

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
    """Greedy accuracy (``eval/accuracy``), with episodes ``eval/solved_turns_mean`` (when one was solved), and
    when ``eval.pass_k > 1``, ``eval/pass_at_k``."""
    prompts = evaluated_prompts(prompts, cfg)
    if not prompts:
        return {}
    greedy = replace(rollouts.sampling, temperature=0.0, top_p=1.0, top_k=0)
    outcomes = _sampled_outcomes(engine, rollouts, prompts, greedy, 1, cfg)
    metrics = {"eval/accuracy": _fraction_correct(outcomes)}
    solved_turns = [o.turns for group in outcomes for o in group if o.reward >= CORRECT_REWARD]
    if cfg.episode.environment is not None and solved_turns:
        metrics["eval/solved_turns_mean"] = sum(solved_turns) / len(solved_turns)
    if cfg.eval.pass_k > 1:
        sampled = _sampled_outcomes(engine, rollouts, prompts, rollouts.sampling, cfg.eval.pass_k, cfg)
        metrics["eval/pass_at_k"] = _fraction_correct(sampled)
    return metrics


def _fraction_correct(outcomes: Sequence[Sequence[SampleOutcome]]) -> float:
    """Prompts with at least one correct sample ÷ prompts."""
    return sum(any(o.reward >= CORRECT_REWARD for o in group) for group in outcomes) / len(outcomes)


def _sampled_outcomes(
    engine: Generator,
    rollouts: GroupRollouts,
    prompts: Sequence[Prompt],
    sampling: SamplingParams,
    k: int,
    cfg: RunConfig,
) -> list[list[SampleOutcome]]:
    """``k`` samples per prompt, ``generation.micro_batch_groups`` prompts per call, seeded by prompt uid."""
    batch = max(1, cfg.generation.micro_batch_groups)
    outcomes: list[list[SampleOutcome]] = []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        seeds = [derive_seed("eval", cfg.run.seed, p.uid) for p in chunk]
        outcomes += rollouts.sample_outcomes(engine, chunk, sampling, k, seeds)
    return outcomes
