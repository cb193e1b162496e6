"""The run-level config sections: run, data, reward, eval, logging, checkpoint (model and generation: their own
modules).

Only single-field ranges live here; rules that relate two fields are in :mod:`groupwise.config.rules`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from groupwise.config.base import Section, TaskSection, check_path_text, invalid, is_encodable
from groupwise.config.dataset_schema import DatasetSection
from groupwise.config.skip_schema import SkipNoSignalSection
from groupwise.plugins import is_plugin_target

BUILTIN_REWARD_FUNCTIONS = ("auto", "exact_numeric", "final_number", "countdown", "math_verify")
#: Every built-in verifier (and ``auto``: each built-in task's default is one of them) scores in [0, 1].
BUILTIN_REWARD_RANGE = (0.0, 1.0)


MAX_SEED = 2**63 - 1
MAX_REWARD_TIMEOUT_S = 86_400.0  # one day; threading's waits overflow near 9.2e9 s
MAX_NAME_BYTES = 255


def builtin_reward_range_width(function: str, task: str) -> float | None:
    """``max − min`` of the rewards ``reward.function`` can give when it is a built-in (1), else None (unknown:
    a ``module:function``, or ``auto`` for a task whose verifier is not a built-in)."""
    low, high = BUILTIN_REWARD_RANGE
    # A built-in task's ``auto`` reward is a built-in verifier.
    builtin = function in BUILTIN_REWARD_FUNCTIONS and (function != "auto" or task in builtin_task_names())
    return high - low if builtin else None


def run_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a run directory name (one path component), or None when it can."""
    if not name.strip() or name in (".", ".."):
        return "run.name must be a non-empty directory name other than '.' and '..'"
    if "/" in name or "\\" in name:
        return "run.name must be a single directory name (no '/' or '\\')"
    if name.strip() != name:
        return "run.name must not start or end with spaces"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        return "run.name must not hold control characters (a NUL byte, a newline, a tab)"
    if not is_encodable(name):
        return "run.name must be valid Unicode text (it holds a lone surrogate escape)"
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        return f"run.name must be at most {MAX_NAME_BYTES} bytes in UTF-8 (the file-system limit for one name)"
    return None


class RunSection(Section):
    """Where the run writes and how long it lasts."""

    name: str | None = None
    """Run directory name under ``output_dir``; ``null`` = a timestamp (``YYYYmmdd-HHMMSS``). One directory name:
    no path separators, control characters or surrounding spaces, at most 255 bytes."""
    output_dir: str = "runs"
    """Directory that holds run directories (relative paths are relative to the current working directory)."""
    seed: int = Field(0, ge=0, le=MAX_SEED)
    """Run seed (integer, 0 ≤ seed ≤ 2^63 − 1: what every seeded generator accepts); every random source is
    derived from it."""
    max_steps: int = Field(100, ge=1)
    """RL steps to train (≥ 1); each takes one optimizer update, or K × E with PPO mini-batches
    (``optimizer.mini_batches_per_step``, ``optimizer.epochs_per_step``)."""
    max_epochs: int | None = Field(None, ge=1)
    """Passes over the training prompts (≥ 1); ``null`` = unbounded (``max_steps`` ends the run)."""

    @field_validator("name")
    @classmethod
    def _name_is_one_directory(cls, name: str | None) -> str | None:
        problem = None if name is None else run_name_problem(name)
        if problem is not None:
            raise invalid(problem, "use a plain name such as 'addition-ds' (put parent directories in "
                          "run.output_dir), or null")
        return name

    @field_validator("output_dir")
    @classmethod
    def _output_dir_is_a_path(cls, output_dir: str) -> str:
        check_path_text("run.output_dir", output_dir)
        return output_dir


class AdditionSection(TaskSection):
    """The synthetic addition task: ``a+b=`` → ``a+b``. With 1-digit operands there are only 100 distinct pairs;
    the task splits the pairs it can make into disjoint train and held-out sets, and the two sizes are caps."""

    min_digits: int = Field(1, ge=1)
    """Fewest digits per operand (≥ 1)."""
    max_digits: int = Field(1, ge=1, le=3)
    """Most digits per operand (``min_digits`` ≤ max ≤ 3: the task enumerates every operand pair, 10^6 at 3 digits)."""
    num_train: int = Field(2000, ge=1)
    """At most this many training prompts (≥ 1; fewer when the operand space is smaller)."""
    num_eval: int = Field(100, ge=1)
    """At most this many held-out prompts (≥ 1), disjoint from the training prompts."""


class CountdownSection(TaskSection):
    """The Countdown task: reach ``target`` with the given numbers and + − × ÷, each number used once."""

    num_numbers: int = Field(3, ge=2)
    """Numbers given per puzzle (≥ 2)."""
    max_number: int = Field(20, ge=1)
    """Largest number drawn (≥ 1; numbers are drawn from 1..max_number)."""
    max_target: int = Field(100, ge=1)
    """Largest target (≥ 1)."""
    num_train: int = Field(2000, ge=1)
    """Training puzzles (≥ 1)."""
    num_eval: int = Field(100, ge=1)
    """Held-out puzzles (≥ 1)."""


class JsonlSection(TaskSection):
    """Prompts from JSON-lines files, one object per line (``data.task: jsonl``)."""

    train_path: str | None = None
    """Training file (required with ``task: jsonl``); relative to the working directory."""
    eval_path: str | None = None
    """Held-out file; ``null`` = no held-out evaluation data."""

    @field_validator("train_path", "eval_path")
    @classmethod
    def _paths_are_paths(cls, path: str | None, info: ValidationInfo) -> str | None:
        check_path_text(f"data.jsonl.{info.field_name}", path)
        return path


class DataSection(Section):
    """The prompts: a built-in task, JSONL files, or files read through Hugging Face ``datasets``."""

    task: str = "addition"
    """Which prompt source to use: a built-in task (``addition``, ``countdown``, ``jsonl``, ``dataset``; only the
    matching sub-section may hold non-default values), or a task class of your own as ``package.module:ClassName``,
    built with ``data.kwargs`` (and ``seed=run.seed`` when it takes a ``seed``): see docs/datasets.md."""
    addition: AdditionSection = Field(default_factory=AdditionSection)
    """Settings of the addition task."""
    countdown: CountdownSection = Field(default_factory=CountdownSection)
    """Settings of the Countdown task."""
    jsonl: JsonlSection = Field(default_factory=JsonlSection)
    """Settings of the JSONL prompt source."""
    dataset: DatasetSection = Field(default_factory=DatasetSection)
    """Settings of the ``dataset`` prompt source: parquet, arrow, JSON or CSV files, or a ``save_to_disk`` folder."""
    shuffle: bool = True
    """Shuffle training prompts each epoch (seeded from ``run.seed``)."""
    skip_no_signal: SkipNoSignalSection = Field(default_factory=SkipNoSignalSection)
    """Skip prompts whose recent groups all had zero reward variance, before dispatch (off by default)."""
    system_prompt: str | None = None
    """System message prepended to chat prompts; ``null`` = none."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of a plug-in task's class (``data.task: package.module:ClassName`` only)."""

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str) -> str:
        if task in builtin_task_names() or is_plugin_target(task):
            return task
        raise invalid(
            f"data.task must be a built-in task ({', '.join(builtin_task_names())}) or a plug-in task class "
            "'package.module:ClassName'",
            "pick a built-in task, or name your task class as package.module:ClassName",
        )


def builtin_task_names() -> tuple[str, ...]:
    """The built-in tasks: the :class:`DataSection` fields that hold a :class:`TaskSection`."""
    return tuple(
        name for name, field in DataSection.model_fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, TaskSection)
    )  # fmt: skip


class RewardSection(Section):
    """How a completion is scored."""

    function: str = "auto"
    """``auto`` (the task's own verifier), ``exact_numeric``, ``final_number``, ``countdown``, ``math_verify``, or
    ``module:function`` (an importable callable)."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments passed to the reward function."""
    timeout_s: float | None = Field(None, gt=0, le=MAX_REWARD_TIMEOUT_S)
    """Seconds one reward call may take (0 < t ≤ 86,400, one day); ``null`` = no limit (the call runs inline). A
    slower call fails with a ``RewardError`` naming the prompt and completion: a data failure of that prompt in
    async mode (retried, then skipped within ``async.rollout_failure.max_skipped_prompts``), a stop in sync mode.
    Calls then run on a helper thread; a stuck one cannot be killed and keeps its thread until it returns
    (docs/rewards.md)."""

    @field_validator("function")
    @classmethod
    def _function_is_known_or_importable(cls, function: str) -> str:
        module, sep, attr = function.partition(":")
        if function in BUILTIN_REWARD_FUNCTIONS or (sep and module.strip() and attr.strip() and ":" not in attr):
            return function
        raise invalid(
            f"reward.function must be one of {', '.join(BUILTIN_REWARD_FUNCTIONS)} or 'module:function'",
            "pick a built-in name, or give an importable callable as 'package.module:function_name'",
        )


class EvalSection(Section):
    """Held-out evaluation."""

    every: int = Field(0, ge=0)
    """Evaluate every this many optimizer steps (≥ 0; 0 = only at start/end)."""
    at_start: bool = True
    """Evaluate before the first step."""
    at_end: bool = True
    """Evaluate after the last step."""
    num_prompts: int | None = Field(None, ge=1)
    """Held-out prompts per evaluation (≥ 1); ``null`` = all of them."""
    pass_k: int = Field(1, ge=1)
    """Samples per prompt at the training temperature for pass@k (≥ 1); greedy accuracy is always reported."""


TrackingBackend = Literal["tensorboard", "wandb", "trackio", "mlflow"]
DEFAULT_BACKENDS: tuple[TrackingBackend, ...] = ("tensorboard",)


class LoggingSection(Section):
    """What the run records besides ``metrics.jsonl`` (always written)."""

    backends: list[TrackingBackend] = Field(default_factory=lambda: list(DEFAULT_BACKENDS))
    """Experiment trackers that get the same scalars as ``metrics.jsonl``, each through its own library (each name
    at most once; ``[]`` = none): ``tensorboard`` (``runs/<name>/tensorboard``), ``wandb`` (``runs/<name>/wandb``,
    offline without an API key), ``trackio`` (its local store), ``mlflow`` (``runs/<name>/mlflow.db``). All but
    TensorBoard are optional extras: ``pip install 'groupwise[wandb]'`` (``trackio``, ``mlflow``). Where each writes
    and how to view it: docs/metrics.md."""
    tensorboard: bool | None = None
    """The switch from before ``backends``, kept working: ``false`` leaves TensorBoard out and ``true`` adds it,
    whatever ``backends`` says; ``null`` = as ``backends`` says."""
    project: str = Field("groupwise", min_length=1)
    """Project (W&B, trackio) or experiment (MLflow) the run is logged under; the run is named after its
    directory."""
    progress: bool = True
    """Show a live progress bar on the console."""
    train_data: bool = True
    """Write every trained row to ``train_data/step_<N>.jsonl``."""

    @field_validator("backends")
    @classmethod
    def _each_backend_once(cls, backends: list[str]) -> list[str]:
        repeated = sorted({name for name in backends if backends.count(name) > 1})
        if repeated:
            raise invalid(f"logging.backends names {repeated} more than once", "list each backend once")
        return backends

    def enabled_backends(self) -> list[str]:
        """``backends`` with ``tensorboard`` (the older switch) applied: TensorBoard first when on."""
        chosen: list[str] = [name for name in self.backends if name != "tensorboard"]
        on = self.tensorboard if self.tensorboard is not None else "tensorboard" in self.backends
        return ["tensorboard", *chosen] if on else chosen


class CheckpointSection(Section):
    """Checkpoints (atomic directories under ``runs/<name>/checkpoints``)."""

    every: int = Field(0, ge=0)
    """Save every this many optimizer steps (≥ 0; 0 = only at the end, and not even then when ``save_final`` is
    false: such a run writes no checkpoint and cannot be resumed). A run always saves a checkpoint of its last step
    unless both are off."""
    keep_last: int = Field(2, ge=1)
    """Step checkpoints kept (≥ 1); older ones are deleted."""
    save_final: bool = True
    """Save the trained policy in Hugging Face format to ``runs/<name>/final``."""


class SftSection(Section):
    """Supervised fine-tuning on task demonstrations (``groupwise sft`` only; other commands ignore it). This is
    how the warm-start model is made."""

    steps: int = Field(2000, ge=1)
    """Optimizer steps at most (≥ 1)."""
    batch_size: int = Field(64, ge=1)
    """Demonstrations per step (≥ 1)."""
    lr: float = Field(1e-3, gt=0, le=1.0)
    """AdamW learning rate (0 < lr ≤ 1, as ``optimizer.lr``)."""
    eval_every: int = Field(100, ge=1)
    """Held-out greedy evaluation every this many steps (≥ 1), and after the last step."""
    stop_at_accuracy: float | None = Field(None, gt=0, le=1)
    """Stop at the first evaluation whose held-out greedy accuracy reaches this (0 < a ≤ 1); ``null`` = run all
    ``steps``."""
