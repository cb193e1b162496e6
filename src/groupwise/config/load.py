"""Build a :class:`RunConfig` from a YAML file or a dict plus dotted command-line overrides, reporting every
problem (file, override syntax, unknown keys, types, ranges, cross-field rules) in one :class:`ConfigError`.

Each top-level section is validated on its own, so one malformed section does not hide the errors of the
others; cross-field rules then run on every section that validated.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import yaml
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from groupwise.config.checks import run_rules
from groupwise.config.issues import ConfigError, ConfigIssue
from groupwise.config.keys import field_key
from groupwise.config.pydantic_issues import issues_from_validation_error, unknown_key_issue
from groupwise.config.schema import RunConfig
from groupwise.config.yaml_input import YamlInputError, parse_yaml


def load_config(path: str | Path, overrides: Iterable[str] = ()) -> RunConfig:
    """Read the YAML file at ``path``, apply ``overrides`` (``"grpo.num_prompts_per_step=8"``), validate.

    Relative paths inside the config (``model.path``, ``data.jsonl.*``) are kept as written and resolved later
    against the current working directory. Raises :class:`ConfigError` listing every problem.
    """
    overrides = list(overrides)
    try:
        data = read_config_file(path)
    except ConfigError as exc:  # still report the overrides' own mistakes, so one pass fixes everything
        override_issues = apply_overrides({}, overrides)
        if override_issues:
            raise ConfigError([*exc.errors, *override_issues], exc.source) from None
        raise
    return config_from_dict(data, overrides, source=str(path))


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a YAML config file (an empty file is an empty mapping)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([ConfigIssue("", str(path), "the config file does not exist", "check the path")],
                          source=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([ConfigIssue("", str(path), f"the config file cannot be read: {exc}",
                                       "pass a readable UTF-8 YAML file")], source=str(path)) from None
    try:
        data = parse_yaml(text)
    except YamlInputError as exc:
        raise ConfigError(exc.issues, source=str(path)) from None
    except yaml.YAMLError as exc:
        raise ConfigError([ConfigIssue("", str(path), f"the file is not valid YAML: {_one_line(exc)}",
                                       "fix the YAML syntax at the line shown")], source=str(path)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([ConfigIssue("", data, "the top level of a config file must be a mapping of sections",
                                       "start the file with keys such as 'run:', 'model:', 'grpo:'")], str(path))
    return data


def config_from_dict(data: Mapping[str, Any], overrides: Iterable[str] = (), *, source: str | None = None) -> RunConfig:
    """Validate a config given as nested dicts (as YAML would load it), after applying ``overrides``.
    ``data`` is not modified. Raises :class:`ConfigError` listing every problem."""
    if not isinstance(data, Mapping):
        raise ConfigError([ConfigIssue("", data, "a config must be a mapping of sections", "pass a dict")], source)
    raw = copy.deepcopy(dict(data))
    issues = apply_overrides(raw, overrides)
    sections, section_issues = _validate_sections(raw)
    issues.extend(section_issues)
    if issues:
        # The sections that validated, as a partial config: only the rules whose sections are all here run.
        issues.extend(run_rules(cast("RunConfig", SimpleNamespace(**sections)), available=sections))
        raise ConfigError(issues, source)
    try:
        return RunConfig.model_validate(sections)
    except ConfigError as exc:  # cross-field rules, raised by RunConfig's own validator
        raise ConfigError(exc.errors, source) from None
    except ValidationError as exc:  # not expected once every section validated; still reported the same way
        raise ConfigError(issues_from_validation_error(exc, ""), source) from None


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> list[ConfigIssue]:
    """Set each ``dotted.key=value`` in ``raw`` (value parsed as YAML: ``8`` int, ``0.5`` float, ``true``,
    ``null``, ``[a, b]``), creating missing mappings on the way. Returns the problems, among them a key given
    twice (like a duplicate key in a file, the second one would silently win)."""
    issues: list[ConfigIssue] = []
    given: dict[str, str] = {}
    for text in overrides:
        key, sep, value_text = str(text).partition("=")
        parts = key.strip().split(".")
        if not sep or not all(p.strip() for p in parts):
            issues.append(ConfigIssue(
                str(text), str(text), "an override must be KEY=VALUE with a dotted KEY",
                "write it like grpo.num_prompts_per_step=8 (no spaces around '.')",
            ))
            continue
        parts = [p.strip() for p in parts]
        dotted = ".".join(parts)
        if dotted in given:
            issues.append(ConfigIssue(
                dotted, f"{given[dotted]} and {value_text}", f"the override {dotted} is given twice",
                f"keep one {dotted}=VALUE",
            ))
            continue
        given[dotted] = value_text
        try:
            value = parse_yaml(value_text, prefix=dotted)
        except YamlInputError as exc:
            issues.extend(exc.issues)
            continue
        except yaml.YAMLError as exc:
            issues.append(ConfigIssue(dotted, value_text, f"the override value is not valid YAML: "
                                      f"{_one_line(exc)}", "quote the value, e.g. key='a: b'"))
            continue
        issue = _set_dotted(raw, parts, value)
        if issue is not None:
            issues.append(issue)
    return issues


def _set_dotted(raw: dict[str, Any], parts: list[str], value: object) -> ConfigIssue | None:
    node = raw
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            parent = ".".join(parts[: depth + 1])
            return ConfigIssue(
                parent, child, f"cannot set {'.'.join(parts)}: {parent} is a value, not a section",
                f"set {parent}=VALUE instead",
            )
        node = child
    node[parts[-1]] = value
    return None


def _validate_sections(raw: dict[str, Any]) -> tuple[dict[str, Any], list[ConfigIssue]]:
    """Validate each top-level section separately: ``(validated sections by attribute name, issues)``.
    A section with errors is left out; a section not given gets its defaults."""
    issues: list[ConfigIssue] = []
    fields = RunConfig.model_fields
    by_key = {field_key(name, f): name for name, f in fields.items()} | {name: name for name in fields}
    for key in raw:
        if key not in by_key:
            issues.append(unknown_key_issue(str(key), raw[key]))
    sections: dict[str, Any] = {}
    for name, field in fields.items():
        keys_given = [k for k in {field_key(name, field), name} if k in raw]
        if len(keys_given) > 1:
            issues.append(ConfigIssue(name, raw[name], f"both '{field.alias}' and '{name}' are given",
                                      f"keep only '{field.alias}'"))
            continue
        if not keys_given:
            sections[name] = field.get_default(call_default_factory=True)
            continue
        key = keys_given[0]
        try:
            sections[name] = _section_adapter(name).validate_python(raw[key])
        except ValidationError as exc:
            issues.extend(issues_from_validation_error(exc, field_key(name, field)))
    return sections, issues


_ADAPTERS: dict[str, TypeAdapter[Any]] = {}  # Any: each adapter validates its own section's type


def _section_adapter(name: str) -> TypeAdapter[Any]:  # Any: as in _ADAPTERS
    """A validator for one top-level field alone (strict, like the sections themselves)."""
    if name not in _ADAPTERS:
        annotation = RunConfig.model_fields[name].annotation
        assert annotation is not None, f"RunConfig.{name} is annotated"
        is_model = isinstance(annotation, type) and issubclass(annotation, BaseModel)
        # a model brings its own (strict) config; pydantic refuses a second one for it
        config = None if is_model else ConfigDict(strict=True)
        _ADAPTERS[name] = TypeAdapter(annotation, config=config)
    return _ADAPTERS[name]


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
