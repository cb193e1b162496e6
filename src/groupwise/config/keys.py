"""Valid dotted key paths of the schema and the nearest one to a mistyped key ("did you mean ...?")."""

from __future__ import annotations

import difflib
import functools
import types
import typing

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from groupwise.config.schema import RunConfig


def model_types(annotation: object) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold: the model itself, or each model of a union / ``Annotated``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return [m for arg in typing.get_args(annotation) for m in model_types(arg)]
    return []


def field_key(name: str, field: FieldInfo) -> str:
    """The key a user writes in YAML: the alias when there is one (``async`` for ``async_``)."""
    return field.alias or name


def dotted_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every settable dotted path under ``model``, sections included (``grpo``, ``grpo.dynamic_sampling``, ...).
    A union of models (the sampler) contributes the fields of every member."""
    paths: list[str] = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{field_key(name, field)}"
        if path not in paths:
            paths.append(path)
        for sub in model_types(field.annotation):
            paths.extend(p for p in dotted_paths(sub, f"{path}.") if p not in paths)
    return paths


@functools.cache
def valid_paths() -> tuple[str, ...]:
    """All dotted paths of :class:`RunConfig` (computed once)."""
    return tuple(dotted_paths(RunConfig))


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _leaf(path: str) -> str:
    return path.rpartition(".")[2]


def nearest_key(path: str) -> str | None:
    """The valid path a user most likely meant by the unknown ``path``, or ``None``.

    Tried in order: a close sibling (``grpo.num_prompt_per_step``), the same or a close leaf name in another
    section (``grpo.epsilon_high`` → ``loss.epsilon_high``), then any close full path.
    """
    paths = valid_paths()
    siblings = [p for p in paths if _parent(p) == _parent(path)]
    match = difflib.get_close_matches(path, siblings, n=1, cutoff=0.6)
    if match:
        return match[0]
    leaves = sorted({_leaf(p) for p in paths})
    leaf_match = difflib.get_close_matches(_leaf(path), leaves, n=1, cutoff=0.8)
    if leaf_match:
        same_leaf = [p for p in paths if _leaf(p) == leaf_match[0]]
        return max(same_leaf, key=lambda p: difflib.SequenceMatcher(None, p, path).ratio())
    match = difflib.get_close_matches(path, paths, n=1, cutoff=0.6)
    return match[0] if match else None


def keys_under(parent: str) -> list[str]:
    """The valid keys directly under ``parent`` (``""`` = top level), for "valid keys here: ..." hints."""
    return [_leaf(p) for p in valid_paths() if _parent(p) == parent]
