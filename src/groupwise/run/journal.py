"""Append-only JSON-lines files (``metrics.jsonl``, ``fates.jsonl``, ``events.log``): the one writer and the one
reader.

:func:`append_line` writes each line with one ``os.write`` on an ``O_APPEND`` descriptor, so the line lands whole,
after everything already there. A process killed during a write can still leave a torn last line (no newline, not
valid JSON); :func:`read_json_lines` skips that line with a warning (one plain line on stderr through
:mod:`logging`, not a Python ``UserWarning`` with its source line). Any other unreadable line means the file is
corrupted and raises, naming the file and the line number. No torch import: the audit uses it.

Every run file is opened with :func:`open_run_file`, which never follows a symbolic link: a link planted in a run
directory (``fates.jsonl`` pointing at a file elsewhere) is refused instead of written through, so a run writes
only inside its directory (``groupwise train`` refuses a run directory holding a link before it starts:
:func:`groupwise.run.rundir.linked_entries`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)
_warned_torn: set[tuple[str, str]] = set()
"""The torn lines already reported, as ``(path, fragment)``."""


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
                if (str(path), piece) in _warned_torn:  # a command reading one file twice says it once
                    continue
                _warned_torn.add((str(path), piece))
                logger.warning("warning: %s: ignoring its torn last line %d (%d characters cut mid-write, e.g. by a "
                               "killed run)", path, number, len(piece))
                continue
            raise ValueError(f"{path} line {number} is not valid JSON ({err}); the file is corrupted") from err
        yield number, piece, value


class LinkedRunFileError(OSError):
    """A run file is a symbolic link: the run refuses to write through it (it could point anywhere)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(errno.ELOOP, f"{path} is a symbolic link; a run writes its files only inside its run "
                         "directory, never through a link: replace the link by a regular file, or remove it")
        self.path = Path(path)


def open_run_file(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags)`` that refuses (:class:`LinkedRunFileError`) when ``path`` is a symbolic link."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as err:
        if err.errno == errno.ELOOP and os.path.islink(path):
            raise LinkedRunFileError(path) from err
        raise


def write_run_file(path: str | Path, data: bytes) -> None:
    """Create or replace the contents of ``path`` with ``data``, never through a symbolic link."""
    fd = open_run_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def append_line(path: str | Path, text: str) -> None:
    """Append ``text`` (whole, newline-terminated lines) to ``path`` in one ``os.write`` (see the module docstring)."""
    data = text.encode("utf-8")
    fd = open_run_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        written = os.write(fd, data)
        while written < len(data):  # a short write is rare (signals, full disk); finish the line
            written += os.write(fd, data[written:])
    finally:
        os.close(fd)
