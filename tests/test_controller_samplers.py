"""Staleness samplers and the weight_fifo hang under dynamic sampling.

Covered: protocol conformance of every built-in; admission (windowed never gates or stamps,
in_order stamps 0,1,… and gates at W, weight_fifo gates at window 0 after one batch and never stamps,
ready_first admits the live batch + S then opens one more per trainer step); in_order evict matches select
(future target kept however old its weights, past target evicted, unready never evicted); factory + knob
validation + capacity P × (W + 1); custom loading and protocol check; windowed select (in-window ready only,
below-min → None, unready excluded, freshest first); weight_fifo select (oldest in-window version first, waits
on a partial oldest bucket, empty window → None); ready_first select (mixes versions in dispatch order, never
evicts a straggler); in_order select ignores weights; default evict below window skips unready slots;
dispatch-index restore; abort policy; select bounds; DropAccountingSampler hooks (in_order explicit, windowed
overrides, ready_first and custom-without-protocol get the gated defaults).
The weight_fifo hang: with {1: 6 ready, 2: 10 ready} at v = 2 (S = 1, P = 8) weight_fifo selects nothing, forever, while
ready_first selects a full step from the same buffer.
"""

from __future__ import annotations

import asyncio

import pytest
from fakes import run_virtual

from groupwise.config import (
    InOrderSamplerConfig,
    ReadyFirstSamplerConfig,
    WeightFifoSamplerConfig,
    WindowedSamplerConfig,
    sampler_config,
)
from groupwise.controller.buffer import GroupBuffer
from groupwise.controller.clock import VersionClock
from groupwise.controller.samplers import (
    DropAccountingSampler,
    InOrderSampler,
    ReadyFirstSampler,
    Sampler,
    WeightFifoSampler,
    WindowedSampler,
    build_sampler,
    drop_accounting,
)
from groupwise.types import Completion, Group, Prompt


def fill(buf: GroupBuffer, spec: list[tuple[int, int | None, bool]]) -> list[int]:
    """Reserve (start_version, target_step) slots in order; commit those marked ready."""
    ids = []
    for start, target, ready in spec:
        sid = buf.reserve(start, target)
        if ready:
            comps = [Completion((1,), (-0.1,), "x", "stop", start) for _ in range(2)]
            buf.commit(sid, Group(sid, Prompt(uid=f"u{sid}", answer=""), (1,), comps, [0, 1], [0, 1]), start)
        ids.append(sid)
    return ids


def build(name: str, buf: GroupBuffer | None = None, **knobs):
    """The sampler ``name`` with ``knobs``, built as the controller builds it: from its config section."""
    return build_sampler(sampler_config(name, **knobs), buf if buf is not None else GroupBuffer())


def ids(slots) -> list[int] | None:
    return None if slots is None else [s.slot_id for s in slots]


async def admit_all_until_blocked(sampler, clock, limit=10) -> list[int | None]:
    """Admit batches until admit would block; return the stamps."""
    stamps = []
    for _ in range(limit):
        task = asyncio.ensure_future(sampler.admit(clock))
        await asyncio.sleep(0)
        if not task.done():
            task.cancel()
            break
        stamps.append(task.result())
    return stamps


@pytest.mark.parametrize("name", ["in_order", "ready_first", "windowed", "weight_fifo"])
def test_builtins_satisfy_the_protocol(name):
    assert isinstance(build(name), Sampler)


def test_admission_per_sampler():
    async def main():
        clock = VersionClock()
        buf = GroupBuffer()
        in_order = InOrderSampler(buf, InOrderSamplerConfig(max_lookahead_versions=1))
        ready_first = ReadyFirstSampler(buf, ReadyFirstSamplerConfig(max_staleness_versions=2))
        fifo = WeightFifoSampler(buf, WeightFifoSamplerConfig(max_staleness_versions=0))
        windowed = WindowedSampler(buf, WindowedSamplerConfig(max_staleness_versions=0))
        out = {
            "in_order": await admit_all_until_blocked(in_order, clock),
            "ready_first": await admit_all_until_blocked(ready_first, clock),
            "weight_fifo": await admit_all_until_blocked(fifo, clock),
            "windowed": await admit_all_until_blocked(windowed, clock, limit=6),
        }
        clock.advance()
        out["in_order_after_step"] = await admit_all_until_blocked(in_order, clock)
        out["ready_first_after_step"] = await admit_all_until_blocked(ready_first, clock)
        return out

    out = run_virtual(main)
    assert out["in_order"] == [0, 1]
    assert out["ready_first"] == [None, None, None]
    assert out["weight_fifo"] == [None]
    assert out["windowed"] == [None] * 6
    assert out["in_order_after_step"] == [2]
    assert out["ready_first_after_step"] == [None]


def test_dispatch_index_restore():
    async def main():
        clock = VersionClock(start=5)
        sampler = InOrderSampler(GroupBuffer(), InOrderSamplerConfig(max_lookahead_versions=1))
        sampler.set_dispatch_index(5)
        return await admit_all_until_blocked(sampler, clock)

    assert run_virtual(main) == [5, 6]
    with pytest.raises(ValueError, match="resume step must be >= 0"):
        InOrderSampler(GroupBuffer()).set_dispatch_index(-1)


def test_in_order_select_matches_target_and_ignores_weights():
    buf = GroupBuffer()
    a, b, c, d = fill(buf, [(0, 3, True), (1, 2, True), (2, 3, True), (3, 4, True)])
    sampler = InOrderSampler(buf)
    assert ids(sampler.select(3, 1, 5)) == [a, c]
    assert sampler.select(3, 1, 5) is None
    assert ids(sampler.select(2, 1, 1)) == [b]


def test_in_order_evict_only_ready_slots_of_passed_steps():
    buf = GroupBuffer()
    old_weights_future_step, passed_ready, passed_unready = fill(buf, [(0, 5, True), (1, 1, True), (1, 0, False)])
    evicted = InOrderSampler(buf).evict(2)
    assert ids(evicted) == [passed_ready]
    assert len(buf) == 2  # the future step's group and the unready slot stay


def test_windowed_select_window_minimum_and_order():
    buf = GroupBuffer()
    old, mid, mid_unready, new1, new2 = fill(
        buf, [(0, None, True), (2, None, True), (2, None, False), (3, None, True), (3, None, True)]
    )
    sampler = WindowedSampler(buf, WindowedSamplerConfig(max_staleness_versions=1))
    assert sampler.select(3, 4, 4) is None  # only 3 in-window ready groups
    assert ids(sampler.select(3, 1, 2)) == [mid, new1]
    fresh = WindowedSampler(GroupBuffer(), WindowedSamplerConfig(max_staleness_versions=2, sample_freshest_first=True))
    f_ids = fill(fresh.buffer, [(1, None, True), (2, None, True), (3, None, True), (3, None, True)])
    assert ids(fresh.select(3, 1, 3)) == [f_ids[2], f_ids[3], f_ids[1]]
    assert ids(sampler.evict(3)) == [old]
    assert sampler.should_abort_inflight(1, 3) and not sampler.should_abort_inflight(2, 3)


def test_default_evict_skips_unready_stale_slots():
    buf = GroupBuffer()
    stale_ready, stale_unready, fresh = fill(buf, [(0, None, True), (0, None, False), (2, None, True)])
    assert ids(WeightFifoSampler(buf, WeightFifoSamplerConfig(max_staleness_versions=1)).evict(2)) == [stale_ready]
    assert len(buf) == 2


def test_weight_fifo_drains_oldest_version_and_waits_on_partial_bucket():
    buf = GroupBuffer()
    v1a, v1_unready, v1b, v2a, v2b = fill(
        buf, [(1, None, True), (1, None, False), (1, None, True), (2, None, True), (2, None, True)]
    )
    sampler = WeightFifoSampler(buf, WeightFifoSamplerConfig(max_staleness_versions=1))
    assert sampler.select(2, 3, 3) is None  # version 1 has 2 ready of 3 slots: wait, do not mix in version 2
    assert ids(sampler.select(2, 2, 3)) == [v1a, v1b]
    assert sampler.select(2, 1, 3) is None  # version 1's unready slot still pins t* = 1
    buf.remove(v1_unready)
    assert ids(sampler.select(2, 1, 3)) == [v2a, v2b]
    assert WeightFifoSampler(GroupBuffer()).select(5, 1, 1) is None  # empty window


def test_ready_first_mixes_versions_in_dispatch_order_and_never_evicts():
    buf = GroupBuffer()
    straggler, unready, newer = fill(buf, [(0, None, True), (3, None, False), (5, None, True)])
    sampler = ReadyFirstSampler(buf, ReadyFirstSamplerConfig(max_staleness_versions=1))
    assert sampler.evict(9) == []
    assert ids(sampler.select(9, 1, 5)) == [straggler, newer]


@pytest.mark.parametrize("min_groups,max_groups", [(0, 1), (2, 1), (-1, 3)])
def test_select_bounds_are_checked(min_groups, max_groups):
    for name in ("in_order", "ready_first", "windowed", "weight_fifo"):
        with pytest.raises(ValueError, match="1 <= min_groups <= max_groups"):
            build(name).select(0, min_groups, max_groups)


def test_factory_knobs_and_capacity():
    buf = GroupBuffer()
    assert build("ready_first", buf, max_staleness_versions=2).required_buffer_capacity(8) == 24
    assert build("in_order", buf, max_lookahead_versions=0).required_buffer_capacity(8) == 8
    assert build("windowed", buf).required_buffer_capacity(8) is None
    # Knobs are declared once, in the config section: another sampler's knob, a bad value or name never builds.
    with pytest.raises(ValueError, match=r"ready_first\.max_lookahead_versions\s+Extra inputs are not permitted"):
        build("ready_first", buf, max_lookahead_versions=1)
    with pytest.raises(ValueError, match=r"ready_first\.max_staleness_versions\s+Input should be greater than or"):
        build("ready_first", buf, max_staleness_versions=-1)
    with pytest.raises(ValueError, match="'fifo' .* does not match any of the expected tags"):
        build("fifo", buf)


def test_custom_loading_and_protocol_check():
    buf = GroupBuffer()
    sampler = build("custom", buf, target="fakes.samplers:PlainReadyFirst", kwargs={"window": 3})
    assert sampler.required_buffer_capacity(2) == 8 and sampler.buffer is buf
    with pytest.raises(TypeError, match="missing .*'select'"):
        build("custom", buf, target="fakes.samplers:MissingSelect")
    with pytest.raises(ValueError, match="module:ClassName"):
        build("custom", buf, target="fakes.samplers.PlainReadyFirst")
    with pytest.raises(ValueError, match="has no 'Nope'"):
        build("custom", buf, target="fakes.samplers:Nope")


def test_drop_accounting_hooks():
    buf = GroupBuffer()
    in_order = InOrderSampler(buf)
    assert isinstance(in_order, DropAccountingSampler)
    acc = drop_accounting(in_order)
    assert (acc.uses_replacement_pool, acc.closes_short_at_exhaustion) == (True, False)
    assert acc.charge_step_for_lost_group(4, 2) == 4
    windowed = drop_accounting(WindowedSampler(buf))
    assert (windowed.uses_replacement_pool, windowed.closes_short_at_exhaustion) == (False, True)
    assert windowed.charge_step_for_lost_group(None, 2) is None
    for plain in (ReadyFirstSampler(buf), build("custom", buf, target="fakes.samplers:PlainReadyFirst")):
        assert not isinstance(plain, DropAccountingSampler)
        acc = drop_accounting(plain)
        assert (acc.uses_replacement_pool, acc.closes_short_at_exhaustion) == (True, False)
        assert acc.charge_step_for_lost_group(None, 2) == 2
        assert acc.charge_step_for_lost_group(5, 2) == 5


def stalled_buffer() -> GroupBuffer:
    """The buffer at the observed stall: {1: 6 ready/6 slots, 2: 10 ready/10 slots}, nothing in flight."""
    buf = GroupBuffer()
    fill(buf, [(1, None, True)] * 6 + [(2, None, True)] * 10)
    return buf


def test_weight_fifo_never_fills_the_stalled_buffer_but_ready_first_does():
    P = 8
    fifo = WeightFifoSampler(stalled_buffer(), WeightFifoSamplerConfig(max_staleness_versions=1))
    for _ in range(100):  # nothing can change: the gate is closed and nothing is in flight
        assert fifo.evict(2) == []
        assert fifo.select(2, P, P) is None
    assert fifo.buffer.slots_per_start_version() == {1: (6, 6), 2: (10, 10)}
    ready_first = ReadyFirstSampler(stalled_buffer(), ReadyFirstSamplerConfig(max_staleness_versions=1))
    first, second = ready_first.select(2, P, P), ready_first.select(2, P, P)
    assert [s.start_version for s in first] == [1] * 6 + [2] * 2
    assert [s.start_version for s in second] == [2] * 8
