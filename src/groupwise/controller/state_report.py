"""One line that says where a controller stands: what a stall error or the runtime's watchdog writes.

Trainer version, the sampler's dispatch index and gate window, dispatch slots in flight, the buffer (length, and
ready / reserved slots per start version), the spare pool, the assembling step's open slots, buffer capacity, and
whether the rollout pump is parked at the gate or on capacity or has run out of data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from groupwise.controller.samplers.base import CursorSampler, WindowedGate

if TYPE_CHECKING:
    from groupwise.controller.context import PumpContext
    from groupwise.controller.rollout_pump import RolloutPump


def describe_state(ctx: PumpContext, rollout_pump: RolloutPump) -> str:
    """The state line of a controller's :class:`~groupwise.controller.context.PumpContext` and rollout pump."""
    buckets = {v: f"{ready} ready/{n} slots" for v, (ready, n) in ctx.buffer.slots_per_start_version().items()}
    step = ctx.ledger.assembling
    parked = "gate" if rollout_pump.parked() and ctx.clock.waiting else "capacity" if ctx.capacity.waiting else "no"
    cursor = ctx.sampler.dispatch_index if isinstance(ctx.sampler, CursorSampler) else "?"
    window = ctx.sampler.window if isinstance(ctx.sampler, WindowedGate) else "?"
    return (
        f"trainer_v={ctx.clock.value} dispatch_index={cursor} gate_window={window} "
        f"inflight={rollout_pump.active_slots} "
        f"buffer_len={len(ctx.buffer)} per_start_weight={buckets} spare_pool={len(ctx.spare_pool)} "
        f"open_slots={ctx.ledger.open_slots(step)} (step {step}) capacity={ctx.capacity.in_use}/{ctx.capacity.total} "
        f"rollout_pump_parked={parked} data_exhausted={rollout_pump.exhausted}"
    )
