"""Reads of consistency one (metricsd/rpc/consistency.py): the replica choice (quorum.plan_one),
the hedging delay (latency.py), and the hedged fan-out through a ProxyBackend over real stores on
real gRPC (hedge.py, reads.py)."""

from __future__ import annotations

import asyncio
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from proxy_cluster import LocalCluster, agg_request, all_values, fast_settings, selector, workload, write_request

from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.latency import HedgeSettings, LatencyTracker
from metricsd.proxy.quorum import plan_one
from metricsd.rpc.backend import Unavailable
from metricsd.rpc.consistency import Consistency, current, parse, reading_with

T0 = 1_700_000_000_000
MEMBERS = ["a", "b", "c", "d"]

# --- plan_one ---------------------------------------------------------------------------------


@st.composite
def layouts(draw: st.DrawFn) -> tuple[dict[int, tuple[str, ...]], set[str], set[str], int]:
    slots = draw(st.integers(1, 24))
    replicas = {s: tuple(draw(st.lists(st.sampled_from(MEMBERS), min_size=0, max_size=3, unique=True)))
                for s in range(slots)}
    healthy = set(draw(st.lists(st.sampled_from(MEMBERS), unique=True)))
    exclude = set(draw(st.lists(st.sampled_from(MEMBERS), max_size=2, unique=True)))
    return replicas, healthy, exclude, draw(st.integers(0, 10))


@given(layouts())
def test_plan_one_gives_every_slot_to_exactly_one_of_its_replicas_and_prefers_healthy_ones(
        layout: tuple[dict[int, tuple[str, ...]], set[str], set[str], int]) -> None:
    replicas, healthy, exclude, offset = layout
    asks, none = plan_one(replicas, replicas.__getitem__, healthy, exclude, offset)
    given_to = Counter(s for slots in asks.values() for s in slots)
    assert all(n == 1 for n in given_to.values())
    for member, slots in asks.items():
        assert member not in exclude and slots == sorted(slots)
        for s in slots:
            assert member in replicas[s]
            if any(m in healthy and m not in exclude for m in replicas[s]):
                assert member in healthy
    left = [s for s, r in replicas.items() if not [m for m in r if m not in exclude]]
    assert none == left and set(given_to) | set(none) == set(replicas)


def test_plan_one_asks_one_member_when_one_holds_every_slot_and_rotates_which() -> None:
    replicas = dict.fromkeys(range(16), ("a", "b", "c"))
    chosen = []
    for offset in range(3):
        asks, none = plan_one(replicas, replicas.__getitem__, {"a", "b", "c"}, (), offset)
        assert none == [] and len(asks) == 1 and next(iter(asks.values())) == list(range(16))
        chosen.append(next(iter(asks)))
    assert sorted(chosen) == ["a", "b", "c"]


def test_plan_one_without_a_member_covers_its_slots_with_the_others() -> None:
    replicas = {0: ("a", "b"), 1: ("b", "c")}
    assert plan_one([0, 1], replicas.__getitem__, {"a", "b", "c"}) == ({"b": [0, 1]}, [])
    assert plan_one([0, 1], replicas.__getitem__, {"a", "b", "c"}, {"b"}) == ({"a": [0], "c": [1]}, [])
    assert plan_one([0, 1], replicas.__getitem__, {"c"}, {"b"}) == ({"c": [1], "a": [0]}, [])
    assert plan_one([0, 1], replicas.__getitem__, set(), {"a", "b"}) == ({"c": [1]}, [0])


# --- the hedging delay ------------------------------------------------------------------------


def test_the_hedging_delay_is_a_quantile_of_the_members_answers_clamped_and_initial_before_enough_answers() -> None:
    t = LatencyTracker(HedgeSettings(quantile=0.9, window=100, min_samples=10, initial_s=0.05, min_s=0.002,
                                     max_s=0.5))
    assert t.delay("a") == 0.05
    for ms in range(1, 10):
        t.record("a", ms / 1000)
    assert t.delay("a") == 0.05  # 9 answers: not yet
    t.record("a", 0.010)
    assert t.delay("a") == pytest.approx(0.010)  # the 10th of 10 sorted
    for ms in range(100):
        t.record("b", (ms + 1) / 1000)
    assert t.delay("b") == pytest.approx(0.091)
    for _ in range(100):
        t.record("c", 0.0001)
        t.record("d", 9.0)
    assert t.delay("c") == 0.002 and t.delay("d") == 0.5
    t.forget(["d"])
    assert t.delay("d") == 0.05


def test_consistency_values_parse_and_default_to_quorum() -> None:
    assert current() is Consistency.QUORUM
    with reading_with(Consistency.ONE):
        assert current() is Consistency.ONE
    assert current() is Consistency.QUORUM
    assert parse(" One ") is Consistency.ONE and parse("QUORUM") is Consistency.QUORUM
    with pytest.raises(ValueError, match="unknown read consistency 'all': use one or quorum"):
        parse("all")


# --- through a proxy over real stores -----------------------------------------------------------


async def _fill(cluster: LocalCluster, pods: int = 48) -> None:
    proxy = cluster.proxy()
    series = workload(pods)
    await proxy.write(write_request(series, [T0 - 60_000 + i * 10_000 for i in range(7)], labels=True))
    # W = 2 of RF = 3: a read of consistency one may ask the third replica, whose part may still be
    # on its way; every replica must hold everything before the tests read one of them.
    await proxy.writes.wait_idle()


async def test_a_read_of_consistency_one_answers_with_one_store_of_three_up_where_a_quorum_read_fails(
        cluster3: LocalCluster) -> None:
    await _fill(cluster3)
    proxy = cluster3.proxy()
    req = agg_request(T0, group_by=["workload"])
    read = pb.ReadRequest(matchers=selector("", "container_cpu_usage_seconds_total"), start_ms=0, end_ms=T0)
    want = await proxy.aggregate(req)
    want_read = await proxy.read(read)
    assert len(want_read.series) == 48
    for n in list(cluster3.nodes.values())[1:]:
        await n.stop()
    with pytest.raises(Unavailable, match="read quorum not reached"):
        await proxy.aggregate(req)
    with reading_with(Consistency.ONE):
        got = await proxy.aggregate(req)
        got_read = await proxy.read(read)
    assert [g.labels for g in got.groups] == [g.labels for g in want.groups]
    np.testing.assert_allclose(all_values(got), all_values(want), rtol=1e-12)
    assert got_read == want_read


async def test_hedged_reads_take_each_slot_from_exactly_one_reply(cluster3: LocalCluster) -> None:
    """With a zero hedging delay every member's call is hedged at once, so two covers of the same
    slots race; the answer must still count each series once (an aggregate that summed both
    covers' partials would double every group)."""
    await _fill(cluster3)
    quorum = cluster3.proxy()
    hedging = cluster3.proxy(fast_settings(hedge=HedgeSettings(initial_s=0.0, min_s=0.0, max_s=0.0)))
    for across in (pb.ACROSS_SUM, pb.ACROSS_COUNT, pb.ACROSS_AVG):
        req = agg_request(T0, end_ms=T0 + 20_000, across=across, group_by=["namespace"])
        want = await quorum.aggregate(req)
        with reading_with(Consistency.ONE):
            got = await asyncio.gather(*(hedging.aggregate(req) for _ in range(8)))
        for g in got:
            assert [x.labels for x in g.groups] == [x.labels for x in want.groups]
            np.testing.assert_allclose(all_values(g), all_values(want), rtol=1e-12)
    assert hedging.counters["read_one_hedges"] > 0
    assert quorum.counters["reads_one"] == 0
