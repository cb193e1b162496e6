"""The SHA-256 of a file, read in blocks: what checkpoints and the GGUF cache identify content by."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of ``path``'s bytes (read 1 MiB at a time: a model file never sits in memory twice)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
