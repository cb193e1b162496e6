"""Step functions captured once and replayed: CUDA graphs on CUDA, plain calls everywhere else.

A decode step launches hundreds of small kernels; for the small models RL post-training samples from, the
launches, not the arithmetic, set the step time. A CUDA graph records the step's kernels once and replays them
with one launch. The price: a graph reads and writes the exact memory it was captured with, so every input is
a *static buffer* written in place before a replay, every output is copied into a static buffer inside the
step, no step may read a value back to the host (``.item()``) or make a shape depend on data, and every
tensor the step reads (weights included) must keep its storage for as long as the graph lives.

:class:`StepGraphs` holds one step per key (a row bucket and the sampling settings), captured on first use.
On CUDA it warms the step up on a side stream (lazy library initialisation must not happen during capture),
captures it into a memory pool shared by all of its graphs (they never run concurrently, so their
temporaries can share memory) and replays it. With ``use_graphs=False`` — any CPU model, and the check mode
on CUDA — a "capture" keeps the step function itself and a replay calls it: the same static buffers, the same
buckets, the same bound weights, only without the graph. That is how the CPU tests exercise this path. With
``compile_steps`` as well, a "capture" compiles the step with torch's compiler
(:mod:`groupwise.generation.compiled_step`) and a replay calls the compiled program; each compile's seconds are
logged with the total so far (:attr:`StepGraphs.compile_seconds`).

A step must be idempotent for a given state (running it twice in a row writes the same values), because the
warm-up and the first replay both run it. If a capture fails, the error is logged and every later step of
this object runs eagerly (a failed compile likewise); :attr:`fallback_reason` says why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

import torch

from groupwise.generation.compiled_step import compiled

if TYPE_CHECKING:
    from torch.cuda.graphs import _POOL_HANDLE  # torch names its pool handle type only privately

log = logging.getLogger(__name__)

Step = Callable[[], None]


class StepGraphs:
    """Captured steps by key, replayed with :meth:`run`; :meth:`reset` drops them all (their buffers moved)."""

    def __init__(self, use_graphs: bool, compile_steps: bool = False) -> None:
        self.use_graphs = use_graphs
        self.compile_steps = compile_steps and not use_graphs  # a CUDA graph already is one launch per step
        self.compile_seconds = 0.0  # time spent in the first call of each compiled step (compiling it)
        self.fallback_reason: str | None = None
        self.captures = 0  # how many steps were captured (each key once, again after a reset)
        self.resets = 0  # how many times the captured steps were dropped (their buffers or weights moved)
        self._steps: dict[Hashable, Callable[[], None]] = {}
        self._pool: _POOL_HANDLE | None = None  # the graphs' shared memory pool

    @property
    def keys(self) -> list[Hashable]:
        return list(self._steps)

    def reset(self) -> None:
        """Forget every captured step; the next :meth:`run` of each key captures it again."""
        if self._steps:
            self.resets += 1
        self._steps.clear()
        self._pool = None  # freed once no graph holds it

    def run(self, key: Hashable, build: Callable[[], Step]) -> None:
        """Run the step for ``key``: replay it, or first capture ``build()`` (then run it)."""
        replay = self._steps.get(key)
        if replay is None:
            replay = self._steps[key] = self._capture(key, build())
            self.captures += 1
        replay()

    def _capture(self, key: Hashable, step: Step) -> Callable[[], None]:
        if not self.use_graphs:
            return self._compiled(key, step) if self.compile_steps else step
        try:
            return self._cuda_graph(step)
        except Exception as error:  # any capture failure: the same step runs eagerly instead
            self.use_graphs = False
            self.fallback_reason = f"cuda graph capture failed: {type(error).__name__}: {error}"
            log.warning("%s; decode steps run eagerly from now on", self.fallback_reason)
            self.reset()
            return step

    def _compiled(self, key: Hashable, step: Step) -> Callable[[], None]:
        program = compiled(step)
        start = time.perf_counter()
        try:
            program()  # compiles now: a step run twice writes the same values (module docstring)
        except Exception as error:  # any compile failure: the same step runs eagerly instead
            self.compile_steps = False
            self.fallback_reason = f"torch.compile failed: {type(error).__name__}: {error}"
            log.warning("%s; decode steps run eagerly from now on", self.fallback_reason)
            return step
        seconds = time.perf_counter() - start
        self.compile_seconds += seconds
        log.info("decode step %s compiled in %.1f s (%.1f s compiling so far)", key, seconds, self.compile_seconds)
        return program

    def _cuda_graph(self, step: Step) -> Callable[[], None]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()  # warm-up: cuBLAS handles, workspaces and lazy kernels must exist before capture
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread of this process (the async runtime's learner) may use CUDA meanwhile.
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            step()
        return graph.replay
