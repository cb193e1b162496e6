"""When a simulated completion's tokens are produced: how many a failure had made, and under which weight versions.

A completion that starts on its slot at ``s`` spends ``prefill`` seconds on its prompt and then ``per_token``
seconds per token (both already scaled for a straggler), so its ``k``-th token (1-based) is produced at::

    τ_k = s + prefill + k · per_token

and by time ``T`` it has produced ``clamp(⌊(T − s − prefill) / per_token⌋, 0, L)`` of its ``L`` tokens (all of
them at ``s + prefill`` when ``per_token`` is 0). With partial rollouts a weight update reaches the completions in
flight when its sync ends: a token produced at or before a switch time belongs to the version before it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def tokens_by(time: float, start: float, prefill: float, per_token: float, length: int) -> int:
    """Tokens of an ``length``-token completion produced by ``time`` (see the module docstring)."""
    elapsed = time - start - prefill
    if elapsed < 0:
        return 0
    if per_token <= 0:
        return length
    return min(length, math.floor(elapsed / per_token))


def version_counts(
    start: float,
    prefill: float,
    per_token: float,
    length: int,
    base_version: int,
    switches: Sequence[tuple[float, int]],
) -> list[tuple[int, int]]:
    """``[(version, tokens), ...]`` of one completion, oldest version first, versions with no token left out.

    ``base_version`` produced the tokens before the first switch; ``switches`` are ``(time, new version)`` in time
    order, each the moment a weight update reached the generator.
    """
    counts: list[tuple[int, int]] = []
    version, made = base_version, 0
    for time, new_version in switches:
        upto = tokens_by(time, start, prefill, per_token, length)
        if upto > made:
            counts.append((version, upto - made))
            made = upto
        version = new_version
        if made == length:
            break
    if made < length:
        counts.append((version, length - made))
    return counts
