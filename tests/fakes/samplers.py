"""Custom samplers for tests, loaded through ``target: "fakes.samplers:ClassName"``."""

from __future__ import annotations

from groupwise.controller.buffer import GroupBuffer, Slot
from groupwise.controller.clock import VersionClock
from groupwise.controller.samplers.base import check_select_bounds


class PlainReadyFirst:
    """A gated, non-stamping sampler that does NOT implement DropAccountingSampler (gets the defaults)."""

    def __init__(self, buffer: GroupBuffer, window: int = 1) -> None:
        self.buffer = buffer
        self.window = window
        self.dispatch_index = -1

    async def admit(self, clock: VersionClock) -> int | None:
        await clock.wait_until(lambda v: self.dispatch_index < v + self.window)
        self.dispatch_index += 1
        return None

    def select(self, version: int, min_groups: int, max_groups: int) -> list[Slot] | None:
        check_select_bounds(min_groups, max_groups)
        if self.buffer.ready_count < min_groups:
            return None
        return self.buffer.take_first_ready(max_groups)

    def evict(self, version: int) -> list[Slot]:
        return []

    def should_abort_inflight(self, start_version: int, version: int) -> bool:
        return False

    def required_buffer_capacity(self, prompts_per_step: int) -> int | None:
        return prompts_per_step * (self.window + 1)

    def set_dispatch_index(self, resume_step: int) -> None:
        self.dispatch_index = resume_step - 1


class ChargeNextStepSampler(PlainReadyFirst):
    """Implements DropAccountingSampler with an explicit decision: every loss shrinks the NEXT step."""

    uses_replacement_pool = False
    closes_short_at_exhaustion = False

    def charge_step_for_lost_group(self, target_step: int | None, assembling_step: int) -> int | None:
        return assembling_step + 1


class MissingSelect:
    """Not a sampler: lacks select/evict (build must raise TypeError)."""

    def __init__(self, buffer: GroupBuffer) -> None:
        self.buffer = buffer

    async def admit(self, clock: VersionClock) -> int | None:
        return None


class HoardingSampler(PlainReadyFirst):
    """Ungated and never selects anything: at the end of data the train pump must raise, not hang."""

    async def admit(self, clock: VersionClock) -> int | None:
        self.dispatch_index += 1
        return None

    def select(self, version: int, min_groups: int, max_groups: int) -> list[Slot] | None:
        check_select_bounds(min_groups, max_groups)
        return None

    def required_buffer_capacity(self, prompts_per_step: int) -> int | None:
        return None


class GatedClosesShort(PlainReadyFirst):
    """Gated, keeps the spare pool, and closes its last step short at the end of data."""

    uses_replacement_pool = True
    closes_short_at_exhaustion = True

    def charge_step_for_lost_group(self, target_step: int | None, assembling_step: int) -> int | None:
        return assembling_step


class ChargeAnything(PlainReadyFirst):
    """Charges every loss to whatever ``charge`` says (2.5, "next", ...): the controller must refuse bad values."""

    uses_replacement_pool = False
    closes_short_at_exhaustion = False

    def __init__(self, buffer: GroupBuffer, window: int = 1, charge: object = None) -> None:
        super().__init__(buffer, window)
        self.charge = charge

    def charge_step_for_lost_group(self, target_step: int | None, assembling_step: int) -> object:
        return self.charge
