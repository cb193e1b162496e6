"""``generation.vllm.engine_args`` checked against the engine arguments the installed vLLM takes, before any model
loads: vLLM passes them to its ``EngineArgs`` dataclass, which refuses an unknown name with a ``TypeError`` only
after the model has loaded (a minute or more, then a traceback).

The names are the fields of ``vllm.engine.arg_utils.EngineArgs`` and of its ``AsyncEngineArgs`` subclass (the
continuous-batching engine's), read from the installed vLLM: no list of ours to fall out of date with vLLM's.
Importing that module imports torch and much of vLLM (seconds), so it happens only when ``engine_args`` is set.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable

from groupwise.config import ConfigIssue

KEY = "generation.vllm.engine_args"


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
