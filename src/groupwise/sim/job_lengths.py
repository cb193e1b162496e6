"""Completion lengths of the job model, and the seeded draws the job generator consumes.

A completion generated under weight version ``v`` has length::

    L = min(max_tokens, max(1, round(m(v) · exp(σ · z)))),   z ~ Normal(0, 1),   σ = ln(p99/p50) / z₀.₉₉
    m(v) = m₀ + (m₁ − m₀) · min(1, v / drift_steps)

(``m₀ = median_tokens``, ``m₁ = final_median_tokens``, or ``m₀`` without drift): log-normal, truncated at the
engine's length cap as a real run's are, its median moving linearly with the policy's version over ``drift_steps``
(reasoning runs grow their responses). One numpy stream per run, seeded by ``derive_seed("sim-job-variates",
run seed)``, drawn in blocks as the engine asks.
"""

from __future__ import annotations

import math

import numpy as np

from groupwise.config.job_schema import JobLengthsSection
from groupwise.seeding import derive_seed
from groupwise.sim.variates import BLOCK, DrawBuffer
from groupwise.sim.workload import lognormal_sigma


class LengthModel:
    """:math:`L(z, v)` of the module docstring."""

    def __init__(self, lengths: JobLengthsSection) -> None:
        self.start = lengths.median_tokens
        self.end = lengths.final_median_tokens if lengths.final_median_tokens is not None else lengths.median_tokens
        self.drift_steps = lengths.drift_steps
        self.sigma = lognormal_sigma(lengths.p99_over_p50)
        self.max_tokens = lengths.max_tokens

    def median(self, version: int) -> float:
        """``m(v)``."""
        return self.start + (self.end - self.start) * min(1.0, version / self.drift_steps)

    def lengths(self, normals: list[float], version: int) -> list[int]:
        """One length per standard-normal draw, under weight version ``version``."""
        median, sigma, cap = self.median(version), self.sigma, self.max_tokens
        return [min(cap, max(1, round(median * math.exp(sigma * z)))) for z in normals]


class JobVariates:
    """Standard normals and uniforms in [0, 1) from one seeded generator, in blocks."""

    def __init__(self, seed: int, block: int = BLOCK) -> None:
        self._rng = np.random.default_rng(derive_seed("sim-job-variates", seed))
        self._normals = DrawBuffer(lambda n: self._rng.standard_normal(n).tolist(), block)
        self._uniforms = DrawBuffer(lambda n: self._rng.random(n).tolist(), block)

    def normals(self, count: int) -> list[float]:
        return self._normals.take(count)

    def uniforms(self, count: int) -> list[float]:
        return self._uniforms.take(count)
