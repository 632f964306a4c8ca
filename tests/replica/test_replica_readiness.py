"""SlotReadiness: the slots a map change gives a store are refused to reads until caught up."""

from __future__ import annotations

import asyncio

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from metricsd.cluster.shardmap import Member, ShardMap
from metricsd.replica.readiness import SlotReadiness

MEMBERS = {m: Member(m, f"127.0.0.1:{7000 + i}") for i, m in enumerate(("a", "b", "c"))}


def map_of(version: int, holders: list[tuple[str, ...]]) -> ShardMap:
    return ShardMap(version=version, rf=len(holders[0]), slots=tuple(holders), members=MEMBERS)


def refused(r: SlotReadiness, n: int) -> list[int]:
    return r.refused(np.arange(n)).tolist()


def test_the_first_map_refuses_nothing_and_a_gained_slot_is_refused_until_level() -> None:
    r = SlotReadiness("c")
    r.observe(map_of(1, [("a", "c"), ("a", "b"), ("b", "c"), ("a", "b")]))
    assert refused(r, 4) == [] and not r.any and r.gaining() == set()
    r.observe(map_of(2, [("a", "c"), ("c", "b"), ("b", "c"), ("a", "c")]))  # gains 1 and 3
    assert refused(r, 4) == [1, 3] and r.gaining() == {1, 3} and r.since == {1: 2, 3: 2}
    r.level([1])
    assert refused(r, 4) == [3] and r.since == {3: 2}
    r.observe(map_of(3, [("a", "c"), ("c", "b"), ("b", "c"), ("a", "b")]))  # 3 moves away: nothing to wait for
    assert refused(r, 4) == [] and not r.any


def test_a_slot_lost_and_gained_again_waits_for_a_new_catch_up() -> None:
    r = SlotReadiness("c")
    r.observe(map_of(1, [("a", "c"), ("a", "b")]))
    r.observe(map_of(2, [("a", "b"), ("a", "b")]))
    r.observe(map_of(3, [("a", "c"), ("a", "b")]))
    assert refused(r, 2) == [0] and r.since == {0: 3}


def test_a_new_slot_count_starts_afresh() -> None:
    r = SlotReadiness("c")
    r.observe(map_of(1, [("a", "b"), ("a", "b")]))
    r.observe(map_of(2, [("c",), ("c",), ("c",)]))
    assert refused(r, 3) == [] and r.gaining() == set()


@given(st.lists(st.lists(st.booleans(), min_size=6, max_size=6), min_size=1, max_size=8),
       st.lists(st.sets(st.integers(0, 5)), min_size=8, max_size=8))
def test_refused_is_exactly_held_and_gained_since_the_first_map_and_not_level_since(
        held: list[list[bool]], levels: list[set[int]]) -> None:
    r = SlotReadiness("c")
    want: set[int] = set()
    before: set[int] | None = None
    for v, row in enumerate(held, start=1):
        now = {s for s, h in enumerate(row) if h}
        r.observe(map_of(v, [("c",) if s in now else ("a",) for s in range(6)]))
        if before is not None:
            want = (want | (now - before)) & now
        before = now
        r.level(levels[v - 1])
        want -= levels[v - 1]
        assert set(refused(r, 6)) == want == r.gaining() and r.any == bool(want)


async def test_wait_returns_when_the_slots_are_level_or_false_at_its_bound() -> None:
    r = SlotReadiness("c")
    r.observe(map_of(1, [("a", "b"), ("a", "b")]))
    r.observe(map_of(2, [("c", "b"), ("c", "b")]))
    assert not await r.wait(np.array([0]), 0.05)
    waiter = asyncio.ensure_future(r.wait(np.array([0, 1]), 5.0))
    await asyncio.sleep(0.01)
    r.level([0])
    await asyncio.sleep(0.01)
    assert not waiter.done()  # slot 1 still refused
    r.observe(map_of(3, [("c", "b"), ("a", "b")]))  # slot 1 moved away: nothing to wait for
    assert await asyncio.wait_for(waiter, 1.0)
    assert await r.wait(np.array([1]), 0.0)
