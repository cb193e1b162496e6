"""Tasks by name: the built-in ones, or a plug-in class ``data.task: package.module:ClassName``.

``build_task(cfg.data.task, cfg.data, cfg.run.seed)`` builds either. A built-in task takes its own config
section (``data.addition`` for ``addition``); a plug-in task class takes ``data.kwargs``. Either gets
``seed=run.seed`` when its constructor has a ``seed`` parameter (generated tasks draw their items from it; a
task read from files has none). A plug-in task needs only its own module: nothing here names it.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel

from groupwise.data.addition import AdditionTask
from groupwise.data.countdown import CountdownTask
from groupwise.data.dataset_task import DatasetTask
from groupwise.data.jsonl_dataset import JsonlTask
from groupwise.plugins import PluginImportError, import_plugin, is_plugin_target
from groupwise.types import Prompt

if TYPE_CHECKING:
    from groupwise.config import DataSection

TaskSettings = Mapping[str, Any] | BaseModel | None
"""A task's settings: its own mapping or config section, or the whole data section (a mapping with a ``task`` key,
or ``cfg.data``)."""


@runtime_checkable
class Task(Protocol):
    """What the trainer needs from a task: two disjoint prompt splits, a default verifier, demonstrations."""

    name: str
    default_reward: str

    def train_prompts(self) -> list[Prompt]: ...

    def eval_prompts(self) -> list[Prompt]: ...

    def demonstration(self, prompt: Prompt) -> str: ...


TASKS: dict[str, type[Task]] = {
    task.name: task for task in (AdditionTask, CountdownTask, JsonlTask, DatasetTask)
}
_TASK_MEMBERS = ("name", "default_reward", "train_prompts", "eval_prompts", "demonstration")


def build_task(name: str, settings: TaskSettings, seed: int) -> Task:
    """The task ``name`` (a built-in name or ``package.module:ClassName``) built from its settings; ``seed`` fixes
    generated items and splits.

    ``settings`` is the task's own settings (a mapping, or a pydantic section such as ``cfg.data.addition``), or
    the whole data section (``cfg.data``, or a mapping with a ``task`` key), whose part for ``name`` is used.
    """
    task_cls = _task_class(name)
    kwargs = task_settings(name, settings)
    parameters = inspect.signature(task_cls).parameters
    accepted = [p for p in parameters if p != "seed"]
    unknown = sorted(set(kwargs) - set(accepted)) if not _takes_any_keyword(parameters) else []
    if "seed" in kwargs or unknown:
        bad = unknown + (["seed"] if "seed" in kwargs else [])
        raise ValueError(
            f"task {name!r} got unexpected settings {bad}; it accepts {accepted} (the seed comes from the run seed)"
        )
    if "seed" in parameters:
        kwargs["seed"] = seed
    task = task_cls(**kwargs)
    if not isinstance(task, Task):
        missing = [member for member in _TASK_MEMBERS if member not in dir(task)]
        raise ValueError(
            f"task {name!r} does not satisfy the Task protocol (groupwise.data.registry.Task): missing {missing}"
        )
    return task


def _task_class(name: str) -> type[Task]:
    if name in TASKS:
        return TASKS[name]
    if not is_plugin_target(name):
        raise ValueError(
            f"unknown task {name!r}; choose one of {sorted(TASKS)} or a task class 'package.module:ClassName' "
            "(data.task)"
        )
    cls = import_plugin(name, "task class")
    if not isinstance(cls, type):
        raise PluginImportError(f"task class {name!r}: it is a {type(cls).__name__}, not a class")
    return cls


def _takes_any_keyword(parameters: Mapping[str, inspect.Parameter]) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def task_settings(name: str, settings: TaskSettings) -> dict[str, Any]:
    """The keyword arguments of task ``name`` from its own settings or from the whole data section: a built-in
    task's section ``data.<name>``, a plug-in task's ``data.kwargs``."""
    if settings is None:
        return {}
    own = "kwargs" if name not in TASKS else name
    if isinstance(settings, Mapping):
        section = settings.get(own, {}) if "task" in settings else settings
    elif isinstance(settings, BaseModel) and "task" in type(settings).model_fields:  # a whole data section
        section = getattr(settings, own, None) or {}
    else:
        section = settings
    if isinstance(section, BaseModel):
        return dict(section.model_dump())
    if isinstance(section, Mapping):
        return dict(section)
    raise TypeError(f"task {name!r}: settings must be a mapping or a config section, got {type(section).__name__}")


def task_config_key(data: DataSection) -> str:
    """The config key holding the chosen task's settings (what an error about building the task names)."""
    return f"data.{data.task}" if data.task in TASKS else "data.kwargs"


def prompt_sources(data: DataSection) -> dict[str, str]:
    """Where each split's prompts come from, as a config key, for messages about a prompt: a JSONL or dataset
    task's files (or its held-out split or fraction), a generated task's section, a plug-in task's class."""
    if data.task == JsonlTask.name:
        return {"train": "data.jsonl.train_path", "eval": "data.jsonl.eval_path"}
    if data.task == DatasetTask.name:
        dataset = data.dataset
        held_out = ("eval_path" if dataset.eval_path is not None else "eval_split" if dataset.eval_split is not None
                    else "eval_fraction" if dataset.eval_fraction is not None else "eval_path")
        return {"train": "data.dataset.train_path", "eval": f"data.dataset.{held_out}"}
    key = f"data.{data.task}" if data.task in TASKS else "data.task"
    return {"train": key, "eval": key}
