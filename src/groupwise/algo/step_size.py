"""The sizes derived from P: prompts per sync generation round, the fewest groups a step may train, and the buffer a
gated async sampler needs.

Both are ``ceil(P × factor)``. The product is rounded to 9 decimals before the ceiling, because float noise
would otherwise add one: 50 × 1.1 = 55.000000000000007 and 10 × 0.3 = 3.0000000000000004 in floats, so a bare
ceiling gives 56 and 4 where the configured arithmetic means 55 and 3. The sync loop, the async step ledger, the
config's derived values and every error message use these functions, so they cannot disagree.
"""

from __future__ import annotations

import math


def ceil_of_product(count: int, factor: float) -> int:
    """``ceil(count × factor)``, the product first rounded to 9 decimals (see the module docstring)."""
    return math.ceil(round(count * factor, 9))


def round_size(num_prompts_per_step: int, batch_multiplier: float, dynamic_sampling: bool) -> int:
    """Prompts per sync generation round: ``ceil(P × batch_multiplier)`` with dynamic sampling, else ``P``."""
    return ceil_of_product(num_prompts_per_step, batch_multiplier) if dynamic_sampling else num_prompts_per_step


def step_floor(num_prompts_per_step: int, min_step_batch_fraction: float) -> int:
    """The fewest groups a step may train: ``max(1, ceil(P × min_step_batch_fraction))`` (never an empty step)."""
    if not 0.0 < min_step_batch_fraction <= 1.0:
        raise ValueError(f"min_step_batch_fraction must be in (0, 1], got {min_step_batch_fraction}")
    return max(1, ceil_of_product(num_prompts_per_step, min_step_batch_fraction))


def gated_buffer_capacity(prompts_per_step: int, window: int) -> int:
    """The least ``max_buffered_rollouts`` a gated async sampler cannot deadlock with: ``P × (W + 1)``, the live
    step's batch plus the ``W`` batches admitted ahead of it (``W`` = the sampler's window)."""
    return prompts_per_step * (window + 1)
