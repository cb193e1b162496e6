"""Build a :class:`~groupwise.trainer.session.Session` from a validated config."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from groupwise.data.loader import PromptLoader
from groupwise.data.registry import build_task
from groupwise.data.rewards import load_reward_fn
from groupwise.generation.engine import Engine
from groupwise.model.encode import check_chat_prompts
from groupwise.model.loading import eos_token_ids, load_policy, resolve_device
from groupwise.model.lora import apply_lora, lora_config
from groupwise.run.metrics import MetricsWriter
from groupwise.run.rundir import RunDir
from groupwise.trainer.learner import Learner, LearnerSettings
from groupwise.trainer.precision import LearnerPrecision, learner_precision
from groupwise.trainer.rollout import RewardPipeline, RolloutWorker
from groupwise.trainer.session import Session
from groupwise.types import SamplingParams


def sampling_from_config(cfg: Any) -> SamplingParams:
    gen = cfg.generation
    return SamplingParams(
        max_new_tokens=gen.max_new_tokens,
        temperature=gen.temperature,
        top_p=gen.top_p,
        top_k=gen.top_k,
        stop=tuple(gen.stop),
    )


def load_policy_from_config(cfg: Any) -> Any:
    m = cfg.model
    tiny = m.tiny.model_dump() if m.source == "tiny" else None
    return load_policy(m.source, m.path, m.gguf_file, tiny, device=m.device, dtype=m.dtype, seed=cfg.run.seed)


def precision_from_config(cfg: Any) -> LearnerPrecision:
    """How the learner holds and computes its weights on ``model.device`` (groupwise.trainer.precision)."""
    return learner_precision(resolve_device(cfg.model.device), cfg.model.dtype)


def generator_needs_own_model(cfg: Any) -> bool:
    """Whether the engine samples from a copy instead of the learner's own model.

    Async mode generates while training; LoRA trains a peft wrapper whose merged weights go into a plain copy
    (so the engine's fast decode step keeps working); CUDA mixed precision samples in bfloat16, not from the
    float32 masters.
    """
    return cfg.mode == "async" or cfg.model.lora.enabled or precision_from_config(cfg).generator_needs_own_copy


def build_learner(cfg: Any, model: torch.nn.Module) -> Learner:
    """The learner around ``model``: master dtype, reference copy, gradient checkpointing, LoRA, settings.

    ``learner.model`` is what trains (a peft wrapper of ``model`` with LoRA); put it back into the policy.
    """
    precision = precision_from_config(cfg)
    model.to(dtype=precision.master_dtype)
    reference = frozen_copy(model) if cfg.model.reference == "initial" else None
    if cfg.model.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    lora = cfg.model.lora
    if lora.enabled:
        model = apply_lora(model, lora_config(lora.rank, lora.alpha, lora.dropout, lora.target_modules))
    return Learner(model, LearnerSettings.from_config(cfg), reference=reference, precision=precision)


def enable_gradient_checkpointing(model: Any) -> None:
    """transformers' own switch, non-reentrant (the reentrant form needs inputs that require grad and breaks with
    adapters); ``activation_checkpointing_enable`` is its name from transformers 5.24 on."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def generator_copy(model: torch.nn.Module) -> torch.nn.Module:
    """The engine's own copy of the policy, in eval mode. Its parameters keep ``requires_grad`` as the policy's
    (the engine never runs a backward pass): a CPU prefill over frozen weights takes another matmul kernel, so a
    frozen copy would sample with last-bit differences from the learner's own model and from a Ray worker's."""
    clone = copy.deepcopy(model)
    clone.eval()
    return clone


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    clone = copy.deepcopy(model)
    clone.eval()
    for p in clone.parameters():
        p.requires_grad_(False)
    return clone


@dataclass
class Components:
    """What generation and scoring need, without a run directory (``train``, ``eval`` and ``sft`` share it)."""

    policy: Any
    engine: Engine
    task: Any
    reward_fn: Any
    rollouts: RolloutWorker


def build_components(cfg: Any, *, separate_engine_model: bool = False, group_size: int | None = None) -> Components:
    """Load the policy and build the engine, task, reward function and rollout worker."""
    policy = load_policy_from_config(cfg)
    # Sync mode alternates generation and training, so the engine can sample from the learner's own model.
    # Async mode generates while training: the engine needs its own copy, refreshed at weight sync.
    engine_model = generator_copy(policy.model) if separate_engine_model else policy.model
    engine = Engine(
        engine_model,
        policy.tokenizer,
        eos_token_ids(policy.tokenizer, policy.model),
        fast_decode=cfg.generation.fast_decode,
    )
    task = build_task(cfg.data.task, cfg.data, cfg.run.seed)
    check_chat_prompts(policy.tokenizer, [*task.train_prompts(), *task.eval_prompts()], f"data.task {cfg.data.task}")
    reward_fn = load_reward_fn(cfg.reward.function, task.default_reward)
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


def build_session(cfg: Any, *, resume: bool = False, resume_from: Path | None = None) -> Session:
    """Wire policy, engine, learner, data and run directory; restore a checkpoint when resuming."""
    torch.manual_seed(cfg.run.seed)
    resuming = resume or resume_from is not None
    # Load everything that can fail on bad input before the run directory exists, so a failed start
    # leaves nothing behind that blocks the next attempt.
    parts = build_components(cfg, separate_engine_model=generator_needs_own_model(cfg))
    learner = build_learner(cfg, parts.policy.model)
    parts.policy.model = learner.model
    run_dir = RunDir.create(cfg.run.output_dir, cfg.run.name, cfg.to_yaml(), resume=resuming)
    writer = MetricsWriter(run_dir, tensorboard=cfg.logging.tensorboard)
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
    writer.event(f"learner logprobs: {learner.logprob_path}")
    return session
