"""A write of the run that failed because the disk is full, told as such: what failed, what was kept, how to go on.

A full disk shows through the writers in different words: the errno (``ENOSPC``, ``EDQUOT``), torch's zip writer
(``[enforce fail at inline_container.cc:...] unexpected pos ...`` or ``file write failed``) and safetensors' Rust
I/O error text. :func:`is_disk_full` recognises each; :func:`disk_full_error` makes the message the run ends with.
"""

from __future__ import annotations

import errno
from pathlib import Path

from groupwise.run.checkpoint import latest_checkpoint
from groupwise.run.rundir import RunDir


class DiskFullError(RuntimeError):
    """A write of the run (a checkpoint, ``final/``) failed because the disk is full; says what was kept."""


_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_DISK_FULL_TEXTS = ("no space left on device", "disk quota exceeded", "unexpected pos", "file write failed",
                    "storagefull", "os error 28")


def is_disk_full(err: BaseException) -> bool:
    """Whether ``err`` (or an exception it was raised from) says the disk is full."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _DISK_FULL_ERRNOS:
            return True
        if any(text in str(current).lower() for text in _DISK_FULL_TEXTS):
            return True
        current = current.__cause__ or current.__context__
    return False


def disk_full_error(err: BaseException, what: str, run_dir: RunDir | str | Path) -> DiskFullError:
    """The error to raise when writing ``what`` failed on a full disk: the cause, the newest complete checkpoint
    (which the failed write never touches: pruning happens only after a save succeeds) and how to continue."""
    kept = latest_checkpoint(run_dir)
    cause = " ".join(f"{type(err).__name__}: {err}".split())
    if kept is None:
        then = "no complete checkpoint was kept, so after freeing space --resume starts the run again from step 0"
    else:
        then = f"kept {kept} (the newest complete checkpoint); free space, then run the same command with --resume"
    return DiskFullError(f"the disk is full: writing {what} failed ({cause}); nothing of it remains; {then}")
