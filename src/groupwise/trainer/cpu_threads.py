"""How many intra-op threads torch uses on the CPU, and how its idle OpenMP threads wait.

On a machine where another process keeps one core busy, torch's defaults slow a tiny model down many times
over: its OpenMP team has one thread per core, and at the end of every parallel region the threads spin
waiting for the one that shares the busy core. Two settings prevent that:

* **Wait policy.** ``OMP_WAIT_POLICY=PASSIVE``: a thread that waits for its team sleeps instead of spinning.
  libgomp (the OpenMP runtime torch ships) reads the variable once, when torch loads it, so
  :func:`prepare_openmp_environment` runs first thing in the ``groupwise`` command, before torch is imported.
  A value the user set for ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is kept.
* **Thread count** (:func:`choose_threads`). ``OMP_NUM_THREADS``, when set, is the user's choice and is kept.
  Otherwise a CPU model with fewer than :data:`SMALL_MODEL_PARAMETERS` parameters runs on one thread: its
  operations are too small to split (a second thread made the 1M-parameter default job's sampling about 1.25×
  faster on an idle 2-core machine, and whole steps slower whenever the other core was busy), and one thread
  never waits for a busy core. Larger CPU models keep torch's default, one thread per physical core.

The choice is written to the run's ``events.log``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

SMALL_MODEL_PARAMETERS = 5_000_000
WAIT_POLICY_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")

_wait_policy_note = "libgomp's default (groupwise did not set OMP_WAIT_POLICY)"


def prepare_openmp_environment(environ: MutableMapping[str, str] | None = None) -> str:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the user chose a wait policy or torch is already loaded.

    Returns (and remembers, for :func:`choose_threads`) a note saying which wait policy is in effect and why.
    """
    global _wait_policy_note
    environ = os.environ if environ is None else environ
    chosen = {name: environ[name] for name in WAIT_POLICY_VARIABLES if name in environ}
    if chosen:
        settings = ", ".join(f"{name}={value}" for name, value in chosen.items())
        _wait_policy_note = f"{settings} (from the environment)"
    elif "torch" in sys.modules:
        _wait_policy_note = "libgomp's default (torch was loaded before groupwise could set OMP_WAIT_POLICY)"
    else:
        environ["OMP_WAIT_POLICY"] = "PASSIVE"
        _wait_policy_note = "OMP_WAIT_POLICY=PASSIVE (set by groupwise: waiting threads sleep, never spin)"
    return _wait_policy_note


@dataclass(frozen=True)
class ThreadChoice:
    """The intra-op thread count for a run (None: leave torch's count as it is) and why."""

    threads: int | None
    reason: str

    def describe(self, current_threads: int) -> str:
        """The ``events.log`` line: the count in effect, why, and the wait policy."""
        return f"cpu threads: {current_threads} ({self.reason}); OpenMP wait policy: {_wait_policy_note}"


def choose_threads(num_parameters: int, device: str, environ: Mapping[str, str] | None = None) -> ThreadChoice:
    """The thread count for a model of ``num_parameters`` on ``device`` (pure: reads only ``environ``)."""
    environ = os.environ if environ is None else environ
    if "OMP_NUM_THREADS" in environ:
        return ThreadChoice(None, f"OMP_NUM_THREADS={environ['OMP_NUM_THREADS']} from the environment")
    if not device.startswith("cpu"):
        return ThreadChoice(None, f"model on {device}: torch's default for the CPU side")
    size = f"a {_count(num_parameters)}-parameter model"
    if num_parameters < SMALL_MODEL_PARAMETERS:
        return ThreadChoice(1, f"{size}, under {_count(SMALL_MODEL_PARAMETERS)}: one thread")
    return ThreadChoice(None, f"{size}: torch's default, one per physical core")


def _count(n: int) -> str:
    return f"{n / 1e6:.1f}M".replace(".0M", "M") if n >= 100_000 else f"{n / 1e3:.0f}k"


def apply_cpu_threads(model: Any) -> str:  # Any: a torch module; cli/commands.py passes Module | ModelWeights
    """Choose and set the intra-op threads for ``model`` (a torch module); returns the ``events.log`` line."""
    import torch

    num_parameters = sum(p.numel() for p in model.parameters())
    device = str(next(model.parameters()).device)
    choice = choose_threads(num_parameters, device)
    if choice.threads is not None:
        torch.set_num_threads(choice.threads)
    return choice.describe(torch.get_num_threads())
