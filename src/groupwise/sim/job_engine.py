"""`JobEngine`: the rollout replicas of a job, their events in time order, and the groups they complete.

A group's G completions are spread over the replicas one by one, round robin (a load balancer in front of the
engines sends each sample to the next server). The engine is exact between external inputs: every call that
changes it (a group submitted or cancelled, a weight sync) first takes every replica event up to the current
time, in time order. Between inputs a *poll* takes the events due: at the next event, or ``poll_s`` after the
last poll when events come faster than that; a group whose last completion ended is handed back at the poll
that finds it, up to ``poll_s`` late (:func:`poll_seconds`: 16 decode steps), so a simulated group costs a
handful of timers, not one per completion.

It also keeps the accounting the meter and the summary read (the ``EngineSlots`` queries): sequence-slot seconds
busy, time with no sequence running or waiting anywhere, replica-seconds busy.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from typing import Any

from groupwise.sim.job_model import JobCosts, decode_step_seconds
from groupwise.sim.replica import DONE, FINISH_QUANTUM_STEPS, Replica, Sequence

#: Decode steps between polls when events are dense (the most a finished group waits to be handed back).
POLL_DECODE_STEPS = 16


def poll_seconds(job: JobCosts, median_tokens: float) -> float:
    """``POLL_DECODE_STEPS`` decode steps of a full replica at the median context."""
    context = job.max_seqs * (job.prompt_tokens + median_tokens / 2)
    return POLL_DECODE_STEPS * decode_step_seconds(job.max_seqs, context, job)


class Ticket:
    """One group in the engine: its future (set to the time its last completion ended) and its sequences."""

    __slots__ = ("future", "serial", "sequences", "pending", "prefilled", "occupied", "done_at")

    def __init__(self, future: asyncio.Future[float], serial: int) -> None:
        self.future = future
        self.serial = serial
        self.sequences: list[tuple[Replica, Sequence]] = []
        self.pending = 0
        self.prefilled: set[int] = set()  # replicas holding the prompt's KV (a shared prefix)
        self.occupied = 0.0  # sequence-seconds on replicas
        self.done_at = 0.0


class JobEngine:
    """Every replica of a job (see the module docstring)."""

    def __init__(self, job: JobCosts, poll_s: float, track_versions: bool,
                 finish_quantum: float = FINISH_QUANTUM_STEPS) -> None:
        if job.replicas < 1:
            raise ValueError(f"a job needs at least one rollout replica, got {job.replicas}")
        self.job = job
        self.poll_s = poll_s
        self.replicas = [Replica(i, job, track_versions, finish_quantum) for i in range(job.replicas)]
        self.num_slots = job.replicas * job.max_seqs
        self._events: list[tuple[float, int, int]] = []
        self._next = 0  # where the search for the least loaded replica starts
        self._tickets = 0
        self._busy = 0  # replicas with a sequence running or waiting
        self._idle_seconds = 0.0
        self._idle_since = 0.0
        self._poll: asyncio.TimerHandle | None = None
        self._poll_at = math.inf
        self._last_poll = -math.inf
        self._drained: list[asyncio.Future[None]] = []

    # -- inputs ----------------------------------------------------------------------------------------------

    def submit(self, lengths: list[int], now: float) -> Ticket:
        """Queue one group's completions on the least loaded replica (sequences running + waiting; the first such
        replica after the last one chosen) and admit what fits."""
        self.advance(now)
        self._tickets += 1
        ticket = Ticket(asyncio.get_running_loop().create_future(), self._tickets)
        replica = self._least_loaded()
        replica.move_to(now)
        was_busy = replica.busy
        prompt = self.job.prompt_tokens
        sequences = ticket.sequences
        for length in lengths:
            seq = Sequence(ticket, length, prompt)
            sequences.append((replica, seq))
            replica.waiting.append(seq)
        ticket.pending = len(lengths)
        replica.admit(now)
        self._changed(replica, was_busy, now)
        self._ensure_poll()
        return ticket

    def _least_loaded(self) -> Replica:
        replicas, n = self.replicas, len(self.replicas)
        best, best_load = self._next, math.inf
        for offset in range(n):
            i = (self._next + offset) % n
            r = replicas[i]
            load = r.running + len(r.waiting)
            if load < best_load:
                best, best_load = i, load
                if load == 0:
                    break
        self._next = (best + 1) % n
        return replicas[best]

    def cancel(self, ticket: Ticket, now: float) -> float:
        """Drop a cancelled group's completions; return the tokens they had made."""
        self.advance(now)
        tokens = 0.0
        touched: dict[int, bool] = {}
        for replica, seq in ticket.sequences:
            if seq.state == DONE:
                tokens += seq.length
                continue
            if replica.index not in touched:
                replica.move_to(now)
                touched[replica.index] = replica.busy
            tokens += replica.drop(seq)
            if seq in replica.waiting:
                replica.waiting.remove(seq)
        for index, was_busy in touched.items():
            replica = self.replicas[index]
            replica.admit(now)
            self._changed(replica, was_busy, now)
        return tokens

    def pause(self, now: float, seconds: float, version: int | None, reprefill: bool) -> None:
        """A weight sync reaching the replicas: each holds decoding ``seconds`` (plus, with ``reprefill``, a prefill
        of every running sequence's context, its KV cache being dropped); with ``version``, the tokens made from
        now on are of that version (partial rollouts)."""
        self.advance(now)
        job = self.job
        for replica in self.replicas:
            replica.move_to(now)
            extra = 0.0
            if reprefill and replica.running:
                total, squares = replica.running_context_squares()
                extra = (2.0 * job.active_params * total + 2.0 * job.layers * job.hidden * squares) / job.replica_flops
            replica.stall(now, seconds + extra)
            if version is not None:
                replica.add_switch(version)
            self._changed(replica, replica.busy, now)
        self._ensure_poll()

    async def drained(self) -> None:
        """Return once no sequence runs or waits anywhere (found at the poll after the last one finished)."""
        loop = asyncio.get_running_loop()
        self.advance(loop.time())
        if self._busy == 0:
            return
        future: asyncio.Future[None] = loop.create_future()
        self._drained.append(future)
        await future

    # -- events ----------------------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Take every replica event up to ``now``; hand back the groups that completed, in the order they did."""
        events, replicas = self._events, self.replicas
        if not events or events[0][0] > now:
            return
        done: list[tuple[Sequence, float]] = []
        changes: list[tuple[float, int]] = []
        while events and events[0][0] <= now:
            _, serial, index = heapq.heappop(events)
            replica = replicas[index]
            if serial != replica.event_serial:
                continue
            replica.run_until(now, done, changes)
            self._push(replica)
        for time, delta in sorted(changes):
            self._count(delta, time)
        completed: list[tuple[float, int, Ticket]] = []
        for seq, time in done:
            ticket = seq.ticket
            ticket.pending -= 1
            if ticket.pending == 0:
                ticket.done_at = time
                completed.append((time, ticket.serial, ticket))
        completed.sort(key=lambda item: item[:2])
        for _, _, ticket in completed:
            if not ticket.future.done():
                ticket.future.set_result(ticket.done_at)
        if self._busy == 0 and self._drained:
            for future in self._drained:
                if not future.done():
                    future.set_result(None)
            self._drained.clear()

    def _changed(self, replica: Replica, was_busy: bool, now: float) -> None:
        """After an input changed ``replica`` at ``now``: count a busy/idle change, refresh its next event."""
        if replica.busy != was_busy:
            self._count(1 if replica.busy else -1, now)
        replica.refresh()
        self._push(replica)

    def _push(self, replica: Replica) -> None:
        replica.event_serial += 1
        if replica.next_time < math.inf:
            heapq.heappush(self._events, (replica.next_time, replica.event_serial, replica.index))

    def _count(self, delta: int, time: float) -> None:
        if delta > 0:
            if self._busy == 0:
                self._idle_seconds += max(0.0, time - self._idle_since)
            self._busy += 1
        else:
            self._busy -= 1
            if self._busy == 0:
                self._idle_since = time

    def _ensure_poll(self) -> None:
        """A poll at the next event, or ``poll_s`` after the last poll if that is later (moved earlier when a new
        event comes before the poll already set)."""
        if not self._events:
            return
        loop = asyncio.get_running_loop()
        at = max(self._events[0][0], self._last_poll + self.poll_s, loop.time())
        if self._poll is not None:
            if at >= self._poll_at:
                return
            self._poll.cancel()
        self._poll, self._poll_at = loop.call_at(at, self._on_poll), at

    def _on_poll(self) -> None:
        self._poll, self._poll_at = None, math.inf
        now = asyncio.get_running_loop().time()
        self._last_poll = now
        self.advance(now)
        self._ensure_poll()

    # -- the queries of the meter and the summary (as ``EngineSlots``) ------------------------------------

    def engine_idle_seconds(self, t: float) -> float:
        """Seconds up to ``t`` with no sequence running or waiting on any replica."""
        self.advance(t)
        return self._idle_seconds + (max(0.0, t - self._idle_since) if self._busy == 0 else 0.0)

    def busy_slot_seconds(self, t: float) -> float:
        """Sequence-slot seconds occupied up to ``t``."""
        self.advance(t)
        return sum(r.seq_seconds + r.running * max(0.0, t - r.clock) for r in self.replicas)

    def replica_busy_seconds(self, t: float) -> float:
        """Replica-seconds with a sequence running or waiting, up to ``t``."""
        self.advance(t)
        return sum(r.busy_seconds + (max(0.0, t - r.clock) if r.busy else 0.0) for r in self.replicas)

    @property
    def preemptions(self) -> int:
        return sum(r.preemptions for r in self.replicas)

    def state(self) -> list[dict[str, Any]]:
        return [r.state_line() for r in self.replicas]

