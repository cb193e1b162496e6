"""The sampler protocol, the shared base classes, and the optional drop-accounting hooks.

A sampler decides (``docs/samplers.md`` has the table):

* ``admit(clock)`` — rollout pump: wait until the next prompt batch may be dispatched; return the
  ``target_step`` stamp for it (or None). Gated samplers keep the dispatch index ``d`` below ``v + W``.
* ``select(v, min_groups, max_groups)`` — train pump, SYNCHRONOUS: remove and return up to ``max_groups``
  eligible ready slots, or None when fewer than ``min_groups`` are eligible (never waits to fill).
* ``evict(v)`` — remove and return ready slots that can never be selected.
* ``should_abort_inflight(start_version, v)`` — at weight sync: may an unfinished attempt be cancelled?
* ``required_buffer_capacity(P)`` — the ``max_buffered_rollouts`` that avoids a backpressure deadlock.
* ``set_dispatch_index(resume_step)`` — seed the dispatch cursor on resume.

``DropAccountingSampler`` is optional: a sampler that implements it says whether the controller keeps a
spare pool for it, whether its last step may close short at exhaustion, and which step a permanently
lost group is charged to. :func:`drop_accounting` gives the gated defaults otherwise.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from groupwise.algo.step_size import gated_buffer_capacity
from groupwise.controller.buffer import GroupBuffer, Slot
from groupwise.controller.clock import VersionClock


@runtime_checkable
class Sampler(Protocol):
    """What the controller needs from a staleness sampler (checked by member presence)."""

    async def admit(self, clock: VersionClock) -> int | None: ...

    def select(self, version: int, min_groups: int, max_groups: int) -> list[Slot] | None: ...

    def evict(self, version: int) -> list[Slot]: ...

    def should_abort_inflight(self, start_version: int, version: int) -> bool: ...

    def required_buffer_capacity(self, prompts_per_step: int) -> int | None: ...

    def set_dispatch_index(self, resume_step: int) -> None: ...


@runtime_checkable
class CursorSampler(Protocol):
    """Optional: a sampler whose dispatch cursor a checkpoint can save and a resume continue (every built-in one).
    A sampler that is not one restarts its cursor on resume, and in-flight attempts start again."""

    @property
    def dispatch_index(self) -> int: ...


@runtime_checkable
class StampingSampler(Protocol):
    """Optional: a sampler that says whether it stamps each admitted batch with the step it is for (``in_order``
    does); one that does not say stamps nothing."""

    @property
    def stamps_target_steps(self) -> bool: ...


@runtime_checkable
class WindowedGate(Protocol):
    """Optional: a sampler with a staleness window ``W`` (what a stall report shows as ``gate_window``)."""

    @property
    def window(self) -> int: ...


@runtime_checkable
class DropAccountingSampler(Protocol):
    """Optional hooks: how the controller accounts for groups lost for good."""

    uses_replacement_pool: bool
    closes_short_at_exhaustion: bool

    def charge_step_for_lost_group(self, target_step: int | None, assembling_step: int) -> int | None: ...


class SamplerProtocolError(TypeError):
    """A sampler returned something its protocol does not allow (a bug in a custom sampler)."""


def sampler_name(sampler: object) -> str:
    """``module:Class`` of a sampler, as a custom sampler's ``target`` names it."""
    cls = type(sampler)
    return f"{cls.__module__}:{cls.__qualname__}"


def checked_step(value: object, sampler: object, call: str, what: str = "a step number") -> int | None:
    """``value`` if it is an ``int`` ≥ 0 (not a bool) or None; else :class:`SamplerProtocolError` naming the
    sampler, the call that returned it and ``what`` it must return (a fate must never record step 2.5)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    raise SamplerProtocolError(
        f"sampler {sampler_name(sampler)} returned {value!r} ({type(value).__name__}) from {call}; it must return "
        f"{what} (an int >= 0) or None. Fix the sampler's return value"
    )


@dataclass(frozen=True)
class DropAccounting:
    """The drop-accounting behaviour the controller applies to one sampler."""

    uses_replacement_pool: bool
    closes_short_at_exhaustion: bool
    sampler: object

    def charge_step_for_lost_group(self, target_step: int | None, assembling_step: int) -> int | None:
        if isinstance(self.sampler, DropAccountingSampler):
            step = self.sampler.charge_step_for_lost_group(target_step, assembling_step)
            call = f"charge_step_for_lost_group(target_step={target_step}, assembling_step={assembling_step})"
            return checked_step(step, self.sampler, call)
        return default_charge_step(target_step, assembling_step)


def default_charge_step(target_step: int | None, assembling_step: int) -> int | None:
    """Gated default: a lost group shrinks its own stamped step, else the step being assembled."""
    return target_step if target_step is not None else assembling_step


def drop_accounting(sampler: object) -> DropAccounting:
    """The sampler's declared drop accounting, or the gated defaults (pool on, no short close)."""
    if isinstance(sampler, DropAccountingSampler):
        return DropAccounting(
            uses_replacement_pool=bool(sampler.uses_replacement_pool),
            closes_short_at_exhaustion=bool(sampler.closes_short_at_exhaustion),
            sampler=sampler,
        )
    return DropAccounting(uses_replacement_pool=True, closes_short_at_exhaustion=False, sampler=sampler)


def check_select_bounds(min_groups: int, max_groups: int) -> None:
    """``select`` needs ``1 <= min_groups <= max_groups``."""
    if min_groups < 1 or max_groups < min_groups:
        raise ValueError(
            f"select(min_groups={min_groups}, max_groups={max_groups}) needs 1 <= min_groups <= max_groups; "
            "ask for at least one group and no fewer than the minimum"
        )


class BaseSampler(ABC):
    """Shared behaviour: dispatch cursor, ungated admit, default eviction below a start-version window.
    Each sampler defines its own :meth:`select`."""

    window: int = 0
    stamps_target_steps = False

    def __init__(self, buffer: GroupBuffer) -> None:
        self.buffer = buffer
        self._dispatch_index = -1

    @property
    def dispatch_index(self) -> int:
        """Index of the last admitted batch (−1 before the first)."""
        return self._dispatch_index

    async def admit(self, clock: VersionClock) -> int | None:
        self._dispatch_index += 1
        return None

    @abstractmethod
    def select(self, version: int, min_groups: int, max_groups: int) -> list[Slot] | None:
        """The slots to train now (removed from the buffer), or None when fewer than ``min_groups`` qualify."""

    def window_low(self, version: int) -> int:
        """Oldest start version inside the window: ``max(0, v − window)``."""
        return max(0, version - self.window)

    def evict(self, version: int) -> list[Slot]:
        """Remove READY slots whose start version is below the window (unready ones may be mid-commit)."""
        low = self.window_low(version)
        evicted: list[Slot] = []
        for start in self.buffer.ready_start_versions(None, low - 1):
            evicted.extend(self.buffer.take_first_ready_with_start(start, self.buffer.ready_count_with_start(start)))
        return evicted

    def should_abort_inflight(self, start_version: int, version: int) -> bool:
        return False

    def required_buffer_capacity(self, prompts_per_step: int) -> int | None:
        return None

    def set_dispatch_index(self, resume_step: int) -> None:
        if resume_step < 0:
            raise ValueError(f"set_dispatch_index(resume_step={resume_step}): the resume step must be >= 0")
        self._dispatch_index = resume_step - 1


class GatedSampler(BaseSampler):
    """Admits batch ``d`` only once the trainer version ``v ≥ d − W``: at most ``W + 1`` batches ahead."""

    stamps_target_steps = False

    async def admit(self, clock: VersionClock) -> int | None:
        await clock.wait_until(self.admission_open)
        self._dispatch_index += 1
        return self._dispatch_index if self.stamps_target_steps else None

    def admission_open(self, version: int) -> bool:
        """The gate: the next batch may go when the last admitted index ``d < v + W``."""
        return self._dispatch_index < version + self.window

    def required_buffer_capacity(self, prompts_per_step: int) -> int | None:
        """The live batch plus W batches ahead must fit (:func:`~groupwise.algo.step_size.gated_buffer_capacity`)."""
        return gated_buffer_capacity(prompts_per_step, self.window)
