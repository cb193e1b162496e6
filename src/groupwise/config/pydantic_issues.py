"""Turn pydantic's type and range errors into :class:`ConfigIssue` s (key path, value, rule, fix), so they read
like the cross-field rules and can be reported together with them."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from groupwise.config.async_schema import SAMPLER_CONFIGS, sampler_knob_owners
from groupwise.config.base import RULE_ERROR_TYPE
from groupwise.config.issues import NOT_SET, ConfigIssue
from groupwise.config.keys import keys_under, nearest_key

# What a value of each pydantic type error should have been, in YAML terms.
EXPECTED_KIND = {
    "int_type": "an integer (no quotes, no decimal point)",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string (quote values YAML would read as numbers, booleans or dates)",
    "list_type": "a list, e.g. [a, b]",
    "tuple_type": "a list",
    "dict_type": "a mapping of keys to values",
    "model_type": "a mapping of keys to values",
    "model_attributes_type": "a mapping of keys to values",
    "finite_number": "a finite number (.nan and .inf are not allowed)",
    "literal_error": "one of the listed values",
}
BOUND_WORDS = {"greater_than": ">", "greater_than_equal": "≥", "less_than": "<", "less_than_equal": "≤"}


def format_path(prefix: str, loc: Sequence[str | int]) -> tuple[str, str | None]:
    """``(dotted path, sampler tag)`` from a pydantic ``loc`` under ``prefix``.

    A discriminated union puts the chosen member's tag in ``loc`` (``sampler.ready_first.x``); the user never
    wrote that tag, so it is removed from the path and returned separately.
    """
    parts = [prefix] if prefix else []
    tag = None
    for i, item in enumerate(loc):
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        elif i > 0 and loc[i - 1] == "sampler" and item in SAMPLER_CONFIGS:
            tag = str(item)
        else:
            parts.append(str(item))
    return ".".join(parts), tag


def issues_from_validation_error(error: ValidationError, prefix: str) -> list[ConfigIssue]:
    """One issue per pydantic error, with paths under ``prefix`` (the top-level YAML key)."""
    return [issue_from_error_details(details, prefix) for details in error.errors()]


def issue_from_error_details(details: ErrorDetails, prefix: str) -> ConfigIssue:
    """The issue for one pydantic error: a readable rule and a concrete fix for the common error types."""
    path, tag = format_path(prefix, details["loc"])
    kind, ctx = details["type"], details.get("ctx") or {}
    value: object = details.get("input", NOT_SET)
    if kind == RULE_ERROR_TYPE:
        return ConfigIssue(path, value, str(ctx["rule"]), str(ctx["fix"]))
    if kind == "extra_forbidden":
        return _unknown_key_issue(path, value, tag)
    if kind == "missing":
        return ConfigIssue(path, NOT_SET, f"{path} is required", f"set {path}")
    if kind == "invalid_key":
        return ConfigIssue(
            path, value, "keys must be strings",
            "quote the key: YAML reads yes/no/on/off/true/false, null and numbers as non-strings",
        )
    if kind in BOUND_WORDS:
        (bound,) = (_number(ctx[k]) for k in ("gt", "ge", "lt", "le") if k in ctx)
        word = BOUND_WORDS[kind]
        return ConfigIssue(path, value, f"{path} must be {word} {bound}", f"set {path} to a value {word} {bound}")
    if kind in ("literal_error", "union_tag_invalid"):
        expected = ctx.get("expected") or ctx.get("expected_tags", "")
        return ConfigIssue(path, value, f"{path} must be one of {expected}", f"use one of {expected}")
    if kind in ("too_short", "too_long"):
        return ConfigIssue(path, value, f"{path}: {details['msg']}", f"give {path} the expected number of items")
    if kind in EXPECTED_KIND:
        expected = EXPECTED_KIND[kind]
        return ConfigIssue(path, value, f"{path} must be {expected}", f"write {path} as {expected}")
    return ConfigIssue(path, value, f"{path}: {details['msg']}", f"see the entry for {path} in docs/configs.md")


def _unknown_key_issue(path: str, value: object, sampler_tag: str | None) -> ConfigIssue:
    """An unknown key: say which sampler owns a foreign sampler knob, else suggest the nearest valid key."""
    key = path.rpartition(".")[2]
    owners = sampler_knob_owners(key) if sampler_tag else []
    if owners:
        names = ", ".join(f"'{o}'" for o in owners)
        return ConfigIssue(
            path, value,
            f"{key} is a knob of sampler {names}, not of the chosen sampler '{sampler_tag}'",
            f"remove {path}, or set async.sampler.name: {owners[0]}",
        )
    return unknown_key_issue(path, value)


def unknown_key_issue(path: str, value: object) -> ConfigIssue:
    """``unknown key``, with "did you mean `x`?" when a valid key is close, else the valid keys at that level."""
    suggestion = nearest_key(path)
    if suggestion is not None:
        fix = f"did you mean `{suggestion}`?"
    else:
        fix = f"remove it; valid keys here: {', '.join(keys_under(path.rpartition('.')[0])) or '(none)'}"
    return ConfigIssue(path, value, f"unknown key {path}", fix)


def _number(bound: object) -> object:
    """``0.0`` → ``0`` and ``1e+30`` → ``1e30`` for display (a float that is a whole number below a million shows
    as one, a larger or smaller one in exponent form); other bounds unchanged."""
    if not isinstance(bound, float):
        return bound
    if bound.is_integer() and abs(bound) < 1e7:
        return int(bound)
    return f"{bound:g}".replace("e+", "e")
