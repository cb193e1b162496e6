"""`VariateStream`: the simulator's random numbers, drawn in blocks from one seeded generator.

One stream per run, seeded by ``derive_seed("sim-variates", run seed)``; draws are consumed in the order
the simulated engine asks for them. The controller's schedule is a deterministic function of the config
(asyncio runs ready callbacks first in, first out, and virtual time removes wall-clock jitter), so the same
config and seed give the same draws and the same run. Drawing blocks with numpy and handing out Python
floats costs about 0.1 µs per number, a small part of the per-group budget of a million-group simulation.
"""

from __future__ import annotations

import numpy as np

from groupwise.seeding import derive_seed

BLOCK = 16384


class VariateStream:
    """Standard normals and uniforms in [0, 1) from one seeded generator."""

    def __init__(self, seed: int, block: int = BLOCK) -> None:
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        self._rng = np.random.default_rng(derive_seed("sim-variates", seed))
        self._block = block
        self._normals: list[float] = []
        self._uniforms: list[float] = []
        self._n = self._u = 0

    def normals(self, count: int) -> list[float]:
        """The next ``count`` standard normal draws."""
        if self._n + count > len(self._normals):
            self._normals = self._normals[self._n :] + self._rng.standard_normal(max(self._block, count)).tolist()
            self._n = 0
        out = self._normals[self._n : self._n + count]
        self._n += count
        return out

    def uniforms(self, count: int) -> list[float]:
        """The next ``count`` uniform draws in [0, 1)."""
        if self._u + count > len(self._uniforms):
            self._uniforms = self._uniforms[self._u :] + self._rng.random(max(self._block, count)).tolist()
            self._u = 0
        out = self._uniforms[self._u : self._u + count]
        self._u += count
        return out
