"""`weight_fifo`: each step is built from groups that share one start version.

Gated with W = ``max_staleness_versions``, also the selection window. ``t*`` is the smallest start
version of ANY slot (ready or in flight) inside ``[max(0, v − S), v]``; only ready groups with start version
``t*`` are eligible, so the sampler waits for the oldest version's bucket. This is why it cannot be combined
with dynamic sampling: a replacement lands in a newer bucket and the old one never fills.
"""

from __future__ import annotations

from groupwise.config.async_schema import WeightFifoSamplerConfig
from groupwise.controller.buffer import GroupBuffer, Slot
from groupwise.controller.samplers.base import GatedSampler, check_select_bounds


class WeightFifoSampler(GatedSampler):
    def __init__(self, buffer: GroupBuffer, config: WeightFifoSamplerConfig | None = None) -> None:
        super().__init__(buffer)
        self.window = (config or WeightFifoSamplerConfig()).max_staleness_versions

    def select(self, version: int, min_groups: int, max_groups: int) -> list[Slot] | None:
        check_select_bounds(min_groups, max_groups)
        oldest = self.buffer.min_start_version_between(self.window_low(version), version)
        if oldest is None or self.buffer.ready_count_with_start(oldest) < min_groups:
            return None
        return self.buffer.take_first_ready_with_start(oldest, max_groups)
