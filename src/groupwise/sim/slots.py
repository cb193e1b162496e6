"""`EngineSlots`: the simulated engine's completion slots, scheduled first come, first served.

The engine has ``n`` slots; each completion occupies one slot for its duration. A request's completions
are booked when the request arrives, each on the slot that frees first::

    start = max(arrival, earliest free time),  end = start + duration

so requests queue when every slot is busy, as in an engine with continuous batching and a FIFO queue.
Booking at arrival keeps the cost to one heap operation per completion and one timer per request.

Busy-time accounting, exact at any query time ``t`` at or after the last booking. Bookings are made at
their arrival (≤ t), and a booking that starts after ``t`` starts where the previous one on its slot ends,
so the work booked beyond ``t`` on slot ``s`` is exactly ``max(0, free(s) − t)``::

    busy_slot_seconds(t) = Σ booked durations − Σ_s max(0, free(s) − t)
    engine_idle_seconds(t) = Σ gaps with no completion in progress + max(0, t − end of the last booking)

A cancelled request keeps its slots until its completions would have ended (the engine finishes and
discards them), and that wasted work counts as busy. :attr:`EngineSlots.all_done_at` is when every booked
completion will have ended (a weight sync that drains the engine waits for it).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


class EngineSlots:
    """``n`` completion slots with FIFO booking and exact busy/idle accounting (see the module docstring)."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"the engine needs at least one slot (sim.rollout_slots), got {num_slots}")
        self.num_slots = num_slots
        self._free_at = [0.0] * num_slots  # a min-heap: all-equal is a valid heap
        self.booked_seconds = 0.0
        self._busy_until = 0.0
        self._idle_gaps = 0.0
        self._last_booking = 0.0

    def book(self, arrival: float, durations: Sequence[float], starts: list[float] | None = None) -> float:
        """Book one request's completions at ``arrival``; return when its last completion ends. ``starts``, when
        given, receives each completion's start time (its slot's free time, or the arrival)."""
        if arrival < self._last_booking:
            raise ValueError(f"bookings must arrive in time order: {arrival} after {self._last_booking}")
        self._last_booking = arrival
        if arrival > self._busy_until:
            self._idle_gaps += arrival - self._busy_until
        free_at, replace = self._free_at, heapq.heapreplace
        end = arrival
        for duration in durations:
            start = free_at[0]
            if start < arrival:
                start = arrival
            finish = start + duration
            replace(free_at, finish)
            if starts is not None:
                starts.append(start)
            if finish > end:
                end = finish
        self.booked_seconds += sum(durations)
        if end > self._busy_until:
            self._busy_until = end
        return end

    @property
    def all_done_at(self) -> float:
        """When the last booked completion ends (the latest arrival, if that is later)."""
        return max(self._busy_until, self._last_booking)

    def busy_slot_seconds(self, t: float) -> float:
        """Slot-seconds of work done by time ``t`` (``t`` at or after the last booking)."""
        self._check_query(t)
        return self.booked_seconds - sum(f - t for f in self._free_at if f > t)

    def engine_idle_seconds(self, t: float) -> float:
        """Seconds up to ``t`` during which no completion was in progress on any slot."""
        self._check_query(t)
        return self._idle_gaps + max(0.0, t - self._busy_until)

    def _check_query(self, t: float) -> None:
        if t < self._last_booking:
            raise ValueError(f"busy time is exact only at or after the last booking ({self._last_booking}), not {t}")
