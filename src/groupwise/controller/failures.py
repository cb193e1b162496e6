"""Rollout failures: infra vs data classification, per-prompt attempt budgets, backoff, run budgets.

* **infra** — :class:`InfraError` subclasses, ``TimeoutError``, ``ConnectionError``, and any type a runtime
  registers (the Ray runtime registers Ray's actor/node errors) — retried with exponential backoff
  ``min(base · 2^(k−1), max)`` up to ``max_infra_attempts_per_prompt``.
* **data** — everything else (unknown errors are data so real bugs surface) — retried immediately up to
  ``max_data_attempts_per_prompt``.

Classification follows ``__cause__`` chains to depth 8. A tool's own infrastructure failure
(:class:`~groupwise.episodes.tools.ToolInfrastructureError`) is infra. An environment or harness that failed episode
after episode (:class:`~groupwise.episodes.failure_streak.ConsecutiveEpisodeFailures`, anywhere in the chain) is
neither: it stops the run at once, whatever the budgets. A prompt that exhausts its data budget is skipped
while fewer than ``max_skipped_prompts`` were skipped in the run, else the run fails. A prompt that
exhausts its infra budget is dropped while no more than ``max_consecutive_dropped_prompts`` were dropped in
a row (any committed or filtered group resets the streak), else the run fails. Filtered groups never
consume these budgets. Budgets are run-scoped: an async checkpoint saves them (:meth:`FailureBudgets.state_dict`)
so a resumed run keeps spending the same budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from groupwise.episodes.failure_streak import ConsecutiveEpisodeFailures
from groupwise.episodes.tools import ToolInfrastructureError

if TYPE_CHECKING:
    from groupwise.config import RolloutFailureSection

FailureKind = Literal["infra", "data"]
_CAUSE_DEPTH = 8


class InfraError(Exception):
    """Base for failures of the machinery (an engine, a worker, a network hop), not of the data."""


_infra_types: list[type[BaseException]] = [InfraError, TimeoutError, ConnectionError, ToolInfrastructureError]
_FATAL_TYPES: tuple[type[BaseException], ...] = (ConsecutiveEpisodeFailures,)  # every further attempt fails too


class RolloutDataFailure(RuntimeError):
    """A prompt failed with data errors beyond its budget and the run's skip budget is spent."""


class RolloutRedispatchExhausted(RuntimeError):
    """More prompts than ``max_consecutive_dropped_prompts`` were dropped in a row for infra failures."""


def register_infra_error_type(error_type: type[BaseException]) -> None:
    """Let a runtime declare one of its error types as infrastructure (e.g. a Ray actor-died error)."""
    if not (isinstance(error_type, type) and issubclass(error_type, BaseException)):
        raise TypeError(f"register_infra_error_type needs an exception class, got {error_type!r}")
    if error_type not in _infra_types:
        _infra_types.append(error_type)


def classify_failure(error: BaseException) -> FailureKind:
    """``infra`` if the error or any ``__cause__`` up to depth 8 is an infra type, else ``data``."""
    return "infra" if _in_chain(error, tuple(_infra_types)) else "data"


def _in_chain(error: BaseException, types: tuple[type[BaseException], ...]) -> bool:
    current: BaseException | None = error
    for _ in range(_CAUSE_DEPTH + 1):
        if current is None:
            break
        if isinstance(current, types):
            return True
        current = current.__cause__
    return False


def backoff_seconds(attempt: int, base_s: float, max_s: float) -> float:
    """``min(base · 2^(k−1), max)`` before retry ``k ≥ 1`` of an infra failure."""
    if attempt < 1:
        raise ValueError(f"backoff attempt numbers start at 1, got {attempt}")
    return min(base_s * 2.0 ** (attempt - 1), max_s)


@dataclass
class PromptAttempts:
    """One prompt's attempts so far, per kind."""

    infra: int = 0
    data: int = 0

    @property
    def total(self) -> int:
        return self.infra + self.data


class FailureBudgets:
    """Per-prompt retry decisions and the run-level skip / consecutive-drop budgets."""

    _COUNTERS = ("skipped", "consecutive_drops", "max_consecutive_seen", "infra_retries", "data_retries")

    def __init__(self, settings: RolloutFailureSection) -> None:
        if settings.max_backoff_s < settings.backoff_base_s:  # the config rules say so first, naming the keys
            raise ValueError(
                f"need backoff_base_s <= max_backoff_s, got {settings.backoff_base_s} and {settings.max_backoff_s}"
            )
        self.settings = settings
        self.skipped = 0
        self.consecutive_drops = 0
        self.max_consecutive_seen = 0
        self.infra_retries = 0
        self.data_retries = 0

    def on_failure(self, attempts: PromptAttempts, error: BaseException, context: str) -> float | None:
        """Count a failed attempt. Return the seconds to wait before a retry, or None to give up on the
        prompt (skipped within budget). Raise when a run-level budget is exceeded, and re-raise an error after
        which the run stops whatever the budgets (an environment failing episode after episode)."""
        if _in_chain(error, _FATAL_TYPES):
            raise error
        s = self.settings
        if classify_failure(error) == "infra":
            attempts.infra += 1
            if attempts.infra < s.max_infra_attempts_per_prompt:
                self.infra_retries += 1
                return backoff_seconds(attempts.infra, s.backoff_base_s, s.max_backoff_s)
            self.consecutive_drops += 1
            self.max_consecutive_seen = max(self.max_consecutive_seen, self.consecutive_drops)
            if self.consecutive_drops > s.max_consecutive_dropped_prompts:
                raise RolloutRedispatchExhausted(
                    f"{context}: infrastructure failures on {attempts.infra} attempts, and "
                    f"{self.consecutive_drops} prompts in a row were dropped, more than "
                    f"max_consecutive_dropped_prompts={s.max_consecutive_dropped_prompts}; the generation "
                    f"fleet looks down (last error: {error!r})"
                ) from error
            self.skipped += 1
            return None
        attempts.data += 1
        if attempts.data < s.max_data_attempts_per_prompt:
            self.data_retries += 1
            return 0.0
        if self.skipped >= s.max_skipped_prompts:
            if s.max_skipped_prompts == 0:
                raise error
            raise RolloutDataFailure(
                f"{context}: failed {attempts.data} times with data errors and {self.skipped} prompts were "
                f"already skipped (max_skipped_prompts={s.max_skipped_prompts}); last error: {error!r}"
            ) from error
        self.skipped += 1
        return None

    def state_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self._COUNTERS}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if set(state) != set(self._COUNTERS):
            raise ValueError(f"failure budget state must have the keys {list(self._COUNTERS)}, got {sorted(state)}")
        for name in self._COUNTERS:
            setattr(self, name, int(state[name]))

    def on_progress(self) -> None:
        """A group committed or was filtered: the fleet works, the consecutive-drop streak ends."""
        self.consecutive_drops = 0
