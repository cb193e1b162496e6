"""Load a script of ``bench/`` as a module, for the test tiers that run a benchmark's own code."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_bench_module(filename: str) -> ModuleType:
    """``bench/<filename>`` imported under the name ``groupwise_bench_<stem>``; ``bench/`` goes on ``sys.path``, as it
    is for a script run from there, so a benchmark can import its sibling modules."""
    if str(REPO / "bench") not in sys.path:
        sys.path.append(str(REPO / "bench"))
    name = f"groupwise_bench_{Path(filename).stem}"
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / filename)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module
