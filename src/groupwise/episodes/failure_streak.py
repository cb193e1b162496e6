"""Failed episodes in a row, run-wide: past ``episode.max_consecutive_failures`` the run stops.

Every episode that fails (its environment raised, hung or answered nonsense; a harness session that failed),
retried or not, adds one; every episode that finishes sets the count back to 0. An environment, a sandbox or a
harness that is down fails every episode, so the count only grows: the run stops with
:class:`ConsecutiveEpisodeFailures`, naming the environment and the last errors, instead of failing prompt after
prompt (an outage must not burn the dataset as failures). The async controller stops at once on it, whatever its
failure budgets (:mod:`groupwise.controller.failures`); the sync loop stops as on any error of a generation round.
The count is not checkpointed: a resumed run starts at 0.
"""

from __future__ import annotations

import threading
from collections import deque

LAST_ERRORS = 3


class ConsecutiveEpisodeFailures(RuntimeError):
    """``episode.max_consecutive_failures`` episodes in a row failed (the message names what failed, and how)."""


class FailureStreak:
    """The run's count of failed episodes in a row (thread-safe: episodes end on many threads). ``limit`` 0 never
    stops; ``what`` names the failing party in the message (``environment 'python_sandbox'``)."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit, self.what = limit, what
        self.count = 0
        self._last: deque[str] = deque(maxlen=LAST_ERRORS)
        self._lock = threading.Lock()

    def failed(self, error: BaseException) -> None:
        """Count one failed episode; :class:`ConsecutiveEpisodeFailures` when it is the ``limit``-th in a row."""
        with self._lock:
            self.count += 1
            self._last.append(f"{type(error).__name__}: {error}")
            if not self.limit or self.count < self.limit:
                return
            last = "; ".join(f"({i}) {text}" for i, text in enumerate(self._last, start=1))
        raise ConsecutiveEpisodeFailures(
            f"{self.count} episodes in a row failed, none finishing between them (episode.max_consecutive_failures="
            f"{self.limit}): the {self.what} looks down, so the run stops instead of failing prompt after prompt. "
            f"The last errors: {last}. Fix the {self.what.split()[0]} and continue with --resume, or raise "
            "episode.max_consecutive_failures (0 never stops for this)"
        ) from error

    def finished(self) -> None:
        """An episode finished: the streak is over."""
        with self._lock:
            self.count = 0
            self._last.clear()
