"""ProxyBackend over real stores on loopback gRPC: writes, reads, aggregates, the id handshake."""

from __future__ import annotations

import re

import numpy as np
import pytest
from proxy_cluster import (
    SLOTS,
    LocalCluster,
    agg_request,
    fast_settings,
    raw,
    selector,
    workload,
    write_request,
)

from metricsd.maths.slots import slot_of_labels
from metricsd.model import series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.members import grpc_connect
from metricsd.rpc.backend import BadRequest, MetricsBackend, Unavailable
from metricsd.rpc.client import MetricsClient
from metricsd.rpc.rollupbatch import rollups_from_response
from metricsd.rpc.server import start_grpc_server
from metricsd.rpc.servicer import MetricsServicer
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

TIMES = [1_700_000_000_000 + k * 10_000 for k in range(12)]


async def test_a_write_acknowledged_by_the_proxy_is_readable_and_on_rf_replicas(cluster4: LocalCluster) -> None:
    proxy = cluster4.proxy()
    series = workload(40)
    resp = await proxy.write(write_request(series, TIMES, labels=True))
    assert resp.samples_written == len(series) * len(TIMES)
    assert not resp.unknown_ids
    got = await proxy.read(pb.ReadRequest(matchers=selector('namespace=~"ns.*"'), start_ms=0, end_ms=2**62))
    assert len(got.series) == len(series)
    by_id = {s.id: s for s in got.series}
    for lab in series:
        assert list(by_id[series_id(lab)].timestamps) == TIMES
    # The ack came at W = 2 of RF = 3: a third replica's part may still be on its way.
    await proxy.writes.wait_idle()
    for lab in series:  # every series is on exactly its slot's 3 replicas and nowhere else
        holders = {m for m, n in cluster4.nodes.items() if raw(n.store, lab)}
        assert holders == set(cluster4.holders(lab))


async def test_ids_the_proxy_never_saw_labels_for_are_returned_and_nothing_is_stored(cluster3: LocalCluster) -> None:
    proxy = cluster3.proxy()
    series = workload(5)
    resp = await proxy.write(write_request(series, TIMES[:1], labels=False))
    assert sorted(resp.unknown_ids) == sorted(series_id(s) for s in series)
    assert resp.samples_written == 0
    assert all(n.store.index.n_alive == 0 for n in cluster3.nodes.values())
    assert (await proxy.write(write_request(series, TIMES[:1], labels=True))).samples_written == len(series)
    # known now: ids alone are enough, through this proxy
    assert (await proxy.write(write_request(series, TIMES[1:2], labels=False))).samples_written == len(series)
    # another proxy has never seen the labels and asks for them, as a store would
    other = cluster3.proxy()
    assert len((await other.write(write_request(series, TIMES[2:3], labels=False))).unknown_ids) == len(series)


async def test_a_store_that_forgot_the_series_gets_their_labels_from_the_proxy(cluster3: LocalCluster) -> None:
    proxy = cluster3.proxy()
    series = workload(6)
    await proxy.write(write_request(series, TIMES[:2], labels=True))
    # W = 2: store-1's part of the first batch may still be on its way; landing (or handed off) after
    # the restart, it would put TIMES[:2] on the new store too.
    await proxy.writes.wait_idle()
    node = cluster3.nodes["store-1"]
    await node.restart(Store())  # back empty on the same port
    resp = await proxy.write(write_request(series, TIMES[2:4], labels=False))
    assert resp.samples_written == len(series) * 2 and not resp.unknown_ids
    await proxy.writes.wait_idle()
    assert all([t for t, _ in raw(node.store, lab)] == TIMES[2:4] for lab in series)


async def test_a_mismatched_id_or_malformed_batch_is_a_bad_request(cluster3: LocalCluster) -> None:
    proxy = cluster3.proxy()
    lab = workload(1)[0]
    bad = pb.WriteRequest(ids=[series_id(lab) ^ 1], counts=[1], timestamps=[TIMES[0]], values=[1.0])
    bad.series.add(id=series_id(lab) ^ 1).labels.extend(labels_to_pb(lab))
    with pytest.raises(BadRequest, match="does not match its labels"):
        await proxy.write(bad)
    good = write_request([lab], TIMES[:2], labels=True)
    good.counts[0] = 3
    with pytest.raises(BadRequest, match="counts add up to 3"):
        await proxy.write(good)
    backwards = write_request([lab], [TIMES[1], TIMES[0]], labels=True)  # the stores reject this one
    with pytest.raises(BadRequest, match="strictly increase"):
        await proxy.write(backwards)


def _brute_avg_of_max(series_samples: dict[int, list[tuple[int, float]]], times: list[int], window: int) -> list[float]:
    """avg over series of max_over_time(window), the float loop oracle."""
    out = []
    for t in times:
        per = [max(v for ts, v in s if t - window < ts <= t) for s in series_samples.values()
               if any(t - window < ts <= t for ts, _ in s)]
        out.append(sum(per) / len(per) if per else float("nan"))
    return out


async def test_an_aggregate_over_all_slots_equals_brute_force_and_one_store_holding_everything(
        cluster4: LocalCluster) -> None:
    proxy = cluster4.proxy()
    series = workload(120, namespaces=5)
    assert len({slot_of_labels(s, SLOTS) for s in series}) == SLOTS  # the workload covers every slot
    req = write_request(series, TIMES, labels=True)
    await proxy.write(req)
    # W = 2 of RF = 3: a replica still writing its part sends a digest that differs, and the digest
    # read falls back (the counters checked below); wait for the replicas to agree.
    await proxy.writes.wait_idle()
    single = LocalBackend(StoreAPI(Store()))
    await single.write(req)

    q = agg_request(TIMES[3], TIMES[-1], window_ms=40_000)
    q.query.series_fn = pb.SERIES_MAX
    got = await proxy.aggregate(q)
    cpu = {series_id(s): [(t, float(v)) for t, v in zip(TIMES, req.values[i * 12:(i + 1) * 12], strict=True)]
           for i, s in enumerate(series) if s[0][1] == "container_cpu_usage_seconds_total"}
    assert np.allclose(np.array(got.values), _brute_avg_of_max(cpu, list(got.timestamps), 40_000))

    for across, fn, group_by in [(pb.ACROSS_AVG, pb.SERIES_RATE, ["workload"]), (pb.ACROSS_SUM, pb.SERIES_AVG, []),
                                 (pb.ACROSS_QUANTILE, pb.SERIES_RATE, ["namespace"]),
                                 (pb.ACROSS_MAX, pb.SERIES_LAST, ["workload"])]:
        q = agg_request(TIMES[5], TIMES[-1], across=across, group_by=group_by)
        q.query.series_fn = fn
        q.quantile = 0.9
        a, b = await proxy.aggregate(q), await single.aggregate(q)
        assert [list(g.labels) for g in a.groups] == [list(g.labels) for g in b.groups]
        assert np.allclose(np.array(a.values), np.array(b.values), equal_nan=True)
        assert a.series_scanned == b.series_scanned

    ratio = agg_request(TIMES[-1], across=pb.ACROSS_SUM)
    ratio.denominator.matchers.extend(selector('resource="cpu"', "kube_pod_container_resource_requests"))
    ratio.denominator.series_fn = pb.SERIES_LAST
    ratio.denominator.window_ms = 300_000
    a, b = await proxy.aggregate(ratio), await single.aggregate(ratio)
    assert np.allclose(np.array(a.values), np.array(b.values)) and len(a.values) == 1
    # Replicas agreeing, every aggregate but the quantile was answered from one data replica per
    # slot and the others' digests, and equals the per-series merge's answer.
    assert proxy.counters["aggregate_digest_reads"] == 5 and proxy.counters["aggregate_digest_fallbacks"] == 0
    exact = cluster4.proxy(fast_settings(digest_reads=False))
    for q in (ratio, agg_request(TIMES[5], TIMES[-1], group_by=["workload"])):
        a, b = await proxy.aggregate(q), await exact.aggregate(q)
        assert [list(g.labels) for g in a.groups] == [list(g.labels) for g in b.groups]
        assert np.allclose(np.array(a.values), np.array(b.values), equal_nan=True)
        assert (a.series_scanned, a.samples_scanned) == (b.series_scanned, b.samples_scanned)
    assert exact.counters["aggregate_digest_reads"] == 0


async def test_list_series_label_values_and_rollups_are_the_union_of_the_slots(cluster4: LocalCluster) -> None:
    proxy = cluster4.proxy()
    series = workload(30)
    await proxy.write(write_request(series, TIMES, labels=True))
    requests = selector("", "kube_pod_container_resource_requests")
    listed = await proxy.list_series(pb.ListSeriesRequest(matchers=requests))
    assert sorted(s.id for s in listed.series) == sorted(series_id(s) for s in series[1::2])
    limited = await proxy.list_series(pb.ListSeriesRequest(matchers=selector('namespace="ns1"'), limit=3))
    assert len(limited.series) == 3
    values = await proxy.label_values(pb.LabelValuesRequest(name="pod"))
    assert list(values.values) == sorted(f"pod-{p}" for p in range(30))
    roll = await proxy.rollups(pb.ReadRequest(matchers=selector('pod="pod-7"'), start_ms=0, end_ms=2**62))
    assert sorted(s.id for s in roll.series) == sorted(series_id(s) for s in series[14:16])
    assert all(sum(s.count) == len(TIMES) for s in roll.series)
    # asked for columns, the proxy answers the same merge as a batch (the stores' batches are not
    # per-series messages: merged as such they made an empty answer)
    wide = pb.ReadRequest(matchers=selector('namespace="ns1"'), start_ms=0, end_ms=2**62)
    per_series = await proxy.rollups(wide)
    wide.columnar = True
    columns = await proxy.rollups(wide)
    assert columns.HasField("batch") and not columns.series and len(per_series.series) == 20
    a, b = rollups_from_response(columns), rollups_from_response(per_series)
    assert a.ids.tolist() == b.ids.tolist() and a.labels.to_list() == b.labels.to_list()
    for f in ("offsets", "hours", "min", "max", "sum", "count", "last"):
        assert getattr(a, f).tolist() == getattr(b, f).tolist(), f


async def test_a_query_pinned_to_one_pod_asks_only_its_slot(cluster4: LocalCluster) -> None:
    proxy = cluster4.proxy()
    series = workload(10)
    await proxy.write(write_request(series, TIMES, labels=True))
    asked: list[list[int]] = []
    real_read = proxy.reads.view.pool.get

    def spy(shard_map, member):  # type: ignore[no-untyped-def]
        backend = real_read(shard_map, member)

        class Spy:
            async def read(self, r: pb.ReadRequest) -> pb.ReadResponse:
                asked.append(list(r.slots.slots))
                return await backend.read(r)

        return Spy()

    proxy.reads.view.pool.get = spy  # type: ignore[method-assign]
    got = await proxy.read(pb.ReadRequest(matchers=selector('namespace="ns1",pod="pod-4"'), start_ms=0, end_ms=2**62))
    assert len(got.series) == 2
    slot = slot_of_labels(series[8], SLOTS)
    assert asked == [[slot], [slot]]


async def test_no_quorum_raises_unavailable_naming_the_slots(cluster3: LocalCluster) -> None:
    proxy = cluster3.proxy()
    series = workload(20)
    await proxy.write(write_request(series, TIMES[:2], labels=True))
    await cluster3.nodes["store-0"].stop()
    await cluster3.nodes["store-2"].stop()
    with pytest.raises(Unavailable) as e:
        await proxy.write(write_request(series, TIMES[2:3], labels=False))
    slots = sorted({slot_of_labels(s, SLOTS) for s in series})
    # store-1's ack may or may not have arrived before the two failures settled it
    assert re.match(f"write quorum not reached for {len(slots)} of {len(slots)} slots: slot {slots[0]} got [01] of 2 "
                    r"required acks \(store-0: .*UNAVAILABLE", str(e.value))
    with pytest.raises(Unavailable) as e:
        await proxy.read(pb.ReadRequest(matchers=selector("", "kube_pod_container_resource_requests"), end_ms=2**62))
    assert str(e.value).startswith(f"read quorum not reached for {SLOTS} of {SLOTS} slots: slot 0 got ")
    assert "slot 9 got" in str(e.value) and "and 6 more" in str(e.value)
    health = await proxy.health()
    assert health.status == pb.HealthResponse.NOT_SERVING
    assert "store-0=DOWN" in health.member and "store-1=SERVING" in health.member
    assert f"no read quorum for {SLOTS} slots" in health.member


async def test_health_and_stats_sum_the_members(cluster3: LocalCluster) -> None:
    proxy = cluster3.proxy()
    series = workload(10)
    await proxy.write(write_request(series, TIMES, labels=True))
    await proxy.writes.wait_idle()  # W = 2: the third copy, counted below, may still be on its way
    health = await proxy.health()
    assert health.status == pb.HealthResponse.SERVING
    assert "store-0=SERVING, store-1=SERVING, store-2=SERVING" in health.member
    stats = await proxy.stats()
    assert stats.series == 3 * len(series)  # raw: RF copies
    assert stats.samples == 3 * len(series) * len(TIMES)
    assert stats.rejected["proxy_writes"] == 1 and stats.rejected["proxy_members_unreachable"] == 0


async def test_the_proxy_served_over_grpc_takes_a_client_through_the_handshake(cluster3: LocalCluster) -> None:
    proxy = cluster3.proxy()
    server, port = await start_grpc_server(MetricsServicer(proxy), "127.0.0.1", 0)
    try:
        series = workload(15)
        labels_of = {series_id(s): labels_to_pb(s) for s in series}
        async with MetricsClient(f"127.0.0.1:{port}", timeout_s=5) as client:
            resp = await client.write(write_request(series, TIMES, labels=False), labels_of)
            assert resp.samples_written == len(series) * len(TIMES)
            got = await client.aggregate(agg_request(TIMES[-1], across=pb.ACROSS_SUM))
            await proxy.writes.wait_idle()  # W = 2: store-0 may be the replica still writing
            direct = await LocalBackend(StoreAPI(cluster3.nodes["store-0"].store)).aggregate(
                agg_request(TIMES[-1], across=pb.ACROSS_SUM))
            assert np.allclose(np.array(got.values), np.array(direct.values))
            assert (await client.health()).status == pb.HealthResponse.SERVING
    finally:
        await server.stop(None)


async def test_without_a_map_the_proxy_is_unavailable_and_not_serving(cluster3: LocalCluster) -> None:
    class NoMap:
        def current(self) -> None:
            return None

        async def wait_ready(self, timeout_s: float) -> None:
            raise TimeoutError

        async def refresh(self) -> None:
            return None

        async def close(self) -> None:
            return None

    from metricsd.clock import SystemClock
    from metricsd.proxy.backend import ProxyBackend

    proxy = ProxyBackend(NoMap(), fast_settings(), SystemClock())  # type: ignore[arg-type]
    with pytest.raises(Unavailable, match="no shard map yet"):
        await proxy.write(write_request(workload(1), TIMES[:1], labels=True))
    assert (await proxy.health()).status == pb.HealthResponse.NOT_SERVING
    await proxy.close()


class _Recording:
    """A real member's gRPC backend that keeps the Aggregate replies the proxy got from it."""

    def __init__(self, inner: MetricsBackend, replies: list[pb.AggregateResponse]) -> None:
        self.inner, self.replies = inner, replies

    async def aggregate(self, request: pb.AggregateRequest) -> pb.AggregateResponse:
        resp = await self.inner.aggregate(request)
        self.replies.append(resp)
        return resp

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


@pytest.mark.parametrize("digests", [True, False])
async def test_top_k_through_the_proxy_equals_one_store_and_only_pod_groups_go_to_the_stores(
        cluster4: LocalCluster, digests: bool) -> None:
    """topk pushed down: the stores send only their best groups when no group spans two slots
    (``by (pod)`` within one namespace); a group of several slots (``by (workload)``) is selected
    after the merge. Either way the answer is one store's, cut to the same groups."""
    series = workload(120, namespaces=2)
    req = write_request(series, TIMES, labels=True)
    single = LocalBackend(StoreAPI(Store()))
    await single.write(req)
    replies: list[pb.AggregateResponse] = []
    base = grpc_connect(2.0)
    proxy = cluster4.proxy(fast_settings(digest_reads=digests), connect=lambda a: _Recording(base(a), replies))  # type: ignore[arg-type,return-value]
    await proxy.write(req)
    await proxy.writes.wait_idle()
    for group_by, ns, local in ((["pod"], 'namespace="ns1"', True), (["workload"], "", False),
                                (["namespace", "pod"], "", True)):
        for top in (True, False):
            q = agg_request(TIMES[5], TIMES[-1], across=pb.ACROSS_SUM, group_by=group_by)
            del q.query.matchers[:]
            q.query.matchers.extend(selector(ns, "container_cpu_usage_seconds_total"))
            whole = await single.aggregate(q)
            q.top_k, q.bottom_k = (3, 0) if top else (0, 3)
            want = await single.aggregate(q)
            assert 0 < len(want.groups) < len(whole.groups)
            replies.clear()
            got = await proxy.aggregate(q)
            assert [list(g.labels) for g in got.groups] == [list(g.labels) for g in want.groups]
            np.testing.assert_allclose(np.array(got.values), np.array(want.values), equal_nan=True)
            most = max(len(r.groups) for r in replies)
            if digests and local:  # each data replica sent at most its own best 3 per time
                assert most <= 3 * len(TIMES[5:])
                assert sum(len(r.groups) for r in replies) < len(whole.groups)
            else:
                assert most > len(want.groups)
    assert proxy.counters["aggregate_digest_fallbacks"] == 0
