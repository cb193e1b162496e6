"""The target of a process that ``tests/test_parent_watch.py`` orphans (imports nothing heavy: starts fast)."""

from __future__ import annotations

import time


def watched_sleep(ready) -> None:
    """Watch the parent (as a learner rank does), say so, then sleep far longer than any test waits."""
    from groupwise.runtime.parent_watch import exit_with_parent

    ready.send(exit_with_parent())
    time.sleep(600)


def unwatched_sleep(ready) -> None:
    ready.send(False)
    time.sleep(600)
