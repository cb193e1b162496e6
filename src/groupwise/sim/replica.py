"""`Replica`: one rollout replica (``tensor_parallel`` GPUs) decoding with continuous batching, as exact events.

The replica runs up to ``max_seqs`` sequences; each step gives every running sequence one token, in the time of
:func:`~groupwise.sim.job_model.decode_step_seconds` (integrated between events by :mod:`groupwise.sim.step_time`).
Its context is ``C = B·step + K`` (``B`` running, ``K = Σ (context at admission − admission step)``), so a finish,
an admission or a preemption changes ``B`` and ``K`` in O(1). Events:

* **finish** — a sequence has made its last token (a heap of finish steps, fixed at admission);
* **admission** — after every event, waiting sequences are admitted first in, first out while there is a free
  sequence slot and their context fits in the KV cache below a 1 % watermark (vLLM's rule); each admission costs a
  prefill (:func:`~groupwise.sim.job_model.prefill_seconds`: the prompt once per group and replica, as a prefix
  cache shares it, plus any tokens made before a preemption), during which the replica makes no decode step;
* **preemption** — when the running sequences' context fills the KV cache, the latest admitted sequence is
  preempted (vLLM's recompute mode): it goes back to the front of the queue and, readmitted, prefills its prompt
  and the tokens it had made. The only running sequence is never preempted (``sim.job`` is refused when one
  sequence cannot fit).

A stall (a prefill, a weight sync) holds decoding until ``ready_at``. :class:`~groupwise.sim.job_engine.JobEngine`
orders the events of every replica in time.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections import deque
from typing import TYPE_CHECKING, Any

from groupwise.sim.job_model import JobCosts, prefill_seconds
from groupwise.sim.step_time import steps_within

if TYPE_CHECKING:
    from groupwise.sim.job_engine import Ticket

WAITING, RUNNING, DONE, DROPPED = range(4)
#: Share of the KV cache kept free when admitting (vLLM's watermark), so a preempted sequence is not readmitted
#: at once into the space it just left.
KV_WATERMARK = 0.01
EPS = 1e-7  # steps: a finish scheduled at a step is taken when the replica reaches it within float error
#: Finishes within this many decode steps after the next one are taken together, at the last of them (each at most
#: this many steps late, as late as a poll): one event for several when a full replica finishes one every few steps.
FINISH_QUANTUM_STEPS = 16.0


class Sequence:
    """One completion of a group in the engine: its length, what it has made, where it is."""

    __slots__ = ("ticket", "length", "made", "state", "base", "admit_step", "finish_step", "serial", "admit_time",
                 "segments")  # fmt: skip

    def __init__(self, ticket: Ticket, length: int, prompt_tokens: int) -> None:
        self.ticket = ticket
        self.length = length
        self.made = 0.0  # tokens made before the current admission (preemptions, partial rollouts)
        self.state = WAITING
        self.base = float(prompt_tokens)  # context at admission: prompt + made
        self.admit_step = 0.0
        self.finish_step = 0.0
        self.serial = -1
        self.admit_time = 0.0
        self.segments: list[tuple[float, float]] = []  # (from step, to step) decoded, kept with partial rollouts


class Replica:
    """One replica's state and events (see the module docstring)."""

    def __init__(self, index: int, job: JobCosts, track_versions: bool,
                 finish_quantum: float = FINISH_QUANTUM_STEPS) -> None:
        self.index = index
        self.finish_quantum = finish_quantum
        self.job = job
        self.track_versions = track_versions
        self.step = 0.0
        self.clock = 0.0  # virtual time at which ``step`` holds
        self.ready_at = 0.0  # no decoding before this time (prefill, weight sync)
        self.running = 0
        self.k = 0.0
        self.waiting: deque[Sequence] = deque()
        self._finishes: list[tuple[float, int, Sequence]] = []
        self._admitted: list[Sequence] = []  # admission order, for preemption (finished ones skipped lazily)
        self._serial = 0
        self.switch_steps: list[float] = []  # steps at which a weight update reached this replica (partial rollouts)
        self.switch_versions: list[int] = []  # and the version it brought
        self.seq_seconds = 0.0  # ∫ B dt
        self.busy_seconds = 0.0  # time with a sequence running or waiting
        self.preemptions = 0
        self.event_serial = 0  # bumped whenever the next event is recomputed (the engine's heap entries go stale)
        self.next_time = math.inf
        self.next_step = math.inf
        # the per-step time's lines (see step_time.lines), as constants of this replica
        self._read0 = job.decode_overhead_s + job.weight_bytes / job.replica_bandwidth
        self._read_per_token = job.kv_bytes / job.replica_bandwidth
        self._compute0 = job.decode_overhead_s
        self._tp_per_seq = job.tp_seconds_per_sequence  # in both lines: the all-reduces add to either bound
        self._compute_per_seq = 2.0 * job.active_params / job.replica_flops
        self._compute_per_token = 4.0 * job.layers * job.hidden / job.replica_flops

    @property
    def context(self) -> float:
        return self.running * self.step + self.k

    @property
    def busy(self) -> bool:
        return self.running > 0 or bool(self.waiting)

    # -- time ------------------------------------------------------------------------------------------------

    def move_to(self, t: float) -> None:
        """Decode from ``clock`` to ``t`` with no event in between (the engine guarantees it)."""
        dt = t - self.clock
        if dt <= 0:
            return
        if self.running:
            self.seq_seconds += self.running * dt
            start = self.clock if self.clock > self.ready_at else self.ready_at
            if t > start:
                self.step += steps_within(t - start, self.running, self.context, self.job)
        if self.running or self.waiting:
            self.busy_seconds += dt
        self.clock = t

    def refresh(self) -> None:
        """Recompute the next event (``next_time``, ``next_step``): the next finish or KV-full preemption from
        the current state (``inf`` when nothing runs). Called after every change of state."""
        running = self.running
        if not running:
            self.next_time = self.next_step = math.inf
            return
        finishes = self._finishes
        while True:
            entry = finishes[0]
            if entry[2].state == RUNNING and entry[2].serial == entry[1]:
                break
            heapq.heappop(finishes)
        step = self.step
        target = entry[0] + self.finish_quantum
        context = running * step + self.k
        if running > 1:
            full = step + max(0.0, (self.job.kv_capacity - context) / running)
            if full < target:
                target = full
        start = self.clock if self.clock > self.ready_at else self.ready_at
        self.next_time = start + self._seconds(target - step, running, context)
        self.next_step = target

    def _seconds(self, steps: float, running: int, context: float) -> float:
        """:func:`~groupwise.sim.step_time.seconds_for`, inlined with this replica's constants (the hot path)."""
        if steps <= 0:
            return 0.0
        v1 = self._read0 + self._tp_per_seq * running + self._read_per_token * context
        s1 = self._read_per_token * running
        v2 = self._compute0 + (self._compute_per_seq + self._tp_per_seq) * running + self._compute_per_token * context
        s2 = self._compute_per_token * running
        if v2 > v1 or (v2 == v1 and s2 > s1):
            v1, s1, v2, s2 = v2, s2, v1, s1
        if s2 <= s1:
            return v1 * steps + 0.5 * s1 * steps * steps
        cross = (v1 - v2) / (s2 - s1)
        if steps <= cross:
            return v1 * steps + 0.5 * s1 * steps * steps
        rest = steps - cross
        return v1 * cross + 0.5 * s1 * cross * cross + (v2 + s2 * cross) * rest + 0.5 * s2 * rest * rest

    # -- events ----------------------------------------------------------------------------------------------

    def run_until(self, now: float, done: list[tuple[Sequence, float]], idle_changes: list[tuple[float, int]]) -> None:
        """Take this replica's events up to ``now`` in order: at each, finish what reached its last token (appended
        to ``done`` with the time), preempt if the KV cache is full, admit; a change between busy and idle is
        appended to ``idle_changes`` as ``(time, +1 | −1)``."""
        finishes, pop, track = self._finishes, heapq.heappop, self.track_versions
        while self.next_time <= now:
            t, step = self.next_time, self.next_step
            was_busy = self.running > 0 or bool(self.waiting)
            dt = t - self.clock
            if dt > 0:  # decode up to the event: its step is known, only the accounting moves
                self.seq_seconds += self.running * dt
                self.busy_seconds += dt
                self.clock = t
            if step > self.step:
                self.step = step
            reach = self.step + EPS
            while finishes and finishes[0][0] <= reach:
                _, serial, seq = pop(finishes)
                if seq.state != RUNNING or seq.serial != serial:
                    continue
                self.running -= 1
                self.k -= seq.base - seq.admit_step
                if track:
                    seq.segments.append((seq.admit_step, seq.finish_step))
                seq.made, seq.state = float(seq.length), DONE
                seq.ticket.occupied += t - seq.admit_time
                done.append((seq, t))
            if self.running > 1 and self.running * self.step + self.k >= self.job.kv_capacity - EPS:
                self._preempt_latest()
            if self.waiting:
                self.admit(t)
            if was_busy != (self.running > 0 or bool(self.waiting)):
                idle_changes.append((t, -1 if was_busy else 1))
            self.refresh()

    def _leave(self, seq: Sequence) -> None:
        self.running -= 1
        self.k -= seq.base - seq.admit_step
        if self.track_versions:
            seq.segments.append((seq.admit_step, min(self.step, seq.finish_step)))

    def _preempt_latest(self) -> None:
        while self._admitted:
            seq = self._admitted.pop()
            if seq.state == RUNNING:
                break
        else:
            return
        self._leave(seq)
        seq.made += self.step - seq.admit_step
        seq.base = self.job.prompt_tokens + seq.made
        seq.state = WAITING
        seq.ticket.occupied += self.clock - seq.admit_time
        self.waiting.appendleft(seq)
        self.preemptions += 1

    def admit(self, t: float) -> None:
        """Admit waiting sequences (first in, first out) while a slot is free and the KV cache has room."""
        job, waiting = self.job, self.waiting
        room = job.kv_capacity * (1.0 - KV_WATERMARK)
        max_seqs, step, push = job.max_seqs, self.step, heapq.heappush
        finishes, admitted = self._finishes, self._admitted
        stall = 0.0
        fresh: list[Sequence] = []
        while waiting and self.running < max_seqs:
            seq = waiting[0]
            if seq.state == DROPPED:
                waiting.popleft()
                continue
            if self.running and self.running * step + self.k + seq.base > room:
                break
            waiting.popleft()
            if seq.made or self.index not in seq.ticket.prefilled:
                stall += self._prefill(seq)
            self._serial += 1
            seq.serial, seq.state = self._serial, RUNNING
            seq.admit_step, seq.finish_step = step, step + (seq.length - seq.made)
            self.running += 1
            self.k += seq.base - step
            push(finishes, (seq.finish_step, seq.serial, seq))
            admitted.append(seq)
            fresh.append(seq)
        if not fresh:
            return
        if len(admitted) > 2 * self.running + 64:
            self._admitted = [s for s in admitted if s.state == RUNNING]
        if stall > 0:
            self.ready_at = max(self.ready_at, t) + stall
        start = self.ready_at if self.ready_at > t else t
        for seq in fresh:
            seq.admit_time = start

    def _prefill(self, seq: Sequence) -> float:
        """Seconds to prefill an admitted sequence: its prompt unless this replica holds the group's prompt,
        plus the tokens it had made (after a preemption, or a partial rollout whose cache was dropped)."""
        ticket = seq.ticket
        prompt = 0.0 if self.index in ticket.prefilled else float(self.job.prompt_tokens)
        ticket.prefilled.add(self.index)
        return prefill_seconds(prompt + seq.made, self.job.prompt_tokens - prompt, self.job)

    def drop(self, seq: Sequence) -> float:
        """Remove a cancelled sequence; return the tokens it had made."""
        if seq.state == RUNNING:
            self._leave(seq)
            seq.made += self.step - seq.admit_step
            seq.ticket.occupied += self.clock - seq.admit_time
        seq.state = DROPPED
        return seq.made

    # -- weight syncs ----------------------------------------------------------------------------------------

    def stall(self, t: float, seconds: float) -> None:
        """Hold decoding for ``seconds`` from ``t`` (or from the end of a stall already under way)."""
        self.ready_at = max(self.ready_at, t) + seconds

    def running_context_squares(self) -> tuple[float, float]:
        """``(Σ c, Σ c²)`` over the running sequences' contexts (a re-prefill of all of them)."""
        total = squares = 0.0
        for seq in self._admitted:
            if seq.state == RUNNING:
                c = seq.base + self.step - seq.admit_step
                total += c
                squares += c * c
        return total, squares

    def add_switch(self, version: int) -> None:
        """From the current step on, this replica's tokens are of ``version``."""
        self.switch_steps.append(self.step)
        self.switch_versions.append(version)

    def version_tokens(self, seq: Sequence, base_version: int) -> dict[int, float]:
        """Tokens of ``seq`` per weight version that made them (its decoded segments against the switches)."""
        counts: dict[int, float] = {}
        steps, versions = self.switch_steps, self.switch_versions
        n = len(steps)
        for start, end in seq.segments:
            i = bisect_right(steps, start)
            version = versions[i - 1] if i else base_version
            position = start
            while i < n and steps[i] < end:
                counts[version] = counts.get(version, 0.0) + steps[i] - position
                position, version = steps[i], versions[i]
                i += 1
            counts[version] = counts.get(version, 0.0) + end - position
        return counts

    def state_line(self) -> dict[str, Any]:
        return {"replica": self.index, "running": self.running, "waiting": len(self.waiting), "step": self.step}
