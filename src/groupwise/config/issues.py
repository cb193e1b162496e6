"""How config problems are reported: every problem is a :class:`ConfigIssue`, all of them travel in one
:class:`ConfigError`, so a user fixes a config in one pass instead of one error per run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml


class _NotSet:
    """Marker for a value the user did not give (a required key that is missing)."""

    def __repr__(self) -> str:
        return "(not set)"


NOT_SET: Any = _NotSet()  # Any: a sentinel that stands in for a value of any type


@dataclass(frozen=True)
class ConfigIssue:
    """One problem: the dotted key ``path`` (``""`` for the whole file), the ``value`` given, the
    ``rule`` it breaks, and the ``fix`` a user should apply."""

    path: str
    value: object
    rule: str
    fix: str

    def __str__(self) -> str:
        return self.render()

    def render(self, indent: str = "  ") -> str:
        """Three lines: where and what was given, the rule, the fix (continuation lines start with ``indent``;
        a rule of several lines, such as a dataset's bad lines, keeps them under ``rule:``)."""
        where = self.path or "(config file)"
        rule = self.rule.replace("\n", "\n" + indent + " " * len("rule: "))
        return f"{where}: got {format_value(self.value)}\n{indent}rule: {rule}\n{indent}fix:  {self.fix}"


def format_warning(issue: ConfigIssue) -> str:
    """A hazard (:mod:`groupwise.config.hazards`) as the CLI prints it: ``warning:`` and the three lines."""
    where = issue.path or "(config file)"
    return f"warning: {where}: {format_value(issue.value)}\n  why: {issue.rule}\n  instead: {issue.fix}"


def warning_line(issue: ConfigIssue) -> str:
    """A hazard on one line, for ``events.log``."""
    return f"config warning: {issue.path}: {issue.rule}; instead: {issue.fix}"


class ConfigError(Exception):
    """A config that cannot be used. ``errors`` lists every problem found; ``str`` is a readable
    numbered list. ``source`` names the file (or ``None`` for an in-memory dict).

    Not a ``ValueError`` on purpose: pydantic turns a ``ValueError`` raised inside a validator into its
    own ``ValidationError``, and :class:`RunConfig` raises this one from its model validator.
    """

    def __init__(self, errors: Sequence[ConfigIssue], source: str | None = None) -> None:
        if not errors:
            raise ValueError("ConfigError needs at least one ConfigIssue")
        self.errors: list[ConfigIssue] = list(errors)
        self.source = source
        super().__init__(self._render())

    def __reduce__(self) -> tuple[type[ConfigError], tuple[list[ConfigIssue], str | None]]:
        # rebuild from the issues, not from the rendered message (pickling across processes, e.g. Ray)
        return (type(self), (self.errors, self.source))

    def _render(self) -> str:
        n = len(self.errors)
        head = f"invalid config{f' {self.source}' if self.source else ''}: {n} error{'s' if n != 1 else ''}"
        lines = []
        for i, issue in enumerate(self.errors, start=1):
            number = f"  {i}. "
            lines.append(number + issue.render(indent=" " * len(number)))
        body = "\n".join(lines)
        return f"{head}\n{body}"

    def __str__(self) -> str:
        return self._render()


def format_value(value: object) -> str:
    """A value as the user would write it in YAML (``null``, ``true``, ``[1, 2]``), on one line."""
    if value is NOT_SET:
        return "(not set)"
    try:
        text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip()
    except yaml.YAMLError:
        return repr(value)
    text = text.removesuffix("\n...").removesuffix("...").strip()
    return text if len(text) <= 200 else text[:197] + "..."
