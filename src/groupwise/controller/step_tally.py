"""Per-step reward tallies for the async controller, built on ``groupwise.algo.tally``.

Tally rule: a finished group (kept or filtered) counts toward its ``target_step`` when stamped and that
step is still open; a stamped group whose step already closed counts toward the step being assembled and
is reported in ``ds/late_tallied_groups``; an unstamped group counts toward the step being assembled when it
finished (approximate by design: it may train in a later step, or be evicted). Trained groups count
toward the step that trains them. Tallies are emitted and dropped when their step closes. The open steps'
tallies are part of an async checkpoint, so a resumed step's metrics include what was generated before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from groupwise.algo.filter import GroupFilter
from groupwise.algo.tally import StepTally
from groupwise.controller.ledger import StepLedger
from groupwise.types import Group


class StepTallyBook:
    """One :class:`StepTally` per open step, keyed by the rule in the module docstring."""

    def __init__(self, ledger: StepLedger, group_filter: GroupFilter) -> None:
        self._ledger = ledger
        self._filter = group_filter
        self._tallies: dict[int, StepTally] = {}
        self._late: dict[int, int] = {}

    def tally(self, step: int) -> StepTally:
        tally = self._tallies.get(step)
        if tally is None:
            tally = self._tallies[step] = StepTally()
        return tally

    def record_generated(self, group: Group) -> tuple[int, bool]:
        """Decide a finished group with the run's filter and tally it; return (step tallied, dropped by the
        filter). The decision is made here once; the dispatch slot acts on it and writes the fate from it."""
        step = self._ledger.assembling
        if group.target_step is not None:
            if self._ledger.is_closed(group.target_step):
                self._late[step] = self._late.get(step, 0) + 1
            else:
                step = group.target_step
        decision = self._filter.decide(group.raw_rewards)
        self.tally(step).record_generated(group, decision.kind, filtered=decision.dropped)
        return step, decision.dropped

    def record_trained(self, step: int, groups: Sequence[Group]) -> None:
        self.tally(step).record_trained(groups)

    def state_dict(self) -> dict[str, Any]:
        """Open steps' tallies and late counts as JSON-able data (lists of ``[step, value]`` pairs)."""
        return {
            "tallies": [[step, asdict(tally)] for step, tally in sorted(self._tallies.items())],
            "late": [[step, n] for step, n in sorted(self._late.items())],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._tallies = {int(step): StepTally(**data) for step, data in state["tallies"]}
        self._late = {int(step): int(n) for step, n in state["late"]}

    def pop_metrics(self, step: int) -> dict[str, float]:
        """The step's tally metrics plus ``ds/late_tallied_groups``; forgets the step.

        ``ds/gen_rounds`` is dropped: async mode has no generation rounds, and a 0 there would read as "no
        generation happened"."""
        metrics = self._tallies.pop(step, StepTally()).metrics()
        metrics.pop("ds/gen_rounds", None)
        metrics["ds/late_tallied_groups"] = float(self._late.pop(step, 0))
        return metrics
