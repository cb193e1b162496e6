"""Reading append-only JSON-lines files that a killed process may have left mid-line.

``metrics.jsonl`` and ``fates.jsonl`` are appended one whole line per write. A process killed during a write can
leave a torn last line (no newline, not valid JSON); that line is skipped with a warning. Any other unreadable line
means the file is corrupted and raises, naming the file and the line number. No torch import: the audit uses it.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def read_json_lines(path: str | Path) -> Iterator[tuple[int, str, Any]]:
    """Yield ``(line number, raw text, parsed value)`` for every non-blank line, skipping a torn last line."""
    path = Path(path)
    pieces = path.read_text(encoding="utf-8").split("\n")
    for number, piece in enumerate(pieces, start=1):
        if not piece.strip():
            continue
        try:
            value = json.loads(piece)
        except json.JSONDecodeError as err:
            if number == len(pieces):  # after the last newline: a torn write
                warnings.warn(f"{path}: ignoring torn last line {number} ({err})", stacklevel=3)
                continue
            raise ValueError(f"{path} line {number} is not valid JSON ({err}); the file is corrupted") from err
        yield number, piece, value
