"""Every random source is owned and seeded from (run seed, identifiers): invariant 9 in docs/design.md."""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any printable parts: ``sha256("|".join(map(str, parts)))[:8]``.

    Stable across processes and Python versions (unlike ``hash``), so a prompt samples the same
    completions whatever batch, worker or run order it lands in.
    """
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def request_seed(run_seed: int, prompt_uid: str, attempt: int) -> int:
    """The seed of one generation request: ``derive_seed(run_seed, prompt_uid, attempt)``."""
    return derive_seed("request", run_seed, prompt_uid, attempt)
