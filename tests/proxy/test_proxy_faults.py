"""A store down, back, or answering for a slot it no longer holds: the proxy keeps its promises."""

from __future__ import annotations

import numpy as np
import pytest
from polling import wait_until
from proxy_cluster import (
    SLOTS,
    LocalCluster,
    RefreshingSource,
    agg_request,
    fast_settings,
    make_map,
    moved_maps,
    raw,
    selector,
    workload,
    write_request,
)

from metricsd.cluster.shardmap import ShardMap
from metricsd.maths.slots import slot_of_labels
from metricsd.model import Labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.members import SlotNotHeld, grpc_connect
from metricsd.proxy.settings import HandoffSettings, RepairSettings
from metricsd.rpc.backend import MetricsBackend

T0 = 1_700_000_000_000


def tick(k: int) -> list[int]:
    return [T0 + k * 10_000]


def level(cluster: LocalCluster, member: str, series: list[Labels]) -> bool:
    """``member`` holds, for every series it replicates, the same raw samples as its peers."""
    node = cluster.nodes[member]
    for lab in series:
        holders = cluster.holders(lab)
        if member not in holders:
            continue
        peer = next(m for m in holders if m != member)
        if raw(node.store, lab) != raw(cluster.nodes[peer].store, lab):
            return False
    return True


@pytest.mark.slow
async def test_one_store_down_while_writing_then_hand_off_brings_it_level(cluster3: LocalCluster) -> None:
    proxy = cluster3.proxy()
    series = workload(30)
    await proxy.write(write_request(series, tick(0), labels=True))
    acked = [0]
    victim = cluster3.nodes["store-2"]
    for k in range(1, 40):
        if k == 10:
            await victim.stop()
        resp = await proxy.write(write_request(series, tick(k), labels=False))  # W=2 of 3: still acknowledged
        assert resp.samples_written == len(series)
        acked.append(k)
        if k == 20:  # reads and aggregates answer with one store down, and see everything acknowledged
            got = await proxy.read(pb.ReadRequest(matchers=selector('namespace=~".+"'), end_ms=2**62))
            assert len(got.series) == len(series)
            assert all(len(s.timestamps) == k + 1 for s in got.series)
            agg = await proxy.aggregate(agg_request(T0 + k * 10_000, across=pb.ACROSS_COUNT))
            assert list(agg.values) == [len(series) // 2]
    assert proxy.writes.handoff.pending()["store-2"][0] > 0
    await victim.restart()  # the same Store: a quick restart that lost nothing from before
    await wait_until("the hand-off to drain", lambda: not proxy.writes.handoff.pending(), timeout_s=10.0)
    assert level(cluster3, "store-2", series)
    assert [t for t, _ in raw(victim.store, series[0])] == [T0 + k * 10_000 for k in acked]
    assert proxy.counters["handoff_dropped"] == 0


@pytest.mark.slow
async def test_read_repair_fills_a_replica_that_came_back_empty(cluster3: LocalCluster) -> None:
    proxy = cluster3.proxy(fast_settings(handoff=HandoffSettings(max_bytes=0)))  # no hand-off: repair only
    series = workload(12)
    await proxy.write(write_request(series, [T0 + k * 10_000 for k in range(6)], labels=True))
    # W = 2: a third replica's part may still be on its way. Wiping store-0 before it lands would
    # leave one copy of some series (the R = 2 read below may miss them), or store-0's own part
    # could land on the new store and leave nothing to repair.
    await proxy.writes.wait_idle()
    from metricsd.store.engine import Store

    victim = cluster3.nodes["store-0"]
    await victim.restart(Store())
    everything = pb.ReadRequest(matchers=selector('namespace=~".+"'), end_ms=2**62)

    async def repaired() -> bool:
        got = await proxy.read(everything)  # R=2 rotates over the replicas, so store-0 is asked soon
        assert len(got.series) == len(series) and all(len(s.timestamps) == 6 for s in got.series)
        await proxy.reads.repair.wait_idle()
        return level(cluster3, "store-0", series)

    await wait_until("read repair", repaired, timeout_s=10.0)
    assert proxy.counters["repair_samples"] == len(series) * 6
    assert proxy.counters["handoff_dropped"] == 0  # nothing was missed while it was down


@pytest.mark.slow
async def test_aggregate_read_repair_copies_the_lagging_series(cluster3: LocalCluster) -> None:
    proxy = cluster3.proxy(fast_settings(handoff=HandoffSettings(max_bytes=0)))
    series = workload(12)
    await proxy.write(write_request(series, [T0 + k * 10_000 for k in range(3)], labels=True))
    await proxy.writes.wait_idle()  # W = 2: store-1 must hold the first 3 samples before it stops
    victim = cluster3.nodes["store-1"]
    await victim.stop()
    await proxy.write(write_request(series, [T0 + k * 10_000 for k in range(3, 6)], labels=False))
    await proxy.writes.wait_idle()  # store-1's part may fail after the write was acknowledged at W
    assert proxy.counters["handoff_dropped"] > 0  # hand-off is off: store-1 misses these
    await victim.restart()
    query = agg_request(T0 + 5 * 10_000, window_ms=60_000, across=pb.ACROSS_SUM)
    query.query.series_fn = pb.SERIES_COUNT
    del query.query.matchers[:]
    query.query.matchers.extend(selector('namespace=~".+"'))

    async def repaired() -> bool:
        got = await proxy.aggregate(query)
        assert list(got.values) == [len(series) * 6]  # the merge keeps the complete replica's counts
        await proxy.reads.repair.wait_idle()
        return level(cluster3, "store-1", series)

    await wait_until("read repair", repaired, timeout_s=10.0)
    # store-1's digests differed, so the proxy asked again per series; once repaired, they agree
    assert proxy.counters["aggregate_digest_fallbacks"] >= 1
    fallbacks, digest_reads = proxy.counters["aggregate_digest_fallbacks"], proxy.counters["aggregate_digest_reads"]
    assert list((await proxy.aggregate(query)).values) == [len(series) * 6]
    assert proxy.counters["aggregate_digest_fallbacks"] == fallbacks
    assert proxy.counters["aggregate_digest_reads"] == digest_reads + 1


async def test_repair_is_rate_limited(cluster3: LocalCluster) -> None:
    proxy = cluster3.proxy(fast_settings(repair=RepairSettings(rate_per_s=0.001, burst=1)))
    assert proxy.reads.repair.write("store-0", write_request(workload(1), tick(0), labels=True))
    assert not proxy.reads.repair.write("store-0", write_request(workload(1), tick(1), labels=True))
    assert proxy.counters["repair_skipped"] == 1
    await proxy.reads.repair.wait_idle()


class SlotRefusing:
    """A real store's gRPC backend that answers, for one slot, as a store that no longer holds it."""

    def __init__(self, backend: MetricsBackend, slot: int, ids: set[int]) -> None:
        self.backend = backend
        self.slot = slot
        self.ids = ids

    def __getattr__(self, name: str) -> object:
        return getattr(self.backend, name)

    async def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        if self.slot in request.slots.slots:
            raise SlotNotHeld(f"slot {self.slot} is not held here")
        return await self.backend.read(request)

    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        if self.ids.intersection(request.ids):
            raise SlotNotHeld(f"slot {self.slot} is not held here")
        return await self.backend.write(request)


async def test_failed_precondition_on_a_read_refreshes_the_map_and_retries_once(cluster4: LocalCluster) -> None:
    series = workload(40)
    writer = cluster4.proxy()
    await writer.write(write_request(series, tick(0), labels=True))
    slot = slot_of_labels(series[0], SLOTS)
    stale, fresh, old_owner, _ = moved_maps(cluster4, slot)
    base = grpc_connect(2.0)
    old_addr = fresh.address(old_owner)

    def connect(address: str) -> MetricsBackend:
        b = base(address)
        return SlotRefusing(b, slot, set()) if address == old_addr else b  # type: ignore[return-value]

    source = RefreshingSource(stale, fresh)
    proxy = cluster4.proxy(fast_settings(w=1, r=3), connect=connect, source=source)  # R=3: no spare to fall back on
    got = await proxy.read(pb.ReadRequest(matchers=selector('namespace=~".+"'), end_ms=2**62))
    assert sorted(s.id for s in got.series) == sorted(series_id(s) for s in series)
    assert source.refreshes == 1 and proxy.counters["stale_map_retries"] == 1


async def test_failed_precondition_on_a_write_resends_to_the_new_owner(cluster4: LocalCluster) -> None:
    series = workload(40)
    slot = slot_of_labels(series[0], SLOTS)
    stale, fresh, old_owner, new_owner = moved_maps(cluster4, slot)
    in_slot = [s for s in series if slot_of_labels(s, SLOTS) == slot]
    base = grpc_connect(2.0)
    old_addr = fresh.address(old_owner)

    def connect(address: str) -> MetricsBackend:
        b = base(address)
        return SlotRefusing(b, slot, {series_id(s) for s in in_slot}) if address == old_addr else b  # type: ignore[return-value]

    source = RefreshingSource(stale, fresh)
    proxy = cluster4.proxy(connect=connect, source=source)
    resp = await proxy.write(write_request(series, tick(0), labels=True))
    assert resp.samples_written == len(series)  # two of the stale map's replicas acknowledged
    assert source.refreshes == 1
    await proxy.writes.wait_idle()
    for lab in in_slot:  # the new owner got the write on the retry with the fresh map
        assert raw(cluster4.nodes[new_owner].store, lab) != []
        assert raw(cluster4.nodes[old_owner].store, lab) == []


async def test_a_map_change_closes_the_connections_of_members_it_dropped(cluster4: LocalCluster) -> None:
    closed: list[str] = []
    base = grpc_connect(2.0)

    class Closing:
        def __init__(self, address: str) -> None:
            self.address = address
            self.backend = base(address)

        def __getattr__(self, name: str) -> object:
            return getattr(self.backend, name)

        async def close(self) -> None:
            closed.append(self.address)
            await self.backend.close()  # type: ignore[attr-defined]

    proxy = cluster4.proxy(connect=Closing)  # type: ignore[arg-type]
    series = workload(20)
    await proxy.write(write_request(series, tick(0), labels=True))
    gone = cluster4.nodes.pop("store-3")
    smaller = make_map(list(cluster4.nodes.values()))
    cluster4.source.set(ShardMap(version=cluster4.shard_map.version + 1, rf=3, slots=smaller.slots,
                                 members=smaller.members))
    await proxy.write(write_request(series, tick(1), labels=False))
    await proxy.view.pool.close()
    assert closed[0] == gone.address
    await gone.stop()


async def test_unknown_ids_with_many_series_and_a_tiny_route_cache(cluster3: LocalCluster) -> None:
    proxy = cluster3.proxy(fast_settings(series_cache=16))
    series = workload(40)
    first = await proxy.write(write_request(series, tick(0), labels=True))
    assert first.samples_written == len(series)
    again = await proxy.write(write_request(series, tick(1), labels=False))
    assert 0 < len(again.unknown_ids) <= len(series)  # forgotten routes: the client resends labels
    assert again.samples_written == 0
    retry = await proxy.write(write_request(series, tick(1), labels=True))
    assert retry.samples_written == len(series)
    got = await proxy.aggregate(agg_request(T0 + 10_000, across=pb.ACROSS_COUNT))
    assert np.array_equal(np.array(got.values), [len(series) // 2])
