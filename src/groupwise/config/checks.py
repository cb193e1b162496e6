"""The registry of cross-field rules and the runner that applies every one of them.

A rule is a function of the config that yields :class:`ConfigIssue` s; it declares the top-level sections it
reads (``needs``), so when one section fails type validation the rules that do not read it still run and
the user sees every problem at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from groupwise.config.base import changed_fields
from groupwise.config.issues import ConfigIssue

if TYPE_CHECKING:
    from groupwise.config.schema import RunConfig

# Any: ``cfg`` is a RunConfig, or during loading a namespace holding the sections that validated.
RuleCheck = Callable[[Any], Iterable[ConfigIssue]]


@dataclass(frozen=True)
class Rule:
    """One registered cross-field rule: the check, the top-level sections it reads, and a summary (the first
    paragraph of the check's docstring, listed in ``docs/configs.md``)."""

    check: RuleCheck
    needs: tuple[str, ...]
    summary: str


RULES: list[Rule] = []
#: Hazards: valid settings that are known to end runs badly. Reported as warnings (the run may go ahead), never
#: as errors; a key with no effect is an error, not a hazard.
HAZARDS: list[Rule] = []


def _registrar(registry: list[Rule], needs: tuple[str, ...]) -> Callable[[RuleCheck], RuleCheck]:
    def register(check: RuleCheck) -> RuleCheck:
        first_paragraph = (check.__doc__ or check.__name__).strip().split("\n\n")[0]
        summary = " ".join(first_paragraph.split())
        registry.append(Rule(check=check, needs=needs, summary=summary))
        return check

    return register


def rule(*needs: str) -> Callable[[RuleCheck], RuleCheck]:
    """Register a rule reading the top-level sections ``needs`` (attribute names: ``grpo``, ``async_``, ...)."""
    return _registrar(RULES, needs)


def hazard(*needs: str) -> Callable[[RuleCheck], RuleCheck]:
    """Register a hazard check (a warning, see :data:`HAZARDS`) reading the top-level sections ``needs``."""
    return _registrar(HAZARDS, needs)


def run_hazards(cfg: RunConfig) -> list[ConfigIssue]:
    """Every warning of every registered hazard check, for a config that validated."""
    return [issue for registered in HAZARDS for issue in registered.check(cfg)]


def run_rules(cfg: RunConfig, available: Iterable[str] | None = None) -> list[ConfigIssue]:
    """Every issue from every rule whose sections are all in ``available`` (``None`` = all sections)."""
    have = None if available is None else set(available)
    issues: list[ConfigIssue] = []
    for registered in RULES:
        if have is None or have.issuperset(registered.needs):
            issues.extend(registered.check(cfg))
    return issues


def no_effect(section: BaseModel, prefix: str, why: str, fix: str, keep: tuple[str, ...] = ()) -> list[ConfigIssue]:
    """One issue per key of ``section`` set away from its default although it has no effect (``why``);
    keys named in ``keep`` (the switch that turned the section off, say) are never reported."""
    kept = {f"{prefix}.{key}" for key in keep}
    return [
        ConfigIssue(path, value, f"{path} has no effect {why} (a key with no effect is an error)", fix)
        for path, value in changed_fields(section, prefix)
        if path not in kept
    ]
