"""Append-only JSON-lines files (``metrics.jsonl``, ``fates.jsonl``, ``events.log``): the one writer and the one
reader.

:func:`append_line` writes each line with one ``os.write`` on an ``O_APPEND`` descriptor, so the line lands whole,
after everything already there. A process killed during a write can still leave a torn last line (no newline, not
valid JSON); :func:`read_json_lines` skips that line with a warning. Any other unreadable line means the file is
corrupted and raises, naming the file and the line number. No torch import: the audit uses it.
"""

from __future__ import annotations

import json
import os
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


def append_line(path: str | Path, text: str) -> None:
    """Append ``text`` (whole, newline-terminated lines) to ``path`` in one ``os.write`` (see the module docstring)."""
    data = text.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = os.write(fd, data)
        while written < len(data):  # a short write is rare (signals, full disk); finish the line
            written += os.write(fd, data[written:])
    finally:
        os.close(fd)
