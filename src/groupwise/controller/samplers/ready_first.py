"""`ready_first`: any finished group, oldest dispatch first, mixing weight versions.

Gated with W = ``max_staleness_versions`` (an admission window only). No stamps; selection takes every
ready group in dispatch order with no staleness bound; nothing is ever evicted. Drop accounting uses the
gated defaults: spare pool on, a lost group shrinks the step being assembled (or the next open one).
"""

from __future__ import annotations

from groupwise.config.async_schema import ReadyFirstSamplerConfig
from groupwise.controller.buffer import GroupBuffer, Slot
from groupwise.controller.samplers.base import GatedSampler, check_select_bounds


class ReadyFirstSampler(GatedSampler):
    def __init__(self, buffer: GroupBuffer, config: ReadyFirstSamplerConfig | None = None) -> None:
        super().__init__(buffer)
        self.window = (config or ReadyFirstSamplerConfig()).max_staleness_versions

    def select(self, version: int, min_groups: int, max_groups: int) -> list[Slot] | None:
        check_select_bounds(min_groups, max_groups)
        if self.buffer.ready_count < min_groups:
            return None
        return self.buffer.take_first_ready(max_groups)

    def evict(self, version: int) -> list[Slot]:
        return []
