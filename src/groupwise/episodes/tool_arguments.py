"""A tool call's JSON arguments checked against the tool's type hints before the tool runs.

A model's call is JSON, so its values are strings, numbers, booleans, null, lists and objects. Each argument must
fit its parameter's hint; the only conversions made are the lossless ones JSON forces:

- an integer for a ``float`` parameter (``3`` → ``3.0``, up to 2**53, where every integer is a float exactly);
- an integral float for an ``int`` parameter (``3.0`` → ``3``);
- a list for a ``tuple`` parameter (JSON has no tuples).

Nothing else is converted. In particular a string is never read as a number (``add("3", "69")`` is an error, not
``72`` and not ``"369"``): the model is trained on its calls, and a call that works only because the environment
repaired it would reinforce writing the wrong type. ``bool`` is not an integer here (JSON's ``true`` for an
``int`` parameter is an error). A hint this module does not know (a class of the user's, ``Any``) takes the value
as JSON gave it. A misfit is a readable message for the model, never an exception.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

_EXACT_FLOAT_INT = 2**53
_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null"}


class ArgumentMisfit(ValueError):
    """An argument that does not fit its parameter's hint (the message is for the model)."""


def checked_arguments(tool: Callable[..., Any], arguments: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` bound to ``tool``'s parameters and converted where lossless; :class:`ArgumentMisfit` naming
    the first argument that does not fit (a missing or unknown one too)."""
    try:
        bound = inspect.signature(tool).bind(**arguments)
    except TypeError as exc:
        raise ArgumentMisfit(str(exc)) from None
    try:
        hints = typing.get_type_hints(tool)
    except Exception:  # unresolvable annotations (config check names them): the values go as JSON gave them
        hints = {}
    out = dict(bound.arguments)
    for name, value in bound.arguments.items():
        if name in hints:
            out[name] = _fit(value, hints[name], f"argument {name!r}")
    return out


def _fit(value: Any, hint: Any, where: str) -> Any:
    """``value`` as ``hint`` takes it (converted only losslessly), or :class:`ArgumentMisfit`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        return value
    if origin is typing.Union or origin is types.UnionType:
        return _fit_union(value, args, where)
    if origin is typing.Literal:
        if any(type(value) is type(a) and value == a for a in args):
            return value
        raise ArgumentMisfit(f"{where} must be one of {', '.join(repr(a) for a in args)}, not {_shown(value)}")
    if hint in _TYPE_WORDS:
        return _fit_scalar(value, hint, where)
    container = origin or hint
    if container in (list, tuple, set, frozenset) or container is dict:
        return _fit_container(value, container, args, where)
    return value  # a type of the user's: JSON's value as it is


def _fit_union(value: Any, members: tuple[Any, ...], where: str) -> Any:
    exact = [m for m in members if _is_exactly(value, m)]
    for member in exact or members:
        try:
            return _fit(value, member, where)
        except ArgumentMisfit:
            continue
    wanted = " or ".join(_TYPE_WORDS.get(m, str(m).removeprefix("typing.")) for m in members)
    raise ArgumentMisfit(f"{where} must be {wanted}, not {_shown(value)}")


def _is_exactly(value: Any, member: Any) -> bool:
    """Whether ``value`` is already of ``member``'s plain type (so a union prefers it over a conversion)."""
    plain = typing.get_origin(member) or member
    return isinstance(plain, type) and type(value) is plain


def _fit_scalar(value: Any, hint: type, where: str) -> Any:
    if type(value) is hint:
        return value
    if hint is float and type(value) is int and abs(value) <= _EXACT_FLOAT_INT:
        return float(value)
    if hint is int and type(value) is float and value.is_integer() and abs(value) <= _EXACT_FLOAT_INT:
        return int(value)
    raise ArgumentMisfit(f"{where} must be {_TYPE_WORDS[hint]}, not {_shown(value)}")


def _fit_container(value: Any, container: Any, args: tuple[Any, ...], where: str) -> Any:
    if container is dict:
        if not isinstance(value, dict):
            raise ArgumentMisfit(f"{where} must be a JSON object, not {_shown(value)}")
        value_hint = args[1] if len(args) == 2 else Any
        return {key: _fit(item, value_hint, f"{where}[{key!r}]") for key, item in value.items()}
    if not isinstance(value, list):
        raise ArgumentMisfit(f"{where} must be a JSON list, not {_shown(value)}")
    if container is tuple and args and args[-1] is not Ellipsis:
        if len(value) != len(args):
            raise ArgumentMisfit(f"{where} must be a list of {len(args)} items, not {len(value)}")
        return tuple(_fit(item, hint, f"{where}[{i}]") for i, (item, hint) in enumerate(zip(value, args, strict=True)))
    item_hint = args[0] if args else Any
    items = [_fit(item, item_hint, f"{where}[{i}]") for i, item in enumerate(value)]
    return container(items) if container is not list else items


def _shown(value: Any) -> str:
    """``value`` as the model wrote it, short: its JSON kind and (cut) text."""
    kind = {str: "the string", bool: "the boolean", int: "the integer", float: "the number", list: "the list",
            dict: "the object", type(None): "null"}.get(type(value), type(value).__name__)  # fmt: skip
    if value is None:
        return kind
    text = repr(value) if not isinstance(value, (list, dict)) else f"of {len(value)} item(s)"
    return f"{kind} {text[:60]}"
