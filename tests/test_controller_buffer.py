"""GroupBuffer, VersionClock and Permits.

Invariants pinned:
- slots keep dispatch (reserve) order whatever the commit order; start versions never decrease along it;
- only whole, ready groups are taken; unknown / unready / duplicate ids are rejected before any change;
- count_for_target_step counts unready reservations too;
- promote_ready_group re-stamps the ready group with the LARGEST later target, never an unready or an
  unstamped one, never an earlier step; two borrows take two groups;
- state_dict holds READY groups only and round-trips their versions, stamps, payload groups and ids;
  new reservations after a restore never reuse a group id;
- the clock wakes a waiter exactly when its predicate first holds; Permits hand permits FIFO and report
  parked waiters until a permit is handed over.
"""

from __future__ import annotations

import asyncio

import pytest
from fakes import run_virtual

from groupwise.controller.buffer import GroupBuffer
from groupwise.controller.clock import VersionClock
from groupwise.controller.permits import Permits
from groupwise.types import Completion, Group, Prompt


def group(gid: int, rewards=(0.0, 1.0)) -> Group:
    comps = [Completion((1,), (-0.1,), "x", "stop", 0) for _ in rewards]
    return Group(gid, Prompt(uid=f"u{gid}", answer="a", text="t"), (5,), comps, list(rewards), list(rewards))


def test_ready_order_is_dispatch_order_not_commit_order():
    buf = GroupBuffer()
    ids = [buf.reserve(0) for _ in range(4)]
    for i in reversed(ids):
        buf.commit(i, group(i), end_version=0)
    assert [s.slot_id for s in buf.take_first_ready(3)] == ids[:3]
    assert buf.ready_count == 1 and len(buf) == 1


def test_reserve_rejects_decreasing_start_version():
    buf = GroupBuffer()
    buf.reserve(2)
    with pytest.raises(ValueError, match="must not decrease"):
        buf.reserve(1)


def test_take_rejects_unready_unknown_and_duplicates_without_side_effects():
    buf = GroupBuffer()
    a, b = buf.reserve(0), buf.reserve(0)
    buf.commit(a, group(a), 0)
    with pytest.raises(ValueError, match="not ready"):
        buf.take([a, b])
    with pytest.raises(ValueError, match="unknown slot id 99"):
        buf.take([a, 99])
    with pytest.raises(ValueError, match="duplicate"):
        buf.take([a, a])
    assert len(buf) == 2 and buf.ready_count == 1
    with pytest.raises(ValueError, match="already ready"):
        buf.commit(a, group(a), 0)


def test_count_for_target_step_includes_unready_reservations():
    buf = GroupBuffer()
    a = buf.reserve(0, target_step=3)
    buf.reserve(0, target_step=3)
    buf.reserve(0, target_step=4)
    buf.commit(a, group(a), 0)
    assert buf.count_for_target_step(3) == 2
    assert buf.ready_count_for_target(3) == 1
    buf.remove(a)
    assert buf.count_for_target_step(3) == 1


def test_promote_borrows_from_the_furthest_later_ready_step():
    buf = GroupBuffer()
    slots = {}
    for target in (1, 2, 3, 3, 0):
        sid = buf.reserve(0, target_step=target)
        slots.setdefault(target, []).append(sid)
    unstamped = buf.reserve(0)
    for sid in slots[1] + slots[2] + slots[3][:1] + slots[0] + [unstamped]:
        buf.commit(sid, group(sid), 0)
    # Step 3 has one ready and one unready group: the ready one is lent (largest target first).
    assert buf.promote_ready_group(1) == 3
    assert buf.count_for_target_step(1) == 2 and buf.count_for_target_step(3) == 1
    assert buf.get(slots[3][0]).target_step == 1 and buf.get(slots[3][0]).group.target_step == 1
    # Next lender: step 2 (step 3's remaining slot is unready and must not be borrowed).
    assert buf.promote_ready_group(1) == 2
    # Only later steps lend; the unstamped group never does.
    assert buf.promote_ready_group(1) is None
    assert buf.promote_ready_group(3) is None
    assert buf.get(unstamped).target_step is None


def test_state_dict_keeps_ready_groups_only_and_round_trips():
    buf = GroupBuffer()
    a = buf.reserve(0, target_step=0)
    b = buf.reserve(1)  # stays in flight: not saved
    c = buf.reserve(1, target_step=2)
    buf.commit(a, group(a, (0.0, 1.0)), end_version=1)
    buf.commit(c, group(c, (0.5, 0.25)), end_version=2)
    state = buf.state_dict()
    assert [e["group"]["group_id"] for e in state["groups"]] == [a, c]
    restored = GroupBuffer()
    assert restored.load_state_dict(state) == [a, c]
    slot_c = restored.get(c)
    assert (slot_c.start_version, slot_c.end_version, slot_c.target_step) == (1, 2, 2)
    assert slot_c.group.raw_rewards == [0.5, 0.25] and slot_c.group.prompt.uid == f"u{c}"
    assert restored.reserve(2) > max(a, b, c)
    with pytest.raises(ValueError, match="empty buffer"):
        restored.load_state_dict(state)


def test_clock_wakes_waiter_only_when_predicate_holds():
    async def main():
        clock = VersionClock()
        woke_at = []

        async def waiter():
            woke_at.append(await clock.wait_until(lambda v: v >= 2))

        task = asyncio.ensure_future(waiter())
        await asyncio.sleep(0)
        assert clock.waiting == 1
        clock.advance()
        await asyncio.sleep(0)
        assert woke_at == [] and clock.waiting == 1
        clock.advance()
        assert clock.waiting == 0  # handed over synchronously, before the waiter even runs
        await task
        return woke_at

    assert run_virtual(main) == [2]


def test_permits_fifo_and_parked_until_handed_over():
    async def main():
        permits = Permits(1, "cap")
        await permits.acquire()
        order = []

        async def take(name):
            await permits.acquire()
            order.append(name)

        tasks = [asyncio.ensure_future(take(n)) for n in ("a", "b")]
        await asyncio.sleep(0)
        assert permits.waiting == 2
        permits.release()
        assert permits.waiting == 1 and permits.in_use == 1
        await asyncio.sleep(0)
        permits.release()
        await asyncio.gather(*tasks)
        return order, permits.in_use

    assert run_virtual(main) == (["a", "b"], 1)
    with pytest.raises(ValueError, match="cap must be >= 1"):
        Permits(0, "cap")
