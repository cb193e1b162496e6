"""Staleness samplers: which prompt batches may be dispatched and which groups each step trains.

``build_sampler(name, knobs, buffer)`` builds one by name; see ``docs/samplers.md`` for the table.
"""

from __future__ import annotations

from typing import Any

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
    "SAMPLER_KNOBS",
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

#: The knobs each sampler accepts; any other knob is an error (no silent no-ops).
SAMPLER_KNOBS: dict[str, frozenset[str]] = {
    "in_order": frozenset({"max_lookahead_versions"}),
    "ready_first": frozenset({"max_staleness_versions"}),
    "windowed": frozenset({"max_staleness_versions", "sample_freshest_first"}),
    "weight_fifo": frozenset({"max_staleness_versions"}),
    "custom": frozenset({"target", "kwargs"}),
}


def build_sampler(name: str, knobs: dict[str, Any], buffer: GroupBuffer) -> Sampler:
    """Build the sampler ``name`` over ``buffer``; ``knobs`` are its config fields (without ``name``)."""
    if name not in SAMPLER_KNOBS:
        raise ValueError(f"unknown sampler {name!r}; choose one of {sorted(SAMPLER_KNOBS)}")
    foreign = sorted(set(knobs) - SAMPLER_KNOBS[name])
    if foreign:
        raise ValueError(
            f"sampler {name!r} does not use {foreign}; its knobs are {sorted(SAMPLER_KNOBS[name])} (remove the others)"
        )
    if name == "custom":
        if "target" not in knobs:
            raise ValueError("sampler 'custom' needs target: 'package.module:ClassName'")
        return load_custom_sampler(knobs["target"], buffer, knobs.get("kwargs") or {})
    return _BUILTIN[name](buffer, **knobs)
