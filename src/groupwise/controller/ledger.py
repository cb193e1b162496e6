"""`StepLedger`: which groups and which losses make up each RL step (invariant 5 in docs/design.md).

Per step ``s``: ``selected`` (groups handed to the trainer), ``charged`` (groups lost for good and
charged to ``s``), ``replaced`` and ``promoted`` (counters for metrics). The number of slots still open::

    open(s) = P − selected(s) − charged(s)

Selection is recorded synchronously at the moment groups are selected, so a loss can never be charged
against work already selected (the over-credit bug of docs/design.md). A *floating* loss (a sampler
that does not stamp) goes to the first step ``≥`` the one being assembled that still has an open slot; a
*pinned* loss (stamped, or an explicit custom decision) stays on its step. A step closes when
``selected + charged == P`` (asserted: a violation is a bug), or — for closes-short samplers at
exhaustion — with ``selected ≥ floor``, ``floor = ceil(P × min_step_batch_fraction)``.
An async checkpoint saves the open steps' records (:meth:`StepLedger.state_dict`); closed history is not
saved (metrics.jsonl holds it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from groupwise.algo.step_size import step_floor


class LedgerInvariantError(AssertionError):
    """The step ledger would stop balancing: a bug in the controller or a custom sampler."""


class StepBelowFloorError(RuntimeError):
    """Too many groups of one step were lost: its batch would fall below the configured floor."""


@dataclass
class StepRecord:
    """One step's accounting. ``unfilled`` is nonzero only for a step closed short at exhaustion."""

    step: int
    selected: int = 0
    charged: int = 0
    replaced: int = 0
    promoted: int = 0
    unfilled: int = 0
    closed: bool = False


class StepLedger:
    """Open steps' records, the step being assembled, and the closed steps' history."""

    def __init__(self, prompts_per_step: int, min_step_batch_fraction: float, first_step: int = 0) -> None:
        if prompts_per_step < 1:
            raise ValueError(f"prompts_per_step must be >= 1, got {prompts_per_step}")
        self.prompts_per_step = prompts_per_step
        self.fraction = min_step_batch_fraction
        self.floor = step_floor(prompts_per_step, min_step_batch_fraction)
        self.assembling = first_step
        self.late_losses = 0
        self._open: dict[int, StepRecord] = {}
        self.history: list[StepRecord] = []

    def record(self, step: int) -> StepRecord:
        """The live record of an open step (created on first use)."""
        if step < self.assembling:
            raise LedgerInvariantError(f"step {step} is already closed (assembling step {self.assembling})")
        rec = self._open.get(step)
        if rec is None:
            rec = self._open[step] = StepRecord(step)
        return rec

    def peek(self, step: int) -> StepRecord:
        """The record of ``step`` as it stands (a blank one if nothing happened to it), without creating it."""
        return self._open.get(step) or StepRecord(step)

    def open_slots(self, step: int) -> int:
        rec = self._open.get(step)
        return self.prompts_per_step if rec is None else self.prompts_per_step - rec.selected - rec.charged

    def is_closed(self, step: int) -> bool:
        return step < self.assembling

    def record_selected(self, step: int, num_groups: int) -> None:
        """Groups selected for ``step`` — call in the same synchronous block as ``sampler.select``."""
        if step != self.assembling:
            raise LedgerInvariantError(f"selected groups for step {step} while step {self.assembling} is assembling")
        if num_groups > self.open_slots(step):
            raise LedgerInvariantError(
                f"step {step}: selecting {num_groups} groups but only {self.open_slots(step)} slots are open"
            )
        self.record(step).selected += num_groups

    def charge_loss(self, step: int | None, *, pinned: bool) -> int | None:
        """Charge one group lost for good; return the step charged (None: nothing charged).

        ``pinned``: the loss belongs to ``step`` exactly (a stamp or an explicit custom decision); if that
        step already closed it is a late loss (counted, no effect). Otherwise the loss floats to the first
        step ``≥ max(step, assembling)`` with an open slot.
        """
        if step is None:
            return None
        if pinned:
            if self.is_closed(step):
                self.late_losses += 1
                return None
            if self.open_slots(step) <= 0:
                raise LedgerInvariantError(
                    f"a loss pinned to step {step} found no open slot (selected {self.record(step).selected}, "
                    f"charged {self.record(step).charged}, P {self.prompts_per_step}); a stamped step never has "
                    "more than P slots, so this is a bug in the controller or the sampler"
                )
            target = step
        else:
            target = max(step, self.assembling)
            while self.open_slots(target) <= 0:
                target += 1
        rec = self.record(target)
        if self.prompts_per_step - (rec.charged + 1) < self.floor:
            raise StepBelowFloorError(
                f"step {target} lost {rec.charged + 1} of its {self.prompts_per_step} prompt groups for good, "
                f"leaving {self.prompts_per_step - rec.charged - 1} < floor {self.floor} = "
                f"ceil({self.prompts_per_step} × min_step_batch_fraction {self.fraction}). Run-wide failure "
                "budgets cannot bound the losses of one step: lower min_step_batch_fraction, use "
                "on_dropped_prompt: replace with a larger replacement_reserve_prompts, or fix the failing rollouts"
            )
        rec.charged += 1
        return target

    def record_replaced(self, step: int) -> None:
        if not self.is_closed(step):
            self.record(step).replaced += 1

    def record_promoted(self, step: int) -> None:
        if not self.is_closed(step):
            self.record(step).promoted += 1

    def close(self, step: int) -> StepRecord:
        """Close the assembling step; ``selected + charged == P`` must hold."""
        rec = self._closing(step)
        if rec.selected + rec.charged != self.prompts_per_step:
            raise LedgerInvariantError(
                f"step {step} closing with selected {rec.selected} + charged {rec.charged} != P {self.prompts_per_step}"
            )
        return self._finish(rec)

    def close_short(self, step: int) -> StepRecord:
        """Close the assembling step at exhaustion (closes-short samplers) with ``selected ≥ floor``."""
        rec = self._closing(step)
        if rec.selected < self.floor:
            raise StepBelowFloorError(
                f"rollout exhausted with step {step} holding {rec.selected} prompt groups, below the floor "
                f"{self.floor} = ceil({self.prompts_per_step} × min_step_batch_fraction {self.fraction}); the "
                "last step cannot close short"
            )
        rec.unfilled = self.prompts_per_step - rec.selected - rec.charged
        return self._finish(rec)

    def _closing(self, step: int) -> StepRecord:
        if step != self.assembling:
            raise LedgerInvariantError(f"closing step {step} while step {self.assembling} is assembling")
        return self.record(step)

    def _finish(self, rec: StepRecord) -> StepRecord:
        rec.closed = True
        del self._open[rec.step]
        self.history.append(rec)
        self.assembling = rec.step + 1
        return rec

    def pending(self) -> list[StepRecord]:
        """Records of steps not closed yet (e.g. losses floated beyond the last trained step)."""
        return [self._open[s] for s in sorted(self._open) if self._open[s].selected or self._open[s].charged]

    def state_dict(self) -> dict[str, Any]:
        """The step being assembled, the late-loss count and every open step's record, as JSON-able data."""
        return {
            "assembling": self.assembling,
            "late_losses": self.late_losses,
            "open": [asdict(self._open[step]) for step in sorted(self._open)],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` into a ledger built for the same P at the same first step."""
        if state["assembling"] != self.assembling:
            raise ValueError(
                f"ledger state is assembling step {state['assembling']} but this ledger starts at step "
                f"{self.assembling}; resume with start_step equal to the checkpoint's step"
            )
        records = [StepRecord(**entry) for entry in state["open"]]
        for rec in records:
            if rec.step < self.assembling or rec.closed or rec.selected + rec.charged > self.prompts_per_step:
                raise ValueError(
                    f"ledger state holds an impossible open step {rec} for P {self.prompts_per_step} at step "
                    f"{self.assembling}; the checkpoint is corrupted or was written for another prompts_per_step"
                )
        self._open = {rec.step: rec for rec in records}
        self.late_losses = int(state["late_losses"])

    def shortfalls(self) -> dict[int, int]:
        """``{step: charged}`` over closed and open steps with at least one charged loss."""
        out = {r.step: r.charged for r in self.history if r.charged}
        out.update({r.step: r.charged for r in self.pending() if r.charged})
        return out
