"""Importing a user's plug-in named ``"package.module:attribute"``: a reward function, a sampler class, a task class.

One import rule for every plug-in, so each says what went wrong the same way: a malformed target, a module that
does not import (with the error it raised), or a missing attribute (a dotted path walks nested attributes). The
module may also be a Python file, ``path/to/file.py:attribute`` (relative to the working directory), for code that
is not on ``PYTHONPATH``; as for a script, its directory is put on ``sys.path`` so it can import its neighbours.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


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
        module = _from_file(module_name) if module_name.endswith(".py") else importlib.import_module(module_name)
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


def _from_file(path: str) -> ModuleType:
    """The Python file at ``path`` imported as a module (once: a second import returns the first)."""
    resolved = Path(path).expanduser().resolve()
    name = f"groupwise_plugin_{resolved.stem}_{hashlib.sha256(str(resolved).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    if not resolved.is_file():
        raise ImportError(f"{resolved} is not a file")
    if str(resolved.parent) not in sys.path:
        sys.path.append(str(resolved.parent))
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise ImportError(f"{resolved} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
