"""`PumpContext`: the state the rollout pump and the train pump share, and the few rules they both apply.

Everything here runs on one asyncio loop; a method that does not await is atomic with respect to the
other pump, which is what keeps selection, charging and the ledger consistent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from groupwise.controller.buffer import GroupBuffer
from groupwise.controller.clock import VersionClock
from groupwise.controller.failures import FailureBudgets
from groupwise.controller.fate_records import FateCounts, FateRecord
from groupwise.controller.ledger import StepLedger
from groupwise.controller.permits import Permits
from groupwise.controller.samplers import DropAccounting, Sampler
from groupwise.controller.settings import ControllerSettings
from groupwise.controller.spare_pool import SparePool
from groupwise.controller.step_tally import StepTallyBook
from groupwise.types import Group


@dataclass
class PumpContext:
    settings: ControllerSettings
    clock: VersionClock
    buffer: GroupBuffer
    sampler: Sampler
    accounting: DropAccounting
    ledger: StepLedger
    tally: StepTallyBook
    spare_pool: SparePool
    capacity: Permits
    budgets: FailureBudgets
    fates: FateCounts = field(default_factory=FateCounts)
    on_fate: Callable[[FateRecord], None] | None = None
    # A loader that skips prompts with no signal learns each generated group's outcome (``SkipsNoSignal.observe``).
    on_generated: Callable[[Group], None] | None = None
    generator_version: int = 0
    rollout_permitted: asyncio.Event = field(default_factory=asyncio.Event)
    progress: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        # The rollout pump parking on the gate or on capacity may be the last event of a stalled run: it must
        # wake the train pump, whose stall check runs only when it wakes (otherwise both wait forever).
        self.clock.on_park = self.signal
        self.capacity.on_park = self.signal

    def signal(self) -> None:
        """Something the train pump may be waiting for changed (a commit, a loss, the end of data)."""
        self.progress.set()

    def record_fate(self, record: FateRecord) -> None:
        self.fates.add(record)
        if self.on_fate is not None:
            self.on_fate(record)

    @property
    def replacement_enabled(self) -> bool:
        return self.settings.failure.on_dropped_prompt == "replace" and self.accounting.uses_replacement_pool

    def charge_loss(self, target_step: int | None) -> int | None:
        """Charge one group lost for good per the sampler's drop accounting; return the step charged.

        The sampler names a step (or None: charge nobody). A stamped group's own step, or any explicit step
        other than the assembling one, is pinned; "the assembling step" for an unstamped group floats to the
        first step with an open slot, so a loss never excuses work that is already selected.
        """
        assembling = self.ledger.assembling
        step = self.accounting.charge_step_for_lost_group(target_step, assembling)
        if step is None:
            return None
        pinned = (target_step is not None and step == target_step) or step != assembling
        charged = self.ledger.charge_loss(step, pinned=pinned)
        self.signal()
        return charged
