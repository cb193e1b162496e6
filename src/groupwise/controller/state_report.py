"""One line that says where a controller stands: what a stall error or the runtime's watchdog writes.

Trainer version, the sampler's dispatch index and gate window, dispatch slots in flight, the buffer (length, and
ready / reserved slots per start version), the spare pool, the assembling step's open slots, buffer capacity, and
whether the rollout pump is parked at the gate or on capacity or has run out of data.
"""

from __future__ import annotations

from typing import Any


def describe_state(ctx: Any, rollout_pump: Any) -> str:
    """The state line of a controller's :class:`~groupwise.controller.context.PumpContext` and rollout pump."""
    buckets = {v: f"{ready} ready/{n} slots" for v, (ready, n) in ctx.buffer.slots_per_start_version().items()}
    step = ctx.ledger.assembling
    parked = "gate" if rollout_pump.parked() and ctx.clock.waiting else "capacity" if ctx.capacity.waiting else "no"
    return (
        f"trainer_v={ctx.clock.value} dispatch_index={getattr(ctx.sampler, 'dispatch_index', '?')} "
        f"gate_window={getattr(ctx.sampler, 'window', '?')} inflight={rollout_pump.active_slots} "
        f"buffer_len={len(ctx.buffer)} per_start_weight={buckets} spare_pool={len(ctx.spare_pool)} "
        f"open_slots={ctx.ledger.open_slots(step)} (step {step}) capacity={ctx.capacity.in_use}/{ctx.capacity.total} "
        f"rollout_pump_parked={parked} data_exhausted={rollout_pump.exhausted}"
    )
