"""`windowed`: ungated production, selection inside a start-version window.

Admission never waits (only capacity and in-flight permits bound production). Step v selects ready groups
with ``max(0, v − S) ≤ start_version ≤ v``, in dispatch order or freshest first (ascending lag, then
dispatch order). Older ready groups are evicted; older in-flight attempts are aborted at weight sync.
Drop accounting: no spare pool, a lost group is charged to nobody (later groups make up for
it), and the last step may close short at exhaustion above the floor.
"""

from __future__ import annotations

from groupwise.config.async_schema import WindowedSamplerConfig
from groupwise.controller.buffer import GroupBuffer, Slot
from groupwise.controller.samplers.base import BaseSampler, check_select_bounds


class WindowedSampler(BaseSampler):
    uses_replacement_pool = False
    closes_short_at_exhaustion = True

    def __init__(self, buffer: GroupBuffer, config: WindowedSamplerConfig | None = None) -> None:
        super().__init__(buffer)
        config = config or WindowedSamplerConfig()
        self.window = config.max_staleness_versions
        self.sample_freshest_first = config.sample_freshest_first

    def select(self, version: int, min_groups: int, max_groups: int) -> list[Slot] | None:
        check_select_bounds(min_groups, max_groups)
        versions = self.buffer.ready_start_versions(self.window_low(version), version)
        if sum(self.buffer.ready_count_with_start(v) for v in versions) < min_groups:
            return None
        if self.sample_freshest_first:
            versions = versions[::-1]
        # Start versions never decrease along dispatch order, so ascending buckets are dispatch order.
        selected: list[Slot] = []
        for start in versions:
            selected.extend(self.buffer.take_first_ready_with_start(start, max_groups - len(selected)))
            if len(selected) == max_groups:
                break
        return selected

    def should_abort_inflight(self, start_version: int, version: int) -> bool:
        return start_version < self.window_low(version)

    def charge_step_for_lost_group(self, target_step: int | None, assembling_step: int) -> int | None:
        return None
