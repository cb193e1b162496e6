"""``generation.backend`` checked against the machine before any model loads: a plug-in factory imports and takes
one argument (what it does when called needs the loaded model: :mod:`groupwise.trainer.builder` reports a factory
that raises or returns no generator); ``vllm`` needs the vllm package, and ``generation.vllm.engine_args`` names its
engine takes.

vLLM passes ``engine_args`` to its ``EngineArgs`` dataclass, which refuses an unknown name with a ``TypeError`` only
after the model has loaded (a minute or more, then a traceback). The names are the fields of
``vllm.engine.arg_utils.EngineArgs`` and of its ``AsyncEngineArgs`` subclass (the continuous-batching engine's),
read from the installed vLLM: no list of ours to fall out of date with vLLM's. Importing that module imports torch
and much of vLLM (seconds), so it happens only when ``engine_args`` is set.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Iterable
from typing import TYPE_CHECKING

from groupwise.config import ConfigIssue
from groupwise.config.generation_schema import GENERATION_BACKENDS
from groupwise.optional_packages import VLLM_INSTALL_HINT, vllm_unavailable
from groupwise.plugins import PluginImportError, import_plugin

if TYPE_CHECKING:
    from groupwise.config import RunConfig

KEY = "generation.vllm.engine_args"


def backend_checks(cfg: RunConfig) -> tuple[list[ConfigIssue], list[ConfigIssue]]:
    """``(issues, warnings)`` of ``generation.backend`` (the module docstring); without vLLM the error about the
    missing package also says that ``engine_args`` could not be checked."""
    if cfg.generation.backend != "vllm":
        return _backend_issues(cfg), []
    engine_args = dict(cfg.generation.vllm.engine_args)
    missing = vllm_unavailable()
    if missing is not None:
        why = missing + (unchecked_note(engine_args) if engine_args else "")
        return [ConfigIssue("generation.backend", "vllm", why, VLLM_INSTALL_HINT)], []
    return engine_arg_checks(engine_args)


def _backend_issues(cfg: RunConfig) -> list[ConfigIssue]:
    """A plug-in ``generation.backend`` must import and be callable with one argument (what the call does needs
    the loaded model: the builder reports a factory that raises or returns no generator); the shipped backends
    are built with the model."""
    backend = cfg.generation.backend
    if backend in GENERATION_BACKENDS:
        return []
    try:
        factory = import_plugin(backend, "generation backend")
    except PluginImportError as exc:
        return [ConfigIssue("generation.backend", backend, str(exc), "name an importable 'package.module:function'")]
    fix = "name a function that takes a GeneratorSpec and returns a Generator"
    if not callable(factory):
        return [ConfigIssue("generation.backend", backend, f"it is a {type(factory).__name__}, not callable", fix)]
    try:
        inspect.signature(factory).bind(None)  # it is called with the GeneratorSpec alone
    except TypeError as exc:
        return [ConfigIssue("generation.backend", backend,
                            f"the factory cannot be called with one argument, the GeneratorSpec ({exc})", fix)]
    except ValueError:  # no signature to read (a builtin): the call after the model load will tell
        pass
    return []


def vllm_engine_arg_names() -> frozenset[str]:
    """The engine argument names of the installed vLLM; raises whatever importing vLLM raises."""
    from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs  # optional, heavy: only when asked

    return frozenset(f.name for cls in (EngineArgs, AsyncEngineArgs) for f in dataclasses.fields(cls))


def engine_arg_checks(engine_args: dict[str, object]) -> tuple[list[ConfigIssue], list[ConfigIssue]]:
    """``(issues, warnings)``: an issue per unknown name (with the closest known one), or a warning that the names
    could not be checked because vLLM does not import here. Only call this when vLLM is installed."""
    if not engine_args:
        return [], []
    try:
        known = vllm_engine_arg_names()
    except Exception as exc:  # a vLLM that is installed but does not import (a CUDA or torch mismatch, say)
        return [], [ConfigIssue(
            KEY, dict(engine_args), f"these names could not be checked: importing vLLM's EngineArgs failed "
            f"({type(exc).__name__}: {exc}); an unknown one will fail when the engine starts",
            "fix the vLLM install (scripts/install_vllm.sh), or check the names against vLLM's engine arguments",
        )]  # fmt: skip
    return [_unknown_issue(name, engine_args[name], known) for name in sorted(set(engine_args) - known)], []


def _unknown_issue(name: str, value: object, known: Iterable[str]) -> ConfigIssue:
    close = difflib.get_close_matches(name, sorted(known), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ConfigIssue(
        f"{KEY}.{name}", value, f"vLLM's engine takes no argument {name!r} (not a field of its EngineArgs)",
        f"{hint}remove it, or use a name `vllm serve --help` lists (with '_' for '-')",
    )


def unchecked_note(engine_args: dict[str, object]) -> str:
    """What is said about ``engine_args`` when vLLM is not installed at all."""
    return f"; {KEY} {sorted(engine_args)} could not be checked against vLLM's engine arguments without it either"
