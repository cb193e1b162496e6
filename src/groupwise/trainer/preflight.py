"""Checks of a config against the machine, made before any model is loaded: what ``groupwise config check`` finds
and what ``train``, ``eval`` and ``sft`` refuse in one message (exit 2) instead of failing minutes later.

The schema checks what a config says; this checks what it points at:

- the reward function imports and is callable, and ``reward.kwargs`` fit its signature (a misspelled key is named
  with the closest key the function takes); for the built-in verifiers, trial calls on the prompts' own answers find
  kwargs the verifier rejects and answers it cannot read (:mod:`groupwise.trainer.reward_checks`);
- a custom sampler's class imports and takes ``async.sampler.kwargs``;
- the task builds: JSONL files exist and every bad line is listed (up to 20 per file); the ``dataset`` task's files
  exist, can be read in their format, have the mapped columns, and every bad value is listed with its column and
  rows; a generated task has enough distinct items; a generation round never takes more prompts than the training
  set holds (the same prompt would be trained twice in one step);
- ``generation.backend`` can be built: a plug-in factory imports and takes one argument, the ``vllm`` package is
  installed for ``vllm`` and knows every name in ``generation.vllm.engine_args`` (checked only when it is set:
  that imports vLLM);
- ``model.path`` is a model directory (or GGUF file) that exists, resolved against the working directory; a
  path that does not exist is an error naming the directory it was resolved against, never a Hugging Face Hub
  download (a Hub id is accepted only when it is already in the local cache); its ``config.json`` is a JSON object,
  and custom code (``auto_map``) needs ``model.trust_remote_code: true``; ``model.device: cuda`` needs CUDA here
  (:mod:`groupwise.trainer.model_folder`);
- the run directory can be created where ``run.output_dir`` says; for ``train``, also whether it may be started
  (``--resume``), whether ``--resume-from`` is a complete checkpoint, and whether the checkpoint it continues from
  is within ``run.max_steps``.

Imports no torch (but to ask whether ``model.device: cuda`` exists, and vLLM for its engine argument names when
``generation.vllm.engine_args`` is set): ``config check`` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from groupwise.config import ConfigError, ConfigIssue
from groupwise.data.dataset_task import DatasetFilesError
from groupwise.data.jsonl_dataset import DatasetError, load_jsonl_prompts
from groupwise.data.registry import TASKS, Task, build_task, prompt_sources, task_config_key
from groupwise.data.rewards import RewardFn, RewardSpecError, check_reward_kwargs, load_reward_fn
from groupwise.harness.launch import HarnessSpec
from groupwise.plugins import PluginImportError
from groupwise.run.rundir import location_problems, start_problems
from groupwise.trainer.backend_checks import backend_checks
from groupwise.trainer.episode_checks import EnvironmentSpec, episode_environment
from groupwise.trainer.harness_checks import harness_spec
from groupwise.trainer.model_checks import missing_path_issue, model_issues
from groupwise.trainer.model_folder import device_issues
from groupwise.trainer.reward_checks import reward_trial_issues
from groupwise.trainer.split_checks import check_splits
from groupwise.types import Prompt

if TYPE_CHECKING:
    from groupwise.config import JsonlSection, RunConfig


@dataclass(frozen=True)
class Inputs:
    """What the checks built on the way and the run reuses: the task (its prompts) and the reward function, and the
    warnings to print with the config's own."""

    task: Task
    reward_fn: RewardFn
    warnings: list[ConfigIssue] = field(default_factory=list)
    """What the checks found worth saying without refusing (eval prompts that training also sees)."""
    environment: EnvironmentSpec | None = None
    """``episode.environment`` checked (``None``: single-turn)."""
    harness: HarnessSpec | None = None
    """``episode.harness`` or ``episode.harness_command`` checked (``None``: no harness)."""


def check_inputs(cfg: RunConfig, *, training: bool = True) -> Inputs:
    """Every input check above except the run-start ones; raises one :class:`ConfigError` listing them all.
    ``training`` adds what only an RL run needs: prompts per step against the training set's size, and a run
    directory that can be written (``eval`` writes none)."""
    inputs, issues = input_issues(cfg, training=training, location=training)
    if issues:
        raise ConfigError(issues)
    assert inputs is not None  # None only with an issue saying why
    return inputs


def check_train_start(cfg: RunConfig, *, resume: bool, resume_from: Path | None) -> Inputs:
    """:func:`check_inputs` plus whether this run may start (its directory, ``--resume``, ``--resume-from``)."""
    inputs, issues = input_issues(cfg, training=True, location=False)
    issues.extend(start_problems(cfg.run.output_dir, cfg.run.name, resume or resume_from is not None))
    if resume_from is not None:
        issues.extend(_checkpoint_issues(resume_from))
    if not issues:
        issues.extend(_resume_step_issues(cfg, resume, resume_from))
    if issues:
        raise ConfigError(issues)
    assert inputs is not None  # None only with an issue saying why
    return inputs


def partial_rollout_issues(cfg: RunConfig) -> list[ConfigIssue]:
    """Training with ``async.partial_rollouts: continue`` needs ``generation.continuous_batching: true``: weights
    are swapped inside a running decode loop, which only the generation stream has (``groupwise simulate`` models
    partial rollouts without it)."""
    if cfg.mode != "async" or cfg.async_.partial_rollouts == "off" or cfg.generation.continuous_batching:
        return []
    return [ConfigIssue(
        "async.partial_rollouts", cfg.async_.partial_rollouts,
        "partial rollouts swap weights inside a running decode loop, which only continuous batching has",
        "set generation.continuous_batching: true, or async.partial_rollouts: off",
    )]  # fmt: skip


def tracker_issues(cfg: RunConfig) -> list[ConfigIssue]:
    """Each backend of ``logging.backends`` can be imported here (checked without importing it)."""
    from groupwise.run.trackers import INSTALL, missing_modules

    issues = []
    for backend in cfg.logging.enabled_backends():
        missing = missing_modules(backend)
        if missing:
            issues.append(ConfigIssue(
                "logging.backends", cfg.logging.backends,
                f"the {backend} backend needs the package(s) {', '.join(missing)}, which are not installed",
                f"{INSTALL[backend]}, or remove {backend} from logging.backends",
            ))  # fmt: skip
    return issues


def input_issues(cfg: RunConfig, *, training: bool, location: bool) -> tuple[Inputs | None, list[ConfigIssue]]:
    """``(inputs, every problem found)``; ``inputs`` is None when the task or the reward could not be built."""
    issues = model_issues(cfg.model)
    issues.extend(device_issues(cfg))
    task, task_issues = _task(cfg)
    issues.extend(task_issues)
    warnings: list[ConfigIssue] = []
    if task is not None:
        split_issues, warnings = _split_issues(cfg, task)
        issues.extend(split_issues)
        task = None if split_issues else task  # its splits cannot be read: nothing else to check on them
    if training and task is not None:
        issues.extend(prompt_count_issues(cfg, len(task.train_prompts())))
    if training:
        issues.extend(partial_rollout_issues(cfg))
        issues.extend(tracker_issues(cfg))
    reward_fn, reward_issues = _reward(cfg, task)
    issues.extend(reward_issues)
    environment, environment_issues = episode_environment(cfg)  # with one, the environment scores, not reward_fn
    issues.extend(environment_issues)
    harness, harness_issues = harness_spec(cfg)
    issues.extend(harness_issues)
    if task is not None and reward_fn is not None and not reward_issues and cfg.episode.environment is None:
        issues.extend(reward_trial_issues(cfg, reward_fn, prompt_splits(cfg, task)))
    issues.extend(_sampler_issues(cfg))
    backend_issues, backend_warnings = backend_checks(cfg)
    issues.extend(backend_issues)
    warnings.extend(backend_warnings)
    if location:
        issues.extend(location_problems(cfg.run.output_dir, cfg.run.name))
    inputs = None if task is None or reward_fn is None else Inputs(task, reward_fn, warnings, environment, harness)
    return inputs, issues


# --- data and reward --------------------------------------------------------------------------------------------


def _task(cfg: RunConfig) -> tuple[Task | None, list[ConfigIssue]]:
    """The task built from ``cfg.data``, or None and why it cannot be."""
    key = task_config_key(cfg.data)
    value = cfg.data.kwargs if key == "data.kwargs" else getattr(cfg.data, cfg.data.task).model_dump()
    plugin = cfg.data.task not in TASKS
    try:
        task = build_task(cfg.data.task, cfg.data, cfg.run.seed)
    except DatasetFilesError as exc:  # the dataset task: every problem, each under its key
        return None, [ConfigIssue(p.key, p.value, p.rule, p.fix) for p in exc.problems]
    except DatasetError as exc:
        return None, _dataset_issues(cfg.data.jsonl, exc)
    except PluginImportError as exc:  # the plug-in task class itself
        return None, [ConfigIssue("data.task", cfg.data.task, str(exc), "name an importable 'package.module:Class'")]
    except Exception as exc:  # a generated task that cannot make what was asked (countdown's item space)
        if not plugin and not isinstance(exc, ValueError):
            raise  # a built-in task failing otherwise is a bug, not bad input
        what = f"{type(exc).__name__}: {exc}" if plugin else str(exc)
        return None, [ConfigIssue(key, value, what, f"change the {key} settings as the message says")]
    return task, []


def _split_issues(cfg: RunConfig, task: Task) -> tuple[list[ConfigIssue], list[ConfigIssue]]:
    """``(issues, warnings)`` of the task's splits (:mod:`groupwise.trainer.split_checks`), named by the key the
    prompts come from (``data.task`` for a plug-in task)."""
    report = check_splits(task.train_prompts, task.eval_prompts)
    train_key, eval_key = prompt_sources(cfg.data)["train"], prompt_sources(cfg.data)["eval"]
    issues = [ConfigIssue(train_key, _setting(cfg, train_key), problem, "make train_prompts() and eval_prompts() "
                          "return lists of groupwise.types.Prompt with unique uids (docs/datasets.md)")
              for problem in report.problems]  # fmt: skip
    warnings = [] if report.overlap is None else [ConfigIssue(
        eval_key, _setting(cfg, eval_key), report.overlap,
        "hold out prompts the training split does not hold (another eval file, or a task whose splits are disjoint)",
    )]  # fmt: skip
    return issues, warnings


def _setting(cfg: RunConfig, key: str) -> object:
    """The value of the config key ``key`` (``data.task``, ``data.jsonl.train_path``, ``data.addition``)."""
    value: object = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value.model_dump() if isinstance(value, BaseModel) else value


def prompt_splits(cfg: RunConfig, task: Task) -> dict[str, tuple[str, list[Prompt]]]:
    """``{split: (the config key its prompts come from, prompts)}`` for the train and held-out splits."""
    sources = prompt_sources(cfg.data)
    return {"train": (sources["train"], task.train_prompts()), "eval": (sources["eval"], task.eval_prompts())}


def _dataset_issues(jsonl: JsonlSection, error: DatasetError) -> list[ConfigIssue]:
    """One issue per JSONL file that cannot be read (the train file failed; the eval file is tried too)."""
    files = {"data.jsonl.train_path": jsonl.train_path, "data.jsonl.eval_path": jsonl.eval_path}
    errors: dict[str, DatasetError | None] = {key: None for key in files}
    failed = next((key for key, path in files.items() if path is not None and Path(path) == error.path),
                  "data.jsonl.train_path")
    errors[failed] = error
    for key, path in files.items():
        if errors[key] is None and path is not None:
            try:
                load_jsonl_prompts(path, "eval" if key.endswith("eval_path") else "train")
            except DatasetError as other:
                errors[key] = other
    issues: list[ConfigIssue] = []
    for key, err in errors.items():
        if err is None:
            continue
        given = files[key]
        if given is not None and not Path(given).exists():
            issues.append(missing_path_issue(key, given))
        else:
            fix = ("fix what is listed: a JSON-lines file, one object per line with 'prompt' (or 'messages') and "
                   "'answer' (docs/datasets.md)")
            issues.append(ConfigIssue(key, files[key], str(err), fix))
    return issues


def prompt_count_issues(cfg: RunConfig, num_train: int, more: str = "use more training prompts") -> list[ConfigIssue]:
    """A generation round takes at most as many prompts as the training set holds.

    One round of a step takes ``ceil(P × batch_multiplier)`` prompts in sync mode (P with dynamic sampling off) and
    a step P prompts in async mode; more than the ``num_train`` prompts there are would put the same prompt twice in
    one step (the loader starts the next epoch inside it). ``more`` says how to get more prompts (``groupwise
    simulate``: raise ``sim.num_prompts``).
    """
    per_round = cfg.prompts_per_generation_round if cfg.mode == "sync" else cfg.grpo.num_prompts_per_step
    if per_round <= num_train:
        return []
    p = cfg.grpo.num_prompts_per_step
    what = f"{per_round} prompts per generation round (P = {p}" + (
        f" × grpo.dynamic_sampling.batch_multiplier {cfg.grpo.dynamic_sampling.batch_multiplier})"
        if per_round != p else ")")
    return [ConfigIssue(
        "grpo.num_prompts_per_step", p,
        f"a step takes {what} but the training set holds only {num_train} prompts, so the same prompt would be "
        "trained twice in one step",
        f"lower grpo.num_prompts_per_step (and the batch multiplier) so a round takes at most {num_train} prompts, "
        f"or {more}",
    )]


def _reward(cfg: RunConfig, task: Task | None) -> tuple[RewardFn | None, list[ConfigIssue]]:
    spec = cfg.reward.function
    if spec == "auto" and task is None:
        return None, []  # the task's own verifier: nothing to check until the task builds
    try:
        reward_fn = load_reward_fn(spec, task.default_reward if task is not None else "exact_numeric")
    except RewardSpecError as exc:
        return None, [ConfigIssue("reward.function", spec, str(exc),
                                  "name an importable 'package.module:function' (run from the directory that holds "
                                  "the package, or put it on PYTHONPATH), or a built-in")]
    try:
        check_reward_kwargs(reward_fn, cfg.reward.kwargs)
    except RewardSpecError as exc:
        return reward_fn, [ConfigIssue("reward.kwargs", dict(cfg.reward.kwargs), str(exc),
                                       "use only the keyword arguments the reward function takes")]
    return reward_fn, []


def _sampler_issues(cfg: RunConfig) -> list[ConfigIssue]:
    sampler = cfg.async_.sampler
    if cfg.mode != "async" or sampler.name != "custom":
        return []
    from groupwise.controller.samplers.custom import import_sampler_class, sampler_kwargs_problem

    try:
        cls = import_sampler_class(sampler.target)
    except ValueError as exc:
        return [ConfigIssue("async.sampler.target", sampler.target, str(exc),
                            "name an importable 'package.module:ClassName'")]
    problem = sampler_kwargs_problem(cls, dict(sampler.kwargs))
    if problem is None:
        return []
    return [ConfigIssue("async.sampler.kwargs", dict(sampler.kwargs), problem,
                        f"use only the keyword arguments {cls.__name__} takes")]


# --- resuming ---------------------------------------------------------------------------------------------------


def _resume_step_issues(cfg: RunConfig, resume: bool, resume_from: Path | None) -> list[ConfigIssue]:
    """The checkpoint a resumed run continues from must not be past ``run.max_steps``: a run goes on from its
    checkpoint and cannot go back (it would train ``max_steps − step`` < 0 steps)."""
    from groupwise.run.checkpoint import checkpoint_step, latest_checkpoint

    if resume_from is not None:
        path: Path | None = resume_from
    elif resume and cfg.run.name is not None:
        path = latest_checkpoint(Path(cfg.run.output_dir) / cfg.run.name)
    else:
        return []
    step = None if path is None else checkpoint_step(path)
    if path is None or step is None or step <= cfg.run.max_steps:
        return []
    return [ConfigIssue(
        "run.max_steps", cfg.run.max_steps,
        f"the run would continue from {path} (step {step}), past run.max_steps = {cfg.run.max_steps}: a resumed run "
        "goes on from its checkpoint and cannot go back",
        f"set run.max_steps to {step} or more (run.max_steps={step} only finishes the run: final evaluation and "
        f"model), resume from an earlier checkpoint with --resume-from {path.parent}/step_<N> (N ≤ "
        f"{cfg.run.max_steps}) if one is kept, or start a new run under another run.name",
    )]  # fmt: skip


def _checkpoint_issues(path: Path) -> list[ConfigIssue]:
    from groupwise.run.checkpoint import CheckpointError, verify_checkpoint

    fix = "pass a run's checkpoints/step_<N> directory written by a complete save, or use --resume"
    if not path.is_dir():
        return [ConfigIssue("--resume-from", str(path), f"{path.absolute()} is not a directory", fix)]
    try:
        verify_checkpoint(path)
    except CheckpointError as exc:
        return [ConfigIssue("--resume-from", str(path), str(exc), fix)]
    return []
