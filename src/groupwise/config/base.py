"""The pydantic base every config section derives from: unknown keys forbidden, field docstrings kept."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

# The pydantic error type our own field validators raise; ``load`` reads ``rule`` and ``fix`` from its context.
RULE_ERROR_TYPE = "groupwise_rule"


class Section(BaseModel):
    """A config section. Unknown keys are errors; each field's attribute docstring becomes its description
    (rendered into ``docs/configs.md``); NaN and infinity are refused for every float.

    Strict types because YAML already types its scalars: ``"5"``, ``5.0`` or ``true`` for an integer
    is a mistake worth reporting, not something to coerce (an integer is still accepted for a float).
    """

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        use_attribute_docstrings=True,
        allow_inf_nan=False,
        validate_default=True,
    )

    @model_validator(mode="before")
    @classmethod
    def _null_means_defaults(cls, data: Any) -> Any:  # Any: pydantic's raw input, before validation
        """``grpo:`` with every child commented out reads as null in YAML; treat it as an empty section."""
        return {} if data is None else data


class TaskSection(Section):
    """The settings of a built-in task. The ``DataSection`` field holding one is the task's name, so the list of
    built-in tasks is spelled once: ``groupwise.config.sections.builtin_task_names``."""


def changed_fields(section: BaseModel, prefix: str) -> list[tuple[str, object]]:
    """Every leaf key of ``section`` whose value differs from a default-constructed section, as
    ``(dotted path, value)``: the keys a user set to something that would matter.

    Nested sections are compared field by field so the error names the exact key; a field whose
    type changed (a different sampler, say) is reported as a whole.
    """
    default = type(section)()
    changed: list[tuple[str, object]] = []
    for name, field in type(section).model_fields.items():
        key = field.alias or name
        value, default_value = getattr(section, name), getattr(default, name)
        if isinstance(value, BaseModel) and type(value) is type(default_value):
            changed.extend(changed_fields(value, f"{prefix}.{key}"))
        elif value != default_value:
            changed.append((f"{prefix}.{key}", _plain(value)))
    return changed


def _plain(value: object) -> object:
    """A model as the dict a user would have written; anything else unchanged."""
    return value.model_dump(mode="json", by_alias=True) if isinstance(value, BaseModel) else value


def invalid(rule: str, fix: str) -> PydanticCustomError:
    """The error a field validator raises: ``rule`` (what is wrong) and ``fix`` (what to do) end up in
    the :class:`~groupwise.config.issues.ConfigIssue` unchanged."""
    return PydanticCustomError(RULE_ERROR_TYPE, "{rule}", {"rule": rule, "fix": fix})


def check_path_text(key: str, path: str | None) -> None:
    """Raise the config error for a path no file system can open (a NUL byte, a lone surrogate, blank)."""
    if path is not None and ("\0" in path or not path.strip() or not is_encodable(path)):
        raise invalid(f"{key} must be a non-empty path without NUL bytes or lone surrogates",
                      f"set {key} to a real path")


def is_encodable(text: str) -> bool:
    """Whether ``text`` is valid Unicode (no lone surrogate), so it can be written as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
