"""Decode time between two events of a replica: the integral of the per-step time, and its inverse.

Between two events (a sequence admitted, finished or preempted) a replica runs ``B`` sequences and its context
``C`` grows by ``B`` tokens a step, so each term of :func:`~groupwise.sim.job_model.decode_step_seconds` is a line
in the number ``x`` of steps taken since the last event::

    read(x)    = (N·b + kv·(C₀ + B·x)) / (TP·W·η)           compute(x) = (2·A·B + 4·ℓ·h·(C₀ + B·x)) / (TP·F·μ)
    τ(x)       = o + τₚ·B + max(read(x), compute(x))      (τₚ: tensor-parallel all-reduces per sequence)
    time(x)    = ∫₀ˣ τ(u) du

Steps are treated as continuous (a replica is a fluid of tokens between events), so both the time to a known step
(the next finish) and the steps done by a known time (an arrival) are closed forms: a line's integral is
``v·x + s·x²/2`` (``v`` its value at 0, ``s`` its slope), and the maximum of two lines is one line each side of
their crossing.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from groupwise.sim.job_model import JobCosts


def lines(running: int, context: float, job: JobCosts) -> tuple[float, float, float, float]:
    """``(read value, read slope, compute value, compute slope)`` at the current step, overhead included."""
    overhead = job.decode_overhead_s + job.tp_seconds_per_sequence * running
    read = overhead + (job.weight_bytes + context * job.kv_bytes) / job.replica_bandwidth
    read_slope = job.kv_bytes * running / job.replica_bandwidth
    attention = 4.0 * job.layers * job.hidden
    compute = overhead + (2.0 * job.active_params * running + attention * context) / job.replica_flops
    return read, read_slope, compute, attention * running / job.replica_flops


def _line_time(value: float, slope: float, steps: float) -> float:
    return value * steps + 0.5 * slope * steps * steps


def _line_steps(value: float, slope: float, seconds: float) -> float:
    """Steps ``x`` with ``value·x + slope·x²/2 = seconds`` (``value > 0``, ``slope ≥ 0``), in a stable form."""
    return 2.0 * seconds / (value + math.sqrt(value * value + 2.0 * slope * seconds))


def _crossing(v1: float, s1: float, v2: float, s2: float) -> float:
    """Steps until line 1 stops being the larger one (``inf`` if never); line 1 is the larger at 0."""
    if s2 <= s1:
        return math.inf
    return (v1 - v2) / (s2 - s1)


def seconds_for(steps: float, running: int, context: float, job: JobCosts) -> float:
    """``time(steps)``: seconds for a replica in this state to take ``steps`` decode steps."""
    if steps <= 0:
        return 0.0
    v1, s1, v2, s2 = lines(running, context, job)
    if v2 > v1 or (v2 == v1 and s2 > s1):
        v1, s1, v2, s2 = v2, s2, v1, s1
    cross = _crossing(v1, s1, v2, s2)
    if steps <= cross:
        return _line_time(v1, s1, steps)
    return _line_time(v1, s1, cross) + _line_time(v2 + s2 * cross, s2, steps - cross)


def steps_within(seconds: float, running: int, context: float, job: JobCosts) -> float:
    """The inverse: decode steps a replica in this state takes in ``seconds``."""
    if seconds <= 0:
        return 0.0
    v1, s1, v2, s2 = lines(running, context, job)
    if v2 > v1 or (v2 == v1 and s2 > s1):
        v1, s1, v2, s2 = v2, s2, v1, s1
    cross = _crossing(v1, s1, v2, s2)
    if math.isinf(cross):
        return _line_steps(v1, s1, seconds)
    before = _line_time(v1, s1, cross)
    if seconds <= before:
        return _line_steps(v1, s1, seconds)
    return cross + _line_steps(v2 + s2 * cross, s2, seconds - before)
