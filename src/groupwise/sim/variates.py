"""`VariateStream`: the simulator's random numbers, drawn in blocks from one seeded generator.

One stream per run, seeded by ``derive_seed("sim-variates", run seed)``; draws are consumed in the order
the simulated engine asks for them. The controller's schedule is a deterministic function of the config
(asyncio runs ready callbacks first in, first out, and virtual time removes wall-clock jitter), so the same
config and seed give the same draws and the same run. Drawing blocks with numpy and handing out Python
floats costs about 0.1 µs per number, a small part of the per-group budget of a million-group simulation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

import numpy as np

from groupwise.seeding import derive_seed

BLOCK = 16384
Draw = TypeVar("Draw")


class DrawBuffer(Generic[Draw]):
    """Draws handed out ``count`` at a time from blocks of at least ``block`` made by one call of ``draw(n)``
    (what is left of a block comes first, so the order of the draws does not depend on the request sizes)."""

    def __init__(self, draw: Callable[[int], list[Draw]], block: int) -> None:
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        self._draw, self._block = draw, block
        self._values: list[Draw] = []
        self._at = 0

    def take(self, count: int) -> list[Draw]:
        if self._at + count > len(self._values):
            self._values = self._values[self._at :] + self._draw(max(self._block, count))
            self._at = 0
        out = self._values[self._at : self._at + count]
        self._at += count
        return out


class VariateStream:
    """Completion lengths ``max(1, round(median · exp(σ · z)))``, z ~ Normal(0, 1), and uniforms in [0, 1), from
    one seeded generator."""

    def __init__(self, seed: int, length_median: float, length_sigma: float, block: int = BLOCK) -> None:
        if not (length_median > 0 and length_sigma >= 0):
            raise ValueError(f"need length_median > 0 and length_sigma >= 0, got {length_median}, {length_sigma}")
        self._rng = np.random.default_rng(derive_seed("sim-variates", seed))
        self._median, self._sigma = length_median, length_sigma
        self._lengths = DrawBuffer(self._draw_lengths, block)
        self._uniforms = DrawBuffer(lambda n: self._rng.random(n).tolist(), block)

    def _draw_lengths(self, count: int) -> list[int]:
        z = self._rng.standard_normal(count)
        return np.maximum(1, np.rint(self._median * np.exp(self._sigma * z))).astype(np.int64).tolist()

    def lengths(self, count: int) -> list[int]:
        """The next ``count`` completion lengths in tokens (log-normal, at least 1)."""
        return self._lengths.take(count)

    def uniforms(self, count: int) -> list[float]:
        """The next ``count`` uniform draws in [0, 1)."""
        return self._uniforms.take(count)
