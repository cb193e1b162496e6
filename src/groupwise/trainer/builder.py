"""Build a :class:`~groupwise.trainer.session.Session` from a validated config."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from groupwise.config import ConfigError, ConfigIssue
from groupwise.data.loader import PromptLoader
from groupwise.data.registry import Task, build_task
from groupwise.data.reward_timeout import with_timeout
from groupwise.data.rewards import RewardFn, load_reward_fn
from groupwise.generation.engine import Engine
from groupwise.model.loading import Policy, eos_token_ids, load_policy, resolve_device
from groupwise.run.metrics import MetricsWriter
from groupwise.run.rundir import RunDir
from groupwise.trainer.learner import Learner, LearnerSettings
from groupwise.trainer.rollout import RewardPipeline, RolloutWorker
from groupwise.trainer.session import Session
from groupwise.types import SamplingParams

if TYPE_CHECKING:
    from groupwise.config import RunConfig


def sampling_from_config(cfg: RunConfig) -> SamplingParams:
    gen = cfg.generation
    return SamplingParams(
        max_new_tokens=gen.max_new_tokens,
        temperature=gen.temperature,
        top_p=gen.top_p,
        top_k=gen.top_k,
        stop=tuple(gen.stop),
    )


def load_policy_from_config(cfg: RunConfig) -> Policy:
    m = cfg.model
    tiny = m.tiny.model_dump() if m.source == "tiny" else None
    return load_policy(m.source, m.path, m.gguf_file, tiny, device=m.device, dtype=m.dtype, seed=cfg.run.seed)


def _check_cuda_graphs_device(cfg: RunConfig) -> None:
    """``generation.cuda_graphs: on`` with ``model.device: auto`` on a machine without CUDA: a config error, before
    any model is loaded (with ``model.device: cpu`` the config rules already refuse it)."""
    if cfg.generation.cuda_graphs == "on" and resolve_device(cfg.model.device).type != "cuda":
        raise ConfigError([ConfigIssue(
            "generation.cuda_graphs", "on",
            f"CUDA graphs need a CUDA device; model.device '{cfg.model.device}' is cpu on this machine",
            "run on a machine with a CUDA GPU, or set generation.cuda_graphs: auto",
        )])  # fmt: skip


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    clone = copy.deepcopy(model)
    clone.eval()
    for p in clone.parameters():
        p.requires_grad_(False)
    return clone


@dataclass
class Components:
    """What generation and scoring need, without a run directory (``train``, ``eval`` and ``sft`` share it)."""

    policy: Policy
    engine: Engine
    task: Task
    reward_fn: RewardFn
    rollouts: RolloutWorker


def build_components(
    cfg: RunConfig, *, separate_engine_model: bool = False, group_size: int | None = None
) -> Components:
    """Load the policy and build the engine, task, reward function and rollout worker."""
    _check_cuda_graphs_device(cfg)
    policy = load_policy_from_config(cfg)
    # Sync mode alternates generation and training, so the engine can sample from the learner's own model.
    # Async mode generates while training: the engine needs its own copy, refreshed at weight sync.
    engine_model = frozen_copy(policy.model) if separate_engine_model else policy.model
    engine = Engine(
        engine_model,
        policy.tokenizer,
        eos_token_ids(policy.tokenizer, policy.model),
        fast_decode=cfg.generation.fast_decode,
        cuda_graphs=cfg.generation.cuda_graphs,
    )
    task = build_task(cfg.data.task, cfg.data, cfg.run.seed)
    reward_fn = with_timeout(load_reward_fn(cfg.reward.function, task.default_reward), cfg.reward.timeout_s)
    rollouts = RolloutWorker(
        generator=engine,
        tokenizer=policy.tokenizer,
        reward_fn=reward_fn,
        sampling=sampling_from_config(cfg),
        group_size=group_size or cfg.grpo.num_generations_per_prompt,
        run_seed=cfg.run.seed,
        rewards=RewardPipeline.from_config(cfg.grpo),
        reward_kwargs=dict(cfg.reward.kwargs),
        system_prompt=cfg.data.system_prompt,
        max_groups_per_call=cfg.generation.micro_batch_groups,
    )
    return Components(policy=policy, engine=engine, task=task, reward_fn=reward_fn, rollouts=rollouts)


def build_session(cfg: RunConfig, *, resume: bool = False, resume_from: Path | None = None) -> Session:
    """Wire policy, engine, learner, data and run directory; restore a checkpoint when resuming."""
    torch.manual_seed(cfg.run.seed)
    resuming = resume or resume_from is not None
    # Load everything that can fail on bad input before the run directory exists, so a failed start
    # leaves nothing behind that blocks the next attempt.
    parts = build_components(cfg, separate_engine_model=cfg.mode == "async")
    run_dir = RunDir.create(cfg.run.output_dir, cfg.run.name, cfg.to_yaml(), resume=resuming)
    writer = MetricsWriter(run_dir, tensorboard=cfg.logging.tensorboard)
    reference = frozen_copy(parts.policy.model) if cfg.model.reference == "initial" else None
    learner = Learner(parts.policy.model, LearnerSettings.from_config(cfg), reference=reference)
    loader = PromptLoader(
        parts.task.train_prompts(), seed=cfg.run.seed, shuffle=cfg.data.shuffle, max_epochs=cfg.run.max_epochs
    )
    session = Session(
        cfg=cfg,
        run_dir=run_dir,
        policy=parts.policy,
        engine=parts.engine,
        learner=learner,
        rollouts=parts.rollouts,
        loader=loader,
        task=parts.task,
        reward_fn=parts.reward_fn,
        events=writer,
    )
    if resuming:
        session.restore(resume_from)
    else:
        writer.event(f"run started: {run_dir.path}")
    return session
