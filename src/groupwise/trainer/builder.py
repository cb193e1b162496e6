"""Build a :class:`~groupwise.trainer.session.Session` from a validated config."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from groupwise.config import ConfigError, ConfigIssue
from groupwise.config.issues import warning_line
from groupwise.data.registry import Task
from groupwise.data.reward_timeout import with_timeout
from groupwise.data.rewards import RewardFn
from groupwise.data.skipping_loader import build_training_loader
from groupwise.generation.base import Generator, StreamSupport
from groupwise.generation.factory import (
    BackendPluginError,
    GeneratorSpec,
    UnservedArchitecture,
    build_generator,
    stream_support,
)
from groupwise.harness.runner import HarnessRunner
from groupwise.model.gguf_files import cache_root
from groupwise.model.loading import Policy, eos_token_ids, load_policy, pretrained, resolve_device
from groupwise.model.lora import LoraSetupError, apply_lora, lora_config, untargeted_parameters
from groupwise.run.metrics import MetricsWriter
from groupwise.run.phases import PhaseLog
from groupwise.run.rundir import RunDir
from groupwise.run.trackers import config_trackers
from groupwise.trainer.episode_checks import episode_settings
from groupwise.trainer.harness_checks import harness_settings
from groupwise.trainer.learner import Learner, LearnerSettings
from groupwise.trainer.precision import LearnerPrecision, learner_precision
from groupwise.trainer.preflight import Inputs, check_inputs, check_train_start, prompt_splits
from groupwise.trainer.prompt_checks import PromptReport, check_prompts
from groupwise.trainer.rollout import RewardPipeline, RolloutWorker
from groupwise.trainer.session import Session
from groupwise.types import SamplingParams

logger = logging.getLogger(__name__)

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


def load_policy_from_config(cfg: RunConfig, note: Callable[[str], None] | None = None) -> Policy:
    """The configured policy; a GGUF model goes through the dequantised-copy cache (``model.gguf_cache``), and
    ``note`` hears whether it was read from there or made."""
    m = cfg.model
    tiny = m.tiny.model_dump() if m.source == "tiny" else None
    cache = cache_root(m.gguf_cache) if m.source == "gguf" else None
    return load_policy(m.source, m.path, m.gguf_file, tiny, device=m.device, dtype=m.dtype, seed=cfg.run.seed,
                       trust_remote_code=m.trust_remote_code, gguf_cache=cache, note=note)  # fmt: skip


def precision_from_config(cfg: RunConfig) -> LearnerPrecision:
    """How the learner holds and computes its weights on ``model.device`` (groupwise.trainer.precision)."""
    return learner_precision(resolve_device(cfg.model.device), cfg.model.dtype)


def generator_needs_own_model(cfg: RunConfig) -> bool:
    """Whether the engine samples from a copy instead of the learner's own model.

    Async mode generates while training; LoRA trains a peft wrapper whose merged weights go into a plain copy
    (so the engine's fast decode step keeps working); CUDA mixed precision samples in bfloat16, not from the
    float32 masters.
    """
    return cfg.mode == "async" or cfg.model.lora.enabled or precision_from_config(cfg).generator_needs_own_copy


@dataclass
class LearnerParts:
    """What a learner is made of: the model that trains (a peft wrapper with LoRA), its settings, the frozen
    reference copy (``model.reference: initial``) and the precision plan."""

    model: torch.nn.Module
    settings: LearnerSettings
    reference: torch.nn.Module | None
    precision: LearnerPrecision


def learner_parts(cfg: RunConfig, model: torch.nn.Module) -> LearnerParts:
    """``model`` prepared for training: master dtype, reference copy, gradient checkpointing, LoRA; and the
    settings. A bad LoRA target list is a :class:`ConfigError`."""
    precision = precision_from_config(cfg)
    model.to(dtype=precision.master_dtype)
    reference = frozen_copy(model) if cfg.model.reference == "initial" else None
    if cfg.model.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    lora = cfg.model.lora
    if lora.enabled:
        try:
            model = apply_lora(model, lora_config(lora.rank, lora.alpha, lora.dropout, lora.target_modules))
        except LoraSetupError as err:  # the targets do not fit this model: bad input, reported like any other
            raise ConfigError([ConfigIssue(
                "model.lora.target_modules", list(lora.target_modules), str(err),
                "list names of the model's Linear projections (print the model to see them)",
            )]) from err
    return LearnerParts(model, LearnerSettings.from_config(cfg), reference, precision)


def build_learner(cfg: RunConfig, model: torch.nn.Module) -> Learner:
    """The learner around ``model`` (:func:`learner_parts`). ``learner.model`` is what trains (a peft wrapper of
    ``model`` with LoRA); put it back into the policy."""
    parts = learner_parts(cfg, model)
    return Learner(parts.model, parts.settings, reference=parts.reference, precision=parts.precision)


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """transformers' own switch, non-reentrant (the reentrant form needs inputs that require grad and breaks with
    adapters); ``activation_checkpointing_enable`` is its name from transformers 5.24 on (5.17 has only the old
    one: a version check, not a capability of ours)."""
    hf = pretrained(model)
    if hasattr(hf, "activation_checkpointing_enable"):
        hf.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def generator_copy(model: torch.nn.Module, shared: Sequence[torch.nn.Parameter] = ()) -> torch.nn.Module:
    """The engine's own copy of the policy, in eval mode. Its parameters keep ``requires_grad`` as the policy's
    (the engine never runs a backward pass): a CPU prefill over frozen weights takes another matmul kernel, so a
    frozen copy would sample with last-bit differences from the learner's own model and from a Ray worker's.
    ``shared`` parameters are not copied: the copy holds those very tensors (weights that never change)."""
    clone = copy.deepcopy(model, memo={id(parameter): parameter for parameter in shared})
    clone.eval()
    return clone


def weights_shared_with_engine(cfg: RunConfig, model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """What the engine's copy may share with the policy instead of copying: with LoRA (and the engine sampling in
    the policy's own dtype), every weight outside the modules LoRA targets — the embedding, tied head and norms,
    which neither training nor a merge ever changes (Qwen2.5-0.5B's embedding alone is 0.5 GiB in float32)."""
    lora = cfg.model.lora
    if not lora.enabled or precision_from_config(cfg).generator_needs_own_copy:
        return []
    return untargeted_parameters(model, lora_config(lora.rank, lora.alpha, lora.dropout, lora.target_modules))


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    clone = copy.deepcopy(model)
    clone.eval()
    for p in clone.parameters():
        p.requires_grad_(False)
    return clone


@dataclass
class Components:
    """What generation and scoring need, without a run directory (``train``, ``eval`` and ``sft`` share it).
    ``streaming`` says whether the generator can run a request stream for this model (asked once, here); ``notes``
    are what the prompt checks counted without refusing (the run writes them to ``events.log``)."""

    policy: Policy
    engine: Generator
    streaming: StreamSupport
    task: Task
    reward_fn: RewardFn
    rollouts: RolloutWorker
    notes: list[str] = field(default_factory=list)


def build_components(
    cfg: RunConfig, *, separate_engine_model: bool = False, group_size: int | None = None,
    inputs: Inputs | None = None, phases: PhaseLog | None = None,
) -> Components:
    """Check the inputs (unless ``inputs`` says they were), load the policy, build the engine, task, reward function
    and rollout worker, and check every prompt against the tokenizer and the model's positions.

    Raises :class:`ConfigError` for anything wrong with the inputs, the model included, before returning.
    ``phases`` prints the loading lines (stderr by default).
    """
    checked_here = inputs is None  # else the caller printed what the checks warned about
    inputs = inputs or check_inputs(cfg, training=False)
    policy = _load_policy_reported(cfg, phases or PhaseLog())
    # Sync mode alternates generation and training, so the engine can sample from the learner's own model.
    # Async mode generates while training: the engine needs its own copy, refreshed at weight sync (also LoRA and
    # CUDA mixed precision: generator_needs_own_model).
    if separate_engine_model:
        engine_model = generator_copy(policy.model, weights_shared_with_engine(cfg, policy.model))
    else:
        engine_model = policy.model
    engine = _build_engine(GeneratorSpec(
        cfg.generation, cfg.model, engine_model, policy.tokenizer, eos_token_ids(policy.tokenizer, policy.model),
        planned_decode_steps=cfg.run.max_steps * cfg.generation.max_new_tokens,
    ))  # fmt: skip
    reward_fn = with_timeout(inputs.reward_fn, cfg.reward.timeout_s)  # bounded per call when configured
    positions = getattr(pretrained(policy.model).config, "max_position_embeddings", None)  # a config may lack it
    episodes, harness = None, None
    if inputs.environment is not None:
        episodes = episode_settings(cfg, inputs.environment, policy.tokenizer, positions)
    if inputs.harness is not None:
        harness = HarnessRunner(harness_settings(cfg, inputs.harness, policy.tokenizer, positions))
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
        episodes=episodes,
        harness=harness,
    )
    report = _check_prompts(cfg, inputs.task, policy, rollouts, positions)
    if report.issues:
        raise ConfigError(report.issues)
    notes = list(report.notes) + ([warning_line(w) for w in inputs.warnings] if checked_here else [])
    streaming = _stream_support(cfg, engine, multi_turn=cfg.episode.enabled, notes=notes)
    for note in notes:
        logger.warning(note)
    return Components(policy=policy, engine=engine, streaming=streaming, task=inputs.task, reward_fn=reward_fn,
                      rollouts=rollouts, notes=notes)


def _stream_support(cfg: RunConfig, engine: Generator, *, multi_turn: bool, notes: list[str]) -> StreamSupport:
    """Whether generation runs on the stream (continuous batching): asked for, and the engine (and, for episodes,
    the backend and runtime) can. A stream asked for and unavailable is a note, or an error where partial rollouts
    need it (they would silently do nothing)."""
    off = StreamSupport(False, "generation.continuous_batching is off")
    streaming = stream_support(engine) if cfg.generation.continuous_batching else off
    if multi_turn and streaming.available and not _streams_episodes(cfg):
        streaming = StreamSupport(False, "multi-turn episodes on this backend and runtime run in rounds of turns")
    if cfg.generation.continuous_batching and not streaming.available:
        why = streaming.reason
        if cfg.mode == "async" and cfg.async_.partial_rollouts == "continue":
            raise ConfigError([ConfigIssue(
                "async.partial_rollouts", "continue", f"partial rollouts need the generation stream, but {why}",
                "set async.partial_rollouts: off for this model (a Llama or Qwen2 architecture has the fast step)",
            )])  # fmt: skip
        notes.append(f"generation.continuous_batching is on, but {why}: generation runs one batch per engine call")
    return streaming


def _streams_episodes(cfg: RunConfig) -> bool:
    """Whether episodes run each turn as its own request on the generation stream: the built-in engine on the
    embedded runtime (elsewhere an episode's turns go in rounds, :mod:`groupwise.episodes.lockstep`)."""
    return cfg.generation.backend == "builtin" and cfg.runtime.backend == "embedded"


def _build_engine(spec: GeneratorSpec) -> Generator:
    """The generator, or a :class:`ConfigError` naming ``generation.backend`` when a plug-in factory raised or
    returned something else than a generator (it needs the loaded model, so this is the first moment it can be
    known)."""
    try:
        return build_generator(spec)
    except BackendPluginError as exc:
        raise ConfigError([ConfigIssue(
            "generation.backend", spec.generation.backend, str(exc),
            "fix the factory so it returns a Generator for this GeneratorSpec, or set generation.backend: builtin",
        )]) from exc
    except UnservedArchitecture as exc:
        raise ConfigError([ConfigIssue(
            "model.path", spec.model_section.path, f"{exc}, so generation.backend: {spec.generation.backend} "
            "cannot run it", "set generation.backend: builtin, or choose a model of an architecture vLLM serves",
        )]) from exc


def _load_policy_reported(cfg: RunConfig, phases: PhaseLog) -> Policy:
    """The policy, or a :class:`ConfigError` naming the model keys when it cannot be loaded (a broken directory,
    weights that do not match the config, a missing tokenizer): a bad model is bad input, reported like any other.
    Loading is a phase: a line when it starts and when it ends (:mod:`groupwise.run.phases`)."""
    try:
        with phases.phase(f"loading the model ({describe_model(cfg)})"):
            return load_policy_from_config(cfg, note=phases.note)
    except Exception as exc:
        key, value = ("model.path", cfg.model.path) if cfg.model.source != "tiny" else ("model.tiny",
                                                                                         cfg.model.tiny.model_dump())
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError([ConfigIssue(
            key, value, f"the model could not be loaded: {type(exc).__name__}: {first_line}",
            "check that model.path holds a complete model (config.json, weights, tokenizer files) for model.source "
            f"'{cfg.model.source}'",
        )]) from exc


def describe_model(cfg: RunConfig) -> str:
    """``gguf smollm2``, ``hf models/x``, ``tiny 4 layers × 128``: the model a config names, in a few words."""
    m = cfg.model
    if m.source == "tiny":
        return f"tiny {m.tiny.num_layers} layers × {m.tiny.hidden_size}"
    name = f"{m.path}/{m.gguf_file}" if m.gguf_file else str(m.path)
    return f"{m.source} {name}"


def _check_prompts(
    cfg: RunConfig, task: Task, policy: Policy, rollouts: RolloutWorker, positions: int | None
) -> PromptReport:
    splits = prompt_splits(cfg, task)
    episodes = rollouts.episodes
    if rollouts.harness is not None:  # a harness sends its own messages: the prompt's, rendered, is what it opens with
        return check_prompts(rollouts.encode, policy.tokenizer, positions, rollouts.harness.settings.limits.max_tokens,
                             splits, renders_chats=True, budget_key="episode.max_tokens")  # fmt: skip
    if episodes is None:
        return check_prompts(rollouts.encode, policy.tokenizer, positions, cfg.generation.max_new_tokens, splits)
    # An episode opens with the prompt as its user turn (the environment may add to it) and may run its whole budget.
    return check_prompts(episodes.renderer.prompt_opening, policy.tokenizer, positions, episodes.limits.max_tokens,
                         splits, renders_chats=True, budget_key="episode.max_tokens")  # fmt: skip


def build_session(
    cfg: RunConfig, *, resume: bool = False, resume_from: Path | None = None, inputs: Inputs | None = None
) -> Session:
    """Wire policy, engine, learner, data and run directory; restore a checkpoint when resuming.

    Every check that can refuse the run (inputs, run directory, ``--resume-from``) runs before the model loads,
    and the run directory is made only once everything loaded, so a failed start leaves nothing behind.
    """
    if cfg.learner.num_ranks > 1:
        raise ValueError(
            f"build_session builds a one-learner session; learner.num_ranks={cfg.learner.num_ranks} needs the ranked "
            "session: use groupwise.runtime.sessions.build_run_session"
        )
    inputs = inputs or check_train_start(cfg, resume=resume, resume_from=resume_from)
    torch.manual_seed(cfg.run.seed)
    parts = build_components(cfg, separate_engine_model=generator_needs_own_model(cfg), inputs=inputs)
    learner = build_learner(cfg, parts.policy.model)
    parts.policy.model = learner.model
    run_dir = RunDir.create(cfg.run.output_dir, cfg.run.name, cfg.to_yaml(), resume=resume or resume_from is not None)
    writer = MetricsWriter(run_dir, trackers=config_trackers(cfg, run_dir.root))
    loader = build_training_loader(cfg, parts.task.train_prompts())
    session = Session(
        cfg=cfg,
        run_dir=run_dir,
        policy=parts.policy,
        engine=parts.engine,
        streaming=parts.streaming,
        learner=learner,
        rollouts=parts.rollouts,
        loader=loader,
        task=parts.task,
        reward_fn=parts.reward_fn,
        events=writer,
    )
    try:
        session.begin(resume_from, notes=parts.notes)
    except BaseException:
        run_dir.discard_if_new()
        raise
    writer.event(f"learner logprobs: {learner.logprob_path}")
    return session
