"""Build a task by name: ``build_task(cfg.data.task, <that task's config section>, cfg.seed)``."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from groupwise.data.addition import AdditionTask
from groupwise.data.countdown import CountdownTask
from groupwise.data.jsonl_dataset import JsonlTask
from groupwise.types import Prompt

if TYPE_CHECKING:
    from groupwise.config import DataSection


class Task(Protocol):
    """What the trainer needs from a task: two disjoint prompt splits, a default verifier, demonstrations."""

    name: str
    default_reward: str

    def train_prompts(self) -> list[Prompt]: ...

    def eval_prompts(self) -> list[Prompt]: ...

    def demonstration(self, prompt: Prompt) -> str: ...


TASKS: dict[str, type] = {"addition": AdditionTask, "countdown": CountdownTask, "jsonl": JsonlTask}
_SEEDED = {"addition", "countdown"}  # JSONL files are given, not generated: no seed


def build_task(name: str, settings: DataSection, seed: int) -> Task:
    """The task ``name`` built from its settings; ``seed`` fixes generated items and splits.

    ``settings`` is the task's own config section (a mapping or a pydantic model, e.g.
    ``cfg.data.addition``), or the whole data section (``cfg.data``), whose ``name`` sub-section is used.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(TASKS)} (data.task)")
    task_cls = TASKS[name]
    kwargs = task_settings(name, settings)
    accepted = [p for p in inspect.signature(task_cls).parameters if p != "seed"]
    unknown = sorted(set(kwargs) - set(accepted))
    if "seed" in kwargs or unknown:
        bad = unknown + (["seed"] if "seed" in kwargs else [])
        raise ValueError(
            f"task {name!r} got unexpected settings {bad}; it accepts {accepted} (the seed comes from the run seed)"
        )
    if name in _SEEDED:
        kwargs["seed"] = seed
    return task_cls(**kwargs)


def task_settings(name: str, settings: DataSection) -> dict[str, Any]:
    """The keyword arguments of task ``name`` from its own section or from the whole data section."""
    if settings is None:
        return {}
    is_data_section = (isinstance(settings, Mapping) and "task" in settings) or (
        not isinstance(settings, Mapping) and hasattr(settings, "task")
    )
    if is_data_section:
        settings = settings.get(name) if isinstance(settings, Mapping) else getattr(settings, name, None)
        if settings is None:
            return {}
    if hasattr(settings, "model_dump"):
        return dict(settings.model_dump())
    if isinstance(settings, Mapping):
        return dict(settings)
    raise TypeError(f"task {name!r}: settings must be a mapping or a config section, got {type(settings).__name__}")
