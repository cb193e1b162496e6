"""`in_order`: each admitted batch is stamped with the step that must train it.

Gated with W = ``max_lookahead_versions``; ``target_step = dispatch index``. Selection ignores weight
versions: step v takes only ready groups stamped v, in dispatch order. Eviction removes ready groups
stamped for a step the trainer has passed. With W = 0 this is the synchronous schedule.
"""

from __future__ import annotations

from groupwise.config.async_schema import InOrderSamplerConfig
from groupwise.controller.buffer import GroupBuffer, Slot
from groupwise.controller.samplers.base import GatedSampler, check_select_bounds


class InOrderSampler(GatedSampler):
    stamps_target_steps = True
    # Declared explicitly (they equal the gated defaults): pool on, no short close, a lost group shrinks its
    # stamped step.
    uses_replacement_pool = True
    closes_short_at_exhaustion = False

    def __init__(self, buffer: GroupBuffer, config: InOrderSamplerConfig | None = None) -> None:
        super().__init__(buffer)
        self.window = (config or InOrderSamplerConfig()).max_lookahead_versions

    def select(self, version: int, min_groups: int, max_groups: int) -> list[Slot] | None:
        check_select_bounds(min_groups, max_groups)
        if self.buffer.ready_count_for_target(version) < min_groups:
            return None
        return self.buffer.take_first_ready_for_target(version, max_groups)

    def evict(self, version: int) -> list[Slot]:
        evicted: list[Slot] = []
        for target in self.buffer.ready_targets(None, version - 1):
            evicted.extend(self.buffer.take_first_ready_for_target(target, self.buffer.ready_count_for_target(target)))
        return evicted

    def charge_step_for_lost_group(self, target_step: int | None, assembling_step: int) -> int | None:
        return target_step if target_step is not None else assembling_step
