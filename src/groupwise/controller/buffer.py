"""`GroupBuffer`: reserved and finished prompt groups between the rollout pump and the train pump.

A *slot* is reserved when a prompt attempt is dispatched (unready) and becomes *ready* when its whole
group is committed. Slots are kept in dispatch (reserve) order; slot ids increase with it. Only whole
groups enter or leave. Start versions never decrease along dispatch order (the generator's version only
moves forward), which :meth:`GroupBuffer.reserve` checks.

Indexes (so selection and eviction never scan the whole buffer per call; cost per group stays flat):

* ready slots in dispatch order;
* ready slots bucketed by start version, and by target step (each bucket in dispatch order);
* counts of all slots (ready or not) per start version and per target step.

Each ordered set is a heap with lazy deletion: add/remove/pop-first are O(log n) amortised.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from groupwise.types import Group, LoaderItem, group_from_dict, group_to_dict


@dataclass(eq=False)
class Slot:
    """One dispatched prompt attempt: unready until its group is committed."""

    slot_id: int
    start_version: int
    target_step: int | None
    payload: LoaderItem | None = None  # the prompt the slot's attempt works on
    group: Group | None = None
    end_version: int | None = None

    @property
    def ready(self) -> bool:
        return self.group is not None


class _OrderedIds:
    """A set of ints that pops its smallest members first (a heap with lazy deletion)."""

    def __init__(self) -> None:
        self._members: set[int] = set()
        self._heap: list[int] = []

    def __len__(self) -> int:
        return len(self._members)

    def add(self, item: int) -> None:
        self._members.add(item)
        heapq.heappush(self._heap, item)

    def discard(self, item: int) -> None:
        self._members.discard(item)
        # Rebuild when stale entries dominate, so memory stays proportional to the live set.
        if len(self._heap) > 2 * len(self._members) + 64:
            self._heap = sorted(self._members)

    def pop_first(self, k: int) -> list[int]:
        """Remove and return the (up to) ``k`` smallest members, ascending."""
        out: list[int] = []
        while self._heap and len(out) < k:
            item = heapq.heappop(self._heap)
            if item in self._members:
                self._members.discard(item)
                out.append(item)
        return out

    def in_order(self) -> list[int]:
        """All members ascending (O(n log n); for state dicts and custom samplers, not hot paths)."""
        return sorted(self._members)


class _Buckets:
    """Ordered id sets keyed by an int (a version or a step), with the non-empty keys kept sorted."""

    def __init__(self) -> None:
        self._sets: dict[int, _OrderedIds] = {}
        self._keys: list[int] = []

    def add(self, key: int, item: int) -> None:
        ids = self._sets.get(key)
        if ids is None:
            ids = self._sets[key] = _OrderedIds()
            bisect.insort(self._keys, key)
        ids.add(item)

    def discard(self, key: int, item: int) -> None:
        ids = self._sets.get(key)
        if ids is None:
            return
        ids.discard(item)
        if not ids:
            del self._sets[key]
            del self._keys[bisect.bisect_left(self._keys, key)]

    def count(self, key: int) -> int:
        ids = self._sets.get(key)
        return len(ids) if ids is not None else 0

    def keys_between(self, low: int | None, high: int | None) -> list[int]:
        """Non-empty keys k with ``low <= k <= high`` ascending (None = unbounded)."""
        lo = 0 if low is None else bisect.bisect_left(self._keys, low)
        hi = len(self._keys) if high is None else bisect.bisect_right(self._keys, high)
        return self._keys[lo:hi]

    def pop_first(self, key: int, k: int) -> list[int]:
        ids = self._sets.get(key)
        if ids is None:
            return []
        out = ids.pop_first(k)
        if not ids:
            del self._sets[key]
            del self._keys[bisect.bisect_left(self._keys, key)]
        return out


class _Counts:
    """Counts per int key, with the non-zero keys kept sorted."""

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self._keys: list[int] = []

    def add(self, key: int) -> None:
        if key not in self._counts:
            self._counts[key] = 0
            bisect.insort(self._keys, key)
        self._counts[key] += 1

    def remove(self, key: int) -> None:
        self._counts[key] -= 1
        if self._counts[key] == 0:
            del self._counts[key]
            del self._keys[bisect.bisect_left(self._keys, key)]

    def get(self, key: int) -> int:
        return self._counts.get(key, 0)

    def first_between(self, low: int, high: int) -> int | None:
        i = bisect.bisect_left(self._keys, low)
        if i < len(self._keys) and self._keys[i] <= high:
            return self._keys[i]
        return None

    def items(self) -> list[tuple[int, int]]:
        return [(k, self._counts[k]) for k in self._keys]


class GroupBuffer:
    """Slots of prompt groups, in dispatch order, indexed for the samplers (see the module docstring)."""

    def __init__(self) -> None:
        self._slots: dict[int, Slot] = {}
        self._next_id = 0
        self._max_start_version = 0
        self._ready = _OrderedIds()
        self._ready_by_start = _Buckets()
        self._ready_by_target = _Buckets()
        self._all_by_start = _Counts()
        self._all_by_target = _Counts()

    # -- lifecycle ---------------------------------------------------------------------------------

    def reserve(self, start_version: int, target_step: int | None = None, payload: LoaderItem | None = None) -> int:
        """Append an unready slot for a dispatched attempt; return its id (dispatch order)."""
        return self._reserve(self._next_id, start_version, target_step, payload)

    def _reserve(self, slot_id: int, start_version: int, target_step: int | None, payload: LoaderItem | None) -> int:
        if start_version < 0:
            raise ValueError(f"reserve: start_version must be >= 0, got {start_version}")
        if start_version < self._max_start_version:
            raise ValueError(
                f"reserve(start_version={start_version}) after a slot with start_version "
                f"{self._max_start_version}: start versions must not decrease along dispatch order "
                "(pass the generator's current weight version)"
            )
        self._max_start_version = start_version
        self._next_id = slot_id + 1
        self._slots[slot_id] = Slot(slot_id, start_version, target_step, payload)
        self._all_by_start.add(start_version)
        if target_step is not None:
            self._all_by_target.add(target_step)
        return slot_id

    def commit(self, slot_id: int, group: Group, end_version: int) -> None:
        """Mark a reserved slot ready with its whole group."""
        slot = self._slot(slot_id, "commit")
        if slot.ready:
            raise ValueError(f"commit: slot {slot_id} is already ready; a slot holds exactly one group")
        slot.group = group
        slot.end_version = end_version
        self._ready.add(slot_id)
        self._ready_by_start.add(slot.start_version, slot_id)
        if slot.target_step is not None:
            self._ready_by_target.add(slot.target_step, slot_id)

    def remove(self, slot_id: int) -> Slot:
        """Drop a slot (failed, filtered or aborted attempt, or evicted group) and return it."""
        slot = self._slot(slot_id, "remove")
        del self._slots[slot_id]
        self._all_by_start.remove(slot.start_version)
        if slot.target_step is not None:
            self._all_by_target.remove(slot.target_step)
        if slot.ready:
            self._ready.discard(slot_id)
            self._ready_by_start.discard(slot.start_version, slot_id)
            if slot.target_step is not None:
                self._ready_by_target.discard(slot.target_step, slot_id)
        return slot

    def take(self, slot_ids: Iterable[int]) -> list[Slot]:
        """Remove ready slots (selection) and return them in the given order; all ids are checked first."""
        ids = list(slot_ids)
        for slot_id in ids:
            if not self._slot(slot_id, "take").ready:
                raise ValueError(f"take: slot {slot_id} is not ready; only finished groups can be taken")
        if len(set(ids)) != len(ids):
            raise ValueError(f"take: duplicate slot ids in {ids}")
        return [self.remove(slot_id) for slot_id in ids]

    def _slot(self, slot_id: int, op: str) -> Slot:
        slot = self._slots.get(slot_id)
        if slot is None:
            raise ValueError(f"{op}: unknown slot id {slot_id} (never reserved, or already removed)")
        return slot

    # -- queries -----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def next_slot_id(self) -> int:
        """The id the next reservation gets; every smaller id was reserved (or restored) at some point."""
        return self._next_id

    def get(self, slot_id: int) -> Slot:
        return self._slot(slot_id, "get")

    @property
    def ready_count(self) -> int:
        return len(self._ready)

    def count_for_target_step(self, target_step: int) -> int:
        """Slots stamped with ``target_step``, ready or not."""
        return self._all_by_target.get(target_step)

    def ready_count_for_target(self, target_step: int) -> int:
        return self._ready_by_target.count(target_step)

    def ready_count_with_start(self, start_version: int) -> int:
        return self._ready_by_start.count(start_version)

    def ready_start_versions(self, low: int | None = None, high: int | None = None) -> list[int]:
        """Start versions holding ready slots, ascending, within ``[low, high]``."""
        return self._ready_by_start.keys_between(low, high)

    def ready_targets(self, low: int | None = None, high: int | None = None) -> list[int]:
        """Target steps holding ready slots, ascending, within ``[low, high]``."""
        return self._ready_by_target.keys_between(low, high)

    def min_start_version_between(self, low: int, high: int) -> int | None:
        """The smallest start version of ANY slot (ready or not) within ``[low, high]``, or None."""
        return self._all_by_start.first_between(low, high)

    def slots_per_start_version(self) -> dict[int, tuple[int, int]]:
        """``{start_version: (ready, all)}``: what a stall report prints (a weight_fifo bucket that cannot fill)."""
        return {v: (self._ready_by_start.count(v), n) for v, n in self._all_by_start.items()}

    def ready_slot_ids(self) -> list[int]:
        """Every ready slot id in dispatch order (O(n log n): not for per-step hot paths)."""
        return self._ready.in_order()

    # -- selection helpers for samplers (remove and return, dispatch order within a bucket) --------

    def take_first_ready(self, k: int) -> list[Slot]:
        return self._take_ids(self._ready.pop_first(k))

    def take_first_ready_for_target(self, target_step: int, k: int) -> list[Slot]:
        return self._take_ids(self._ready_by_target.pop_first(target_step, k))

    def take_first_ready_with_start(self, start_version: int, k: int) -> list[Slot]:
        return self._take_ids(self._ready_by_start.pop_first(start_version, k))

    def _take_ids(self, ids: list[int]) -> list[Slot]:
        # The ids were already popped from one index; remove() discards them from the others.
        return [self.remove(slot_id) for slot_id in ids]

    def promote_ready_group(self, to_target_step: int) -> int | None:
        """Re-stamp one READY group from the furthest later target onto ``to_target_step``.

        Among ready slots stamped with a target ``> to_target_step``, the one with the largest target (most
        slack) is re-stamped; returns that lender step, or None when nothing can lend. Unready slots are
        never borrowed (they may be mid-commit and their step is not known to be covered).
        """
        targets = self._ready_by_target.keys_between(to_target_step + 1, None)
        if not targets:
            return None
        lender = targets[-1]
        (slot_id,) = self._ready_by_target.pop_first(lender, 1)
        slot = self._slots[slot_id]
        self._all_by_target.remove(lender)
        slot.target_step = to_target_step
        if slot.group is not None:
            slot.group.target_step = to_target_step
        self._all_by_target.add(to_target_step)
        self._ready_by_target.add(to_target_step, slot_id)
        return lender

    # -- checkpoint --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """READY groups only (in-flight attempts are not resumable), as JSON-able plain data."""
        groups = []
        for slot_id in self._ready.in_order():
            slot = self._slots[slot_id]
            assert slot.group is not None
            groups.append(
                {
                    "start_version": slot.start_version,
                    "end_version": slot.end_version,
                    "target_step": slot.target_step,
                    "group": group_to_dict(slot.group),
                }
            )
        return {"groups": groups, "next_slot_id": self._next_id}

    def load_state_dict(
        self, state: dict[str, Any], inflight: Iterable[tuple[int, int, int | None, LoaderItem | None]] = ()
    ) -> list[int]:
        """Restore the saved ready groups into an empty buffer; return their slot ids.

        A restored slot keeps its group id as slot id (group ids stay unique across a resume) and new
        reservations continue after the saved ``next_slot_id``. ``inflight`` holds ``(slot id, start version,
        target step, payload)`` of attempts that continue across the resume: they are reserved again (unready)
        in dispatch order among the ready groups.
        """
        if self._slots:
            raise ValueError(f"load_state_dict needs an empty buffer, this one holds {len(self._slots)} slots")
        if set(state) != {"groups", "next_slot_id"}:
            raise ValueError(f"buffer state must have exactly the keys ['groups', 'next_slot_id'], got {sorted(state)}")
        ids = []
        for entry in state["groups"]:
            missing = {"start_version", "end_version", "target_step", "group"} - set(entry)
            if missing:
                raise ValueError(f"buffer state group entry is missing {sorted(missing)}")
        pending = [(e["group"]["group_id"], e) for e in state["groups"]] + [(r[0], r) for r in inflight]
        for slot_id, entry in sorted(pending, key=lambda pair: pair[0]):
            if isinstance(entry, tuple):  # a reservation of an attempt that goes on
                self._reserve(slot_id, entry[1], entry[2], entry[3])
                continue
            group = group_from_dict(entry["group"])
            self._reserve(slot_id, entry["start_version"], entry["target_step"], None)
            self.commit(slot_id, group, entry["end_version"])
            ids.append(slot_id)
        self._next_id = max(self._next_id, int(state["next_slot_id"]))
        return ids
