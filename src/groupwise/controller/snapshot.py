"""Controller snapshots: what an async checkpoint saves of a running controller, and how a resumed run restores it.

Take a snapshot synchronously at a step boundary (inside ``on_step_end``: the step is closed, the next one has
selected nothing). It holds, as JSON-able data:

* ``step``, ``sampler``, ``prompts_per_step``, ``stamps`` (whether the sampler stamps target steps) and
  ``dispatch_index`` (the sampler's dispatch cursor; None when a custom sampler does not expose one);
* ``buffer`` — the READY groups with their start/end versions and stamps (they keep their group ids and, on
  resume, their capacity permits);
* ``spare_pool`` — the spares, led by those of a drain batch still waiting at the gate;
* ``inflight_prompts`` — prompts of a loader batch still waiting at the gate (back to the loader front);
* ``inflight_slots`` — unsettled dispatch slots: running attempts and admitted prompts waiting for a permit, each
  dispatched again on resume, first and under its stamp, with its attempt number, failure counts and replacements
  used (so seeds and budgets continue). A running attempt saves ``progress``, what the rollout client generated of
  it so far (``progress(group_id)``, opaque JSON-able data; None when the client keeps none): on resume that
  attempt *continues* — same group id and start version, reserved again in dispatch order, and the progress handed
  back to the client — under the same sampler and cursor. Otherwise its interrupted attempt gets a ``pending`` fate
  with resolution ``requeued`` and the prompt starts a new one;
* ``ledger`` (open steps' records), ``tally`` (open steps' reward tallies), ``budgets`` (run failure budgets),
  ``fates`` (fate counts) and ``counters`` (evicted, aborted, unused prompts, admitted batches, ...).

Restoring checks the step and P (a different P is refused: stamps, ledger entries and the floor are per-P). A
different sampler (or a stamping flag that changed) cannot take over stamps or ledger entries: the buffered groups
are dropped (fate ``evicted``, counted), the open ledger entries are dropped, every unsettled prompt goes back to
the loader front, and the sampler starts a fresh cursor — each with a note the runtime logs. The summary's
``steps_trained``, ``step_sizes`` and ``ledger_history`` cover this process only (from ``first_step``); every other
counter continues across the resume.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from groupwise.controller.dispatch_slot import SlotState
from groupwise.controller.failures import PromptAttempts
from groupwise.controller.fate_records import FateRecord
from groupwise.controller.interfaces import LoaderItem, ResumableRollouts
from groupwise.controller.samplers.base import CursorSampler, StampingSampler
from groupwise.types import group_from_dict

if TYPE_CHECKING:
    from groupwise.controller.context import PumpContext
    from groupwise.controller.interfaces import PromptSource
    from groupwise.controller.rollout_pump import RolloutPump
    from groupwise.controller.train_pump import TrainPump

STATE_FORMAT = 2
STATE_KEYS = frozenset({
    "format", "step", "sampler", "prompts_per_step", "stamps", "dispatch_index", "buffer", "spare_pool",
    "inflight_prompts", "inflight_slots", "ledger", "tally", "budgets", "fates", "counters",
})  # fmt: skip
_ROLLOUT_COUNTERS = ("admitted_batches", "unused_prompts", "groups_finished")
_TRAIN_COUNTERS = ("evicted_total", "aborted_total")

Encode = Callable[[LoaderItem], Any]  # Any: the item as JSON-like data
Decode = Callable[[Any], LoaderItem]  # Any: JSON-like data read from a checkpoint
Progress = Callable[[int], dict[str, Any] | None]  # a running attempt's saved progress, by group id


class ControllerParts(Protocol):
    """What a snapshot reads and restores: the pumps' shared context and the two pumps (a ``Controller``)."""

    ctx: PumpContext
    rollout_pump: RolloutPump
    train_pump: TrainPump


def sampler_stamps(sampler: object) -> bool:
    return isinstance(sampler, StampingSampler) and bool(sampler.stamps_target_steps)


def dispatch_cursor(sampler: object) -> int | None:
    """The sampler's dispatch cursor, or None when it keeps none (a resume then restarts it)."""
    return sampler.dispatch_index if isinstance(sampler, CursorSampler) else None


def take_snapshot(
    controller: ControllerParts, encode: Encode, progress: Progress | None = None
) -> dict[str, Any]:
    """A snapshot of ``controller`` (see the module docstring); ``encode`` turns a loader item into plain data,
    ``progress`` gives a running attempt's client-side progress by group id."""
    ctx, pump, train = controller.ctx, controller.rollout_pump, controller.train_pump
    slots, loader_items, spare_items = pump.unsettled()
    spare_pool = ctx.spare_pool.state_dict(encode)
    return {
        "format": STATE_FORMAT,
        "step": ctx.clock.value,
        "sampler": ctx.settings.sampler.name,
        "prompts_per_step": ctx.settings.prompts_per_step,
        "stamps": sampler_stamps(ctx.sampler),
        "dispatch_index": dispatch_cursor(ctx.sampler),
        "buffer": ctx.buffer.state_dict(),
        "spare_pool": {"items": [encode(item) for item in spare_items] + spare_pool["items"]},
        "inflight_prompts": [encode(item) for item in loader_items],
        "inflight_slots": [_slot_to_dict(slot, encode, progress) for slot in slots],
        "ledger": ctx.ledger.state_dict(),
        "tally": ctx.tally.state_dict(),
        "budgets": ctx.budgets.state_dict(),
        "fates": ctx.fates.state_dict(),
        "counters": {
            **{name: getattr(pump, name) for name in _ROLLOUT_COUNTERS},
            **{name: getattr(train, name) for name in _TRAIN_COUNTERS},
            "spare_pool_taken": ctx.spare_pool.taken,
        },
    }


def _slot_to_dict(slot: SlotState, encode: Encode, progress: Progress | None) -> dict[str, Any]:
    kept: dict[str, Any] | None
    if slot.progress is not None:  # restored to continue and not yet handed back to the client
        kept = slot.progress
    else:
        kept = progress(slot.group_id) if progress is not None and slot.group_id is not None else None
    return {
        "prompt": encode(slot.item),
        "target_step": slot.target,
        "attempt": slot.attempt,
        "infra_failures": slot.attempts.infra,
        "data_failures": slot.attempts.data,
        "replacements_used": slot.replacements_used,
        "group_id": slot.group_id,
        "start_version": slot.start_version,
        "progress": kept,
    }


def _slot_from_dict(data: dict[str, Any], decode: Decode) -> SlotState:
    return SlotState(
        item=decode(data["prompt"]),
        target=data["target_step"],
        attempt=int(data["attempt"]),
        attempts=PromptAttempts(infra=int(data["infra_failures"]), data=int(data["data_failures"])),
        replacements_used=int(data["replacements_used"]),
        group_id=data["group_id"],
        start_version=data["start_version"],
        progress=data.get("progress"),  # absent in checkpoints written before attempts could continue
    )


def restore_snapshot(
    controller: ControllerParts, loader: PromptSource, state: dict[str, Any], decode: Decode
) -> list[str]:
    """Put a snapshot back into a freshly built controller (restore the loader's own state first).

    Returns notes on anything dropped (to be logged).
    """
    ctx = controller.ctx
    if set(state) != STATE_KEYS:
        raise ValueError(
            f"controller state must have the keys {sorted(STATE_KEYS)}, got {sorted(state)}; the checkpoint was "
            "written by another groupwise version or is corrupted"
        )
    _check_compatible(controller, state)
    _restore_counters(controller, state)
    notes: list[str] = []
    same_sampler = state["sampler"] == ctx.settings.sampler.name and state["stamps"] == sampler_stamps(ctx.sampler)
    keeps_cursor = same_sampler and state["dispatch_index"] is not None
    slots = [_slot_from_dict(data, decode) for data in state["inflight_slots"]]
    resumable = isinstance(controller.rollout_pump.rollouts, ResumableRollouts)
    continuing = [s for s in slots if keeps_cursor and resumable and s.progress is not None and s.group_id is not None]
    continues = {id(slot) for slot in continuing}
    if same_sampler:
        _restore_buffer(controller, state["buffer"], continuing)
    else:
        notes += _drop_buffer(controller, state)
    ctx.spare_pool.load_state_dict(state["spare_pool"], decode)
    loader.push_front([decode(data) for data in state["inflight_prompts"]])
    for slot in slots:
        if slot.target is not None and slot.target < ctx.settings.start_step:
            raise ValueError(
                f"controller state holds an unsettled slot stamped for step {slot.target}, which closed before the "
                f"checkpoint's step {ctx.settings.start_step}; the checkpoint is corrupted"
            )
    dropped = [slot for slot in slots if slot.progress is not None and id(slot) not in continues]
    if dropped:
        notes.append(f"resume: {len(dropped)} in-flight attempt(s) start again instead of continuing: the sampler "
                     "changed or keeps no dispatch cursor, or the rollout client cannot continue "
                     "an attempt")  # fmt: skip
    _record_requeued(controller, [slot for slot in slots if id(slot) not in continues])
    if keeps_cursor:
        ctx.ledger.load_state_dict(state["ledger"])
        ctx.sampler.set_dispatch_index(int(state["dispatch_index"]) + 1)
        controller.rollout_pump.restore_unsettled(slots)
    else:
        loader.push_front([slot.item for slot in slots])
        if same_sampler:
            ctx.ledger.load_state_dict(state["ledger"])  # losses stay charged; prompts restart unstamped
        elif state["ledger"]["open"]:
            notes.append(
                f"resume: dropped {len(state['ledger']['open'])} open ledger step(s) {state['ledger']['open']} "
                "because the sampler changed (their charges belonged to the old sampler's steps)"
            )
    return notes


def _check_compatible(controller: ControllerParts, state: dict[str, Any]) -> None:
    settings = controller.ctx.settings
    if state["step"] != settings.start_step:
        raise ValueError(
            f"controller state is at step {state['step']} but settings.start_step is {settings.start_step}; "
            "resume with start_step equal to the checkpoint's step"
        )
    if state["prompts_per_step"] != settings.prompts_per_step:
        raise ValueError(
            f"the checkpoint was written with prompts_per_step (grpo.num_prompts_per_step) = "
            f"{state['prompts_per_step']} but this run has {settings.prompts_per_step}; its buffered groups, stamps "
            "and ledger entries are counted in steps of the old size. Resume with "
            f"grpo.num_prompts_per_step={state['prompts_per_step']}, or start a new run (another run.name)"
        )


def _restore_buffer(controller: ControllerParts, buffer_state: dict[str, Any], continuing: list[SlotState]) -> None:
    """The ready groups, and the reservations of attempts that continue, in dispatch order."""
    ctx = controller.ctx
    inflight = [(slot.group_id, slot.start_version, slot.target, slot.item) for slot in continuing
                if slot.group_id is not None and slot.start_version is not None]  # continuing slots have both
    restored = ctx.buffer.load_state_dict(buffer_state, inflight=inflight)
    if len(restored) > ctx.capacity.total:
        raise ValueError(
            f"the checkpoint buffers {len(restored)} groups but max_buffered_rollouts is {ctx.capacity.total}; "
            f"resume with max_buffered_rollouts >= {len(restored)}"
        )
    ctx.capacity.take_now(len(restored))  # restored groups keep their capacity permits


def _drop_buffer(controller: ControllerParts, state: dict[str, Any]) -> list[str]:
    """A new sampler cannot take over another sampler's buffer: every ready group is evicted, with a fate."""
    ctx = controller.ctx
    groups = state["buffer"]["groups"]
    reason = (
        f"dropped at resume: the checkpoint's sampler {state['sampler']!r} "
        f"(stamps={state['stamps']}) differs from this run's {ctx.settings.sampler.name!r}"
    )
    for entry in groups:
        group = group_from_dict(entry["group"])
        ctx.record_fate(
            FateRecord(
                group.group_id,
                group.prompt.uid,
                group.attempt,
                entry["start_version"],
                "evicted",
                ctx.settings.start_step,
                detail=reason,
                epoch=group.epoch,
                tokens=group.num_completion_tokens,
                gen_seconds=group.gen_seconds,
            )
        )
    # Group ids stay unique across the resume even though the groups are gone.
    ctx.buffer.load_state_dict({"groups": [], "next_slot_id": state["buffer"]["next_slot_id"]})
    controller.train_pump.evicted_total += len(groups)
    return [f"resume: {len(groups)} buffered group(s) {reason}; their fates are 'evicted'"] if groups else []


def _restore_counters(controller: ControllerParts, state: dict[str, Any]) -> None:
    ctx, pump, train = controller.ctx, controller.rollout_pump, controller.train_pump
    ctx.tally.load_state_dict(state["tally"])
    ctx.budgets.load_state_dict(state["budgets"])
    ctx.fates.load_state_dict(state["fates"])
    counters = state["counters"]
    for name in _ROLLOUT_COUNTERS:
        setattr(pump, name, int(counters[name]))
    for name in _TRAIN_COUNTERS:
        setattr(train, name, int(counters[name]))
    ctx.spare_pool.taken = int(counters["spare_pool_taken"])


def _record_requeued(controller: ControllerParts, slots: list[SlotState]) -> None:
    """The attempts that were running at the checkpoint end here; their prompts are dispatched again."""
    ctx = controller.ctx
    for slot in slots:
        if slot.group_id is None:
            continue  # no attempt was running (waiting for a permit, a backoff or a weight sync)
        ctx.record_fate(
            FateRecord(
                slot.group_id,
                slot.item.prompt.uid,
                slot.attempt,
                slot.start_version if slot.start_version is not None else ctx.settings.start_step,
                "pending",
                resolution="requeued",
                detail=f"in flight at the checkpoint of step {ctx.settings.start_step}; dispatched again on resume",
                epoch=slot.item.epoch,
            )
        )
        slot.group_id = slot.start_version = None  # that attempt is over; the slot starts a new one
        slot.progress = None
