"""Staleness samplers: which prompt batches may be dispatched and which groups each step trains.

``build_sampler(config, buffer)`` builds one from its config section (``groupwise.config.async_schema``: the one
declaration of each sampler's knobs); see ``docs/samplers.md`` for the table.
"""

from __future__ import annotations

from groupwise.config.async_schema import CustomSamplerConfig, SamplerConfig
from groupwise.controller.buffer import GroupBuffer
from groupwise.controller.samplers.base import (
    BaseSampler,
    DropAccounting,
    DropAccountingSampler,
    GatedSampler,
    Sampler,
    drop_accounting,
)
from groupwise.controller.samplers.custom import load_custom_sampler
from groupwise.controller.samplers.in_order import InOrderSampler
from groupwise.controller.samplers.ready_first import ReadyFirstSampler
from groupwise.controller.samplers.weight_fifo import WeightFifoSampler
from groupwise.controller.samplers.windowed import WindowedSampler

__all__ = [
    "BaseSampler",
    "DropAccounting",
    "DropAccountingSampler",
    "GatedSampler",
    "InOrderSampler",
    "ReadyFirstSampler",
    "Sampler",
    "WeightFifoSampler",
    "WindowedSampler",
    "build_sampler",
    "drop_accounting",
]

_BUILTIN = {
    "in_order": InOrderSampler,
    "ready_first": ReadyFirstSampler,
    "windowed": WindowedSampler,
    "weight_fifo": WeightFifoSampler,
}

def build_sampler(config: SamplerConfig, buffer: GroupBuffer) -> Sampler:
    """Build the sampler that ``config`` (an ``async.sampler`` section) names, over ``buffer``."""
    if isinstance(config, CustomSamplerConfig):
        return load_custom_sampler(config.target, buffer, config.kwargs)
    return _BUILTIN[config.name](buffer, config)
