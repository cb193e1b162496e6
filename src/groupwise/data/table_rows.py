"""Rows of a table as prompts: the ``dataset`` task's column mapping, its presets, and the checks every mapped value
passes, so that a bad row is named with its column before any model loads, never met later as a crash.

A row is a dict of column values as ``datasets`` yields them: ``str``, ``int``, ``float``, ``bool``, ``None``, lists,
and dicts for struct columns. What a row must hold:

- the prompt: a non-blank string (``columns.prompt``), or chat turns (``columns.messages``: a non-empty list of
  ``{role, content}`` strings, not all blank; any other field of a turn must be null, which is what Arrow stores
  for a field a turn lacks), without a lone surrogate (no tokenizer encodes one);
- the answer: a string or a finite number, stored as its string form (as the JSONL task does);
- the id, when mapped: a non-empty string or an integer;
- metadata: JSON values (strings, finite numbers, booleans, null, lists, string-keyed dicts), because prompts are
  written into checkpoints as JSON, where a timestamp, bytes or a NaN would stop the run at its first save.

Each problem is ``(column, message)``, and a message holds no value of its row (only types), so the problems of a
column of the wrong type group into one line however many rows share them.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from groupwise.data.jsonl_dataset import answer_text, lone_surrogate
from groupwise.types import Prompt

PRESET_COLUMNS: dict[str, dict[str, Any]] = {
    "none": {"prompt": "prompt", "messages": None, "answer": "answer", "id": None, "metadata": None},
    # verl's parquet layout (its examples/data_preprocess scripts): chat turns in ``prompt``, the answer in the
    # ``reward_model`` struct, and the two fields verl's reward functions take besides them.
    "verl": {"prompt": None, "messages": "prompt", "answer": "reward_model.ground_truth", "id": None,
             "metadata": ("data_source", "extra_info")},
}  # fmt: skip

Problem = tuple[str, str]
"""``(column, what is wrong with its value)``."""


@dataclass(frozen=True)
class ColumnMap:
    """Which column holds what. A dotted name reaches into struct columns when no column has that exact name;
    ``metadata`` None means every column not mapped to the prompt, answer or id."""

    prompt: str | None
    messages: str | None
    answer: str
    id: str | None
    metadata: tuple[str, ...] | None

    @property
    def mapped(self) -> tuple[str, ...]:
        """The prompt (or messages), answer and id columns, as named."""
        return tuple(name for name in (self.prompt, self.messages, self.answer, self.id) if name is not None)

    def metadata_columns(self, available: Sequence[str]) -> tuple[str, ...]:
        """The columns copied into metadata, given the table's columns."""
        if self.metadata is not None:
            return self.metadata
        taken = {top_column(name, available) for name in self.mapped}
        return tuple(name for name in available if name not in taken)

    def read_columns(self, available: Sequence[str]) -> list[str]:
        """The top-level columns a row needs, in the table's order (a parquet reader reads only these)."""
        needed = {top_column(name, available) for name in (*self.mapped, *self.metadata_columns(available))}
        return [name for name in available if name in needed]

    def role(self, name: str) -> str:
        """The mapping key that names column ``name`` (``columns.answer``), for messages."""
        for key in ("prompt", "messages", "answer", "id"):
            if getattr(self, key) == name:
                return f"columns.{key}"
        return "columns.metadata"

    def missing(self, available: Sequence[str]) -> list[str]:
        """The mapped names (metadata included) whose column the table does not have."""
        names = (*self.mapped, *(self.metadata or ()))
        return [name for name in names if top_column(name, available) not in available]


def column_map(preset: str, columns: Mapping[str, Any]) -> ColumnMap:
    """The mapping of ``preset`` with the keys ``columns`` sets (not None) in its place; setting ``prompt`` or
    ``messages`` replaces the preset's choice of both."""
    chosen = dict(PRESET_COLUMNS[preset])
    given = {key: value for key, value in columns.items() if value is not None}
    if given.get("prompt") is not None and given.get("messages") is not None:
        raise ValueError("columns: set prompt (plain text) or messages (chat turns), not both")
    if "prompt" in given or "messages" in given:
        chosen["prompt"] = chosen["messages"] = None
    chosen.update(given)
    metadata = chosen["metadata"]
    return ColumnMap(chosen["prompt"], chosen["messages"], chosen["answer"], chosen["id"],
                     None if metadata is None else tuple(metadata))  # fmt: skip


def top_column(name: str, available: Collection[str]) -> str:
    """The table column a mapped name reads: the name itself, or the first part of a dotted name."""
    return name if name in available else name.split(".")[0]


def column_value(row: Mapping[str, Any], name: str) -> Any:
    """The value ``name`` names in ``row`` (a null struct gives null fields). Raises :class:`LookupError` saying
    why when a dotted name walks into something that is not a struct, or a struct without that field."""
    if name in row:
        return row[name]
    head, *fields = name.split(".")
    value, walked = row[head], head
    for field in fields:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise LookupError(f"{walked!r} holds a {type(value).__name__}, not a struct with a field {field!r}")
        if field not in value:
            raise LookupError(f"struct column {walked!r} has no field {field!r} (its fields: {sorted(value)})")
        value, walked = value[field], f"{walked}.{field}"
    return value


def row_prompt(row: Mapping[str, Any], columns: ColumnMap, metadata: Sequence[str], uid: str) -> Prompt | list[Problem]:
    """The prompt of one row, or every problem of its mapped values. ``metadata``: the columns copied into
    ``Prompt.metadata``; ``uid``: the uid when no id column is mapped."""
    problems: list[Problem] = []
    values: dict[str, Any] = {}
    for name in dict.fromkeys((*columns.mapped, *metadata)):
        try:
            values[name] = column_value(row, name)
        except LookupError as exc:
            problems.append((name, str(exc)))
    text = turns = None
    if columns.prompt in values:
        text = _checked(columns.prompt, _text(values[columns.prompt]), problems)
    if columns.messages in values:
        turns = _checked(columns.messages, _turns(values[columns.messages]), problems)
    answer = _checked(columns.answer, _answer(values[columns.answer]), problems) if columns.answer in values else None
    if columns.id is not None and columns.id in values:
        uid = _checked(columns.id, _uid(values[columns.id]), problems) or uid
    kept = {}
    for name in metadata:
        if name in values:
            problem = json_value_problem(values[name])
            if problem is not None:
                problems.append((name, f"holds {problem}, which metadata cannot keep (a prompt is saved as JSON): "
                                       "list the columns to keep in columns.metadata, or convert this one"))
            kept[name] = values[name]
    if problems:
        return problems
    assert answer is not None and (text is None) != (turns is None)  # no problem: every mapped value was read
    return Prompt(uid=uid, answer=answer, text=text, messages=turns, metadata=kept)


def _checked(column: str, result: tuple[Any, str | None], problems: list[Problem]) -> Any:
    value, problem = result
    if problem is not None:
        problems.append((column, problem))
    return value


def _text(value: object) -> tuple[str | None, str | None]:
    if isinstance(value, list):
        return None, "holds chat turns, not a string: map it as columns.messages (preset verl does)"
    if not isinstance(value, str):
        return None, f"must be a string, got {_type(value)}"
    if not value.strip():
        return None, "is empty: the model would generate from nothing but BOS"
    return value, _surrogate_problem(value)


def _turns(value: object) -> tuple[tuple[dict[str, str], ...] | None, str | None]:
    if isinstance(value, str):
        return None, "holds a string, not chat turns: map it as columns.prompt"
    if not isinstance(value, list) or not value:
        return None, f"must be a non-empty list of {{role, content}} turns, got {_type(value, empty=True)}"
    turns = []
    for i, turn in enumerate(value):
        if not isinstance(turn, dict) or not {"role", "content"} <= set(turn):
            return None, f"turn {i} must be a struct with the fields role and content, got {_type(turn)}"
        extra = sorted(key for key, field in turn.items() if key not in ("role", "content") and field is not None)
        if extra:
            return None, f"turn {i} has fields besides role and content that are not null: {extra}"
        if not isinstance(turn["role"], str) or not isinstance(turn["content"], str):
            return None, f"turn {i}: role and content must be strings"
        turns.append({"role": turn["role"], "content": turn["content"]})
    if not any(turn["content"].strip() for turn in turns):
        return None, "every turn has empty content: the model would be asked nothing"
    problem = next(filter(None, (_surrogate_problem(turn["content"] + turn["role"]) for turn in turns)), None)
    return tuple(turns), problem


def _answer(value: object) -> tuple[str | None, str | None]:
    answer = answer_text(value)
    if answer is None:
        return None, f"must be a string or a finite number, got {_type(value)}"
    return answer, _surrogate_problem(answer)


def _uid(value: object) -> tuple[str | None, str | None]:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        return None, f"must be a non-empty string or an integer, got {_type(value, empty=True)}"
    return str(value), _surrogate_problem(str(value))


def _surrogate_problem(text: str) -> str | None:
    bad = lone_surrogate(text)
    return None if bad is None else f"holds a lone surrogate ({bad}), which no tokenizer can encode"


def _type(value: object, empty: bool = False) -> str:
    """The type of ``value`` as a message says it (null; an empty string or list when ``empty``)."""
    if value is None:
        return "null"
    if empty and isinstance(value, (str, list)) and not value:
        return f"an empty {'string' if isinstance(value, str) else 'list'}"
    if isinstance(value, float) and not math.isfinite(value):
        return "a non-finite float"
    return type(value).__name__


def json_value_problem(value: object) -> str | None:
    """What part of ``value`` cannot be written as JSON (``"a datetime"``), or None. Walks with an explicit stack:
    a value nested deep cannot exhaust the recursion limit."""
    stack = [value]
    while stack:
        item = stack.pop()
        if item is None or isinstance(item, (str, bool, int)):
            if isinstance(item, str) and lone_surrogate(item) is not None:
                return "a string with a lone surrogate"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "a NaN or infinite float"
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            if not all(isinstance(key, str) for key in item):
                return "a dict whose keys are not all strings"
            stack.extend(item.values())
        else:
            return f"a {type(item).__name__}"
    return None
