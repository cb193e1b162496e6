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
    """Completion lengths ``max(1, round(median · exp(σ · z)))``, z ~ Normal(0, 1), and uniforms in [0, 1), from
    one seeded generator."""

    def __init__(self, seed: int, length_median: float, length_sigma: float, block: int = BLOCK) -> None:
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        if not (length_median > 0 and length_sigma >= 0):
            raise ValueError(f"need length_median > 0 and length_sigma >= 0, got {length_median}, {length_sigma}")
        self._rng = np.random.default_rng(derive_seed("sim-variates", seed))
        self._block = block
        self._median, self._sigma = length_median, length_sigma
        self._lengths: list[int] = []
        self._uniforms: list[float] = []
        self._n = self._u = 0

    def lengths(self, count: int) -> list[int]:
        """The next ``count`` completion lengths in tokens (log-normal, at least 1)."""
        if self._n + count > len(self._lengths):
            z = self._rng.standard_normal(max(self._block, count))
            fresh = np.maximum(1, np.rint(self._median * np.exp(self._sigma * z))).astype(np.int64).tolist()
            self._lengths = self._lengths[self._n :] + fresh
            self._n = 0
        out = self._lengths[self._n : self._n + count]
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
