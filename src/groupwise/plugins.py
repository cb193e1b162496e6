"""Importing a user's plug-in named ``"package.module:attribute"``: a reward function, a sampler class, a task class.

One import rule for every plug-in, so each says what went wrong the same way: a malformed target, a module that
does not import (with the error it raised), or a missing attribute (a dotted path walks nested attributes).
"""

from __future__ import annotations

import importlib


class PluginImportError(ValueError):
    """A ``module:attribute`` target that cannot be imported; the message names the target and the fix."""


def is_plugin_target(text: str) -> bool:
    """Whether ``text`` has the ``module:attribute`` form (both parts non-empty, one colon)."""
    return isinstance(text, str) and text.count(":") == 1 and all(text.split(":"))


def import_plugin(target: str, what: str) -> object:
    """The object ``target`` (``"package.module:attribute"``, the attribute possibly dotted) names; ``what`` says
    what it is for the message (e.g. ``"custom sampler target"``). Raises :class:`PluginImportError`."""
    if not is_plugin_target(target):
        raise PluginImportError(f"{what} must look like 'package.module:Name', got {target!r}")
    module_name, attribute = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # ImportError, or whatever the module raised while imported (sys.exit() too)
        raise PluginImportError(
            f"{what} {target!r}: cannot import module {module_name!r} ({type(exc).__name__}: {exc}); check the name "
            "and that it is on PYTHONPATH"
        ) from exc
    found: object = module
    for part in attribute.split("."):
        try:
            found = getattr(found, part)  # the plug-in's own name, given by the user: a lookup, not a probe
        except AttributeError:
            raise PluginImportError(
                f"{what} {target!r}: module {module_name!r} has no {attribute!r} (no attribute {part!r}); check the "
                "name"
            ) from None
    return found
