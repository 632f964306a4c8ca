"""Remote write through a proxy: the receiver's columns routed by slot to real stores over gRPC.

The receiver hands the proxy a WriteColumns (no message in between); the proxy sends each store the
series of the slots it holds as wire bytes built from the columns, labels once per series per
store, and the handshake still works when a store or the proxy forgot the series."""

from __future__ import annotations

import cramjam
import numpy as np
from prometheus_client import CollectorRegistry
from proxy_cluster import LocalCluster, raw, workload

from metricsd.http.remote_write import RemoteWriteReceiver
from metricsd.http.selfmetrics import SelfMetrics
from metricsd.http.settings import HttpSettings
from metricsd.model import Labels
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import prometheus_remote_pb2 as prom
from metricsd.proxy.backend import ProxyBackend
from metricsd.store.engine import Store

T0 = 1_700_000_000_000


def _body(series: list[Labels], times: list[int], value: float = 0.0) -> bytes:
    req = prom.WriteRequest()
    for i, lab in enumerate(series):
        ts = req.timeseries.add()
        ts.labels.extend(prom.Label(name=k, value=v) for k, v in lab)
        ts.samples.extend(prom.Sample(timestamp=t, value=value + i + k / 10) for k, t in enumerate(times))
    return bytes(cramjam.snappy.compress_raw(req.SerializeToString()))


def _receiver(proxy: ProxyBackend) -> RemoteWriteReceiver:
    return RemoteWriteReceiver(proxy, HttpSettings(access_log=False), SelfMetrics(CollectorRegistry()))


class Recorder:
    """Wraps every store's write so a test sees what each store was sent."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.sent: dict[str, list[pb.WriteRequest]] = {m: [] for m in cluster.nodes}
        for member, node in cluster.nodes.items():
            self._wrap(member, node.store)

    def _wrap(self, member: str, store: Store) -> None:
        write = store.write
        sent = self.sent[member]

        def recording(ids, counts, timestamps, values, new_series=None, now_s=None, runs=()):  # type: ignore[no-untyped-def]
            sent.append(pb.WriteRequest(ids=ids.tolist(), series=[pb.SeriesLabels(id=i) for i in (new_series or {})]))
            return write(ids, counts, timestamps, values, new_series, now_s=now_s, runs=runs)

        store.write = recording  # type: ignore[method-assign]

    def labelled(self, member: str) -> list[int]:
        return [s.id for req in self.sent[member] for s in req.series]


async def test_remote_write_through_the_proxy_lands_on_each_slots_replicas_with_labels_once(
        cluster4: LocalCluster) -> None:
    proxy = cluster4.proxy()
    rw = _receiver(proxy)
    rec = Recorder(cluster4)
    series = workload(30)  # 60 series over 16 slots; 4 stores, RF 3: each store gets a part
    times = [T0 + 10_000 * k for k in range(60)]
    for block in range(3):
        written = await rw.ingest(_body(series, times[20 * block: 20 * block + 20], value=100.0 * block))
        assert written == len(series) * 20
        # W = 2 of RF 3 answers before the third replica: until that one acknowledges a series'
        # labels, the next block carries them to it again (safe, and what a loaded machine showed:
        # every label twice on one store). Labels go once per series to a member that has answered.
        await proxy.writes.wait_idle()
    for i, lab in enumerate(series):
        want = [(t, 100.0 * (k // 20) + i + (k % 20) / 10) for k, t in enumerate(times)]
        holders = set(cluster4.holders(lab))
        for member, node in cluster4.nodes.items():
            assert raw(node.store, lab) == (want if member in holders else [])
    for member in cluster4.nodes:  # labels went to each store once per series, with its first part
        labelled = rec.labelled(member)
        assert len(labelled) == len(set(labelled)) == cluster4.nodes[member].store.index.n_alive > 0


async def test_a_store_restarted_empty_and_a_proxy_that_forgot_get_the_labels_again(cluster3: LocalCluster) -> None:
    proxy = cluster3.proxy()
    rw = _receiver(proxy)
    series = workload(10)
    await rw.ingest(_body(series, [T0]))
    await proxy.writes.wait_idle()
    await cluster3.nodes["store-1"].restart(Store())  # a new disk: it forgot every series
    assert await rw.ingest(_body(series, [T0 + 10_000])) == len(series)
    await proxy.writes.wait_idle()
    assert all(raw(cluster3.nodes["store-1"].store, lab) == [(T0 + 10_000, float(i))] for i, lab in enumerate(series))
    fresh = cluster3.proxy()  # a proxy that never saw the series: the receiver's cached ids alone
    rw.backend = fresh
    assert await rw.ingest(_body(series, [T0 + 20_000])) == len(series)
    assert rw.label_resends == 1
    await fresh.writes.wait_idle()
    for node in cluster3.nodes.values():
        assert [t for t, _ in raw(node.store, series[0])][-1] == T0 + 20_000


async def test_columns_with_the_senders_timestamp_bytes_reach_the_stores_unchanged(cluster4: LocalCluster) -> None:
    """Timestamps of several varint sizes (a negative one takes ten bytes) and of one size, split by
    slot: every store reads back exactly what was sent."""
    proxy = cluster4.proxy()
    rw = _receiver(proxy)
    series = workload(12)
    for times in ([5, 300, 70_000, 2**40], [T0, T0 + 1]):
        await rw.ingest(_body(series, times))
    await proxy.writes.wait_idle()
    for i, lab in enumerate(series):
        got = raw(cluster4.nodes[cluster4.holders(lab)[0]].store, lab)
        assert [t for t, _ in got] == sorted([T0, T0 + 1, 5, 300, 70_000, 2**40])
        assert np.allclose([v for t, v in got if t >= T0], [i, i + 0.1])
