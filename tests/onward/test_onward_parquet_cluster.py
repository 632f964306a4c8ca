"""The hourly Parquet of a cluster's proxy: real stores over real gRPC and read ports on loopback
(three, RF 3) and a real ProxyBackend in front of them. The proxy's reads of the hour ask for
columns (ReadRequest.columnar: one SeriesBatch per store, merged as arrays), never a protobuf
message per series, and the files hold exactly what a store's own columnar read of the hour
(`metricsd up`'s path) gives."""

from __future__ import annotations

import asyncio
import io
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "proxy"))

from proxy_cluster import SLOTS, LocalCluster, StoreNode, make_map, start_cluster, workload, write_request

from metricsd.clock import SystemClock
from metricsd.cluster.mapsource import StaticMapSource
from metricsd.maths.slots import slot_of_labels
from metricsd.model import Labels
from metricsd.onward.hourly import HOUR_MS, hour_files, store_columns
from metricsd.onward.parquet import HourFiles
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.hourread import HourRead
from metricsd.replica.servicer import StoreNodeServicer
from metricsd.rpc.backend import MetricsBackend
from metricsd.rpc.server import start_grpc_server
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store


class _Asked:
    """The proxy's message methods, with the reads it was asked for written down."""

    def __init__(self, inner: MetricsBackend) -> None:
        self.inner = inner
        self.reads: list[pb.ReadRequest] = []

    async def read(self, req: pb.ReadRequest) -> pb.ReadResponse:
        self.reads.append(req)
        return await self.inner.read(req)

    async def list_series(self, req: pb.ListSeriesRequest) -> pb.ListSeriesResponse:
        return await self.inner.list_series(req)

    async def rollups(self, req: pb.ReadRequest) -> pb.RollupsResponse:
        return await self.inner.rollups(req)


async def test_a_proxy_writes_the_hour_from_columnar_reads_of_its_stores() -> None:
    cluster: LocalCluster = await start_cluster(3, rf=3)
    try:
        proxy = cluster.proxy()
        hour = (int(time.time() * 1000) // HOUR_MS - 2) * HOUR_MS
        series = workload(30)  # 60 series over 3 namespaces
        # Two writes: the hour's samples, and one after it (not in the file).
        await proxy.write(write_request(series, [hour + k * 60_000 + 17 for k in range(60)], labels=True))
        await proxy.write(write_request(series, [hour + HOUR_MS + 5], labels=False))
        await _held_everywhere(cluster, 61 * len(series))  # W = 2: the third may still be writing
        asked = _Asked(proxy)
        files = await hour_files(asked, hour)  # type: ignore[arg-type]
        assert asked.reads and all(r.columnar for r in asked.reads)
        assert files.manifest["samples"] == 60 * len(series) and files.manifest["series"] == len(series)
        store = cluster.nodes["store-0"].store  # RF 3: every store holds every series
        local = LocalBackend(StoreAPI(store, "store-0", SystemClock()))
        want = await hour_files(local, hour, store_columns(store))
        got_table, want_table = pq.read_table(io.BytesIO(files.samples)), pq.read_table(io.BytesIO(want.samples))
        assert got_table.num_rows == 60 * len(series)
        assert got_table.equals(want_table)
        assert files.rollups == want.rollups
    finally:
        await cluster.close()


async def _digesting_cluster() -> LocalCluster:
    """start_cluster's three stores (RF 3), each served as a cluster's store is: the Metrics API
    and the store-to-store RPCs (Digest) on one real gRPC server (replica/servicer.py)."""
    nodes = {f"store-{i}": StoreNode(f"store-{i}", Store()) for i in range(3)}
    for n in nodes.values():
        api = StoreAPI(n.store, n.member, SystemClock())
        n.server, n.port = await start_grpc_server(StoreNodeServicer(LocalBackend(api), api), "127.0.0.1", 0)
    shard_map = make_map(list(nodes.values()), 3)
    return LocalCluster(nodes, shard_map, StaticMapSource(shard_map))


async def _own_hour(store: Store, hour: int) -> HourFiles:
    """The hour as one store's own columnar read gives it (``metricsd up``'s path)."""
    return await hour_files(LocalBackend(StoreAPI(store, "s", SystemClock())), hour, store_columns(store))


async def _an_hour(cluster: LocalCluster, proxy: MetricsBackend) -> tuple[int, list[Labels]]:
    """(the hour two hours ago, the series written): a sample a minute of 60 series in it, held by
    all three replicas. The proxy acknowledges at W = 2, so the third replica's write may still be
    in flight when it returns; the tests below start from every replica holding it."""
    hour = (int(time.time() * 1000) // HOUR_MS - 2) * HOUR_MS
    series = workload(30)
    await proxy.write(write_request(series, [hour + k * 60_000 + 17 for k in range(60)], labels=True))
    await _held_everywhere(cluster, 60 * len(series))
    return hour, series


async def _held_everywhere(cluster: LocalCluster, samples: int) -> None:
    deadline = time.monotonic() + 30
    while any(int(n.store.stats()["samples"]) < samples for n in cluster.nodes.values()):
        assert time.monotonic() < deadline, {m: n.store.stats()["samples"] for m, n in cluster.nodes.items()}
        await asyncio.sleep(0.02)


async def test_the_hour_read_takes_each_slot_from_one_replica_that_the_others_digests_vouch_for() -> None:
    cluster = await _digesting_cluster()
    try:
        proxy = cluster.proxy()
        hour, series = await _an_hour(cluster, proxy)
        await proxy.write(write_request(series, [hour + HOUR_MS + 5], labels=False))
        files = await hour_files(proxy, hour, source=HourRead(proxy.reads))
        slots_with_data = len({slot_of_labels(s, SLOTS) for s in series})
        assert proxy.counters["hour_read_digest_slots"] == SLOTS and proxy.counters["hour_read_quorum_slots"] == 0
        assert slots_with_data > 3
        want = await _own_hour(cluster.nodes["store-0"].store, hour)
        assert pq.read_table(io.BytesIO(files.samples)).equals(pq.read_table(io.BytesIO(want.samples)))
        assert files.rollups == want.rollups
        assert files.manifest["samples"] == 60 * len(series)
    finally:
        await cluster.close()


async def test_a_replica_missing_samples_of_the_hour_is_read_by_quorum_and_every_acknowledged_sample_is_in_the_file(
        ) -> None:
    cluster = await _digesting_cluster()
    try:
        proxy = cluster.proxy()
        hour, series = await _an_hour(cluster, proxy)
        # acknowledged by W = 2 of the 3 replicas: store-0 missed them (down for the write, say)
        late = write_request(series, [hour + k * 60_000 + 30_017 for k in range(0, 60, 7)], labels=False)
        for member in ("store-1", "store-2"):
            api = StoreAPI(cluster.nodes[member].store, member, SystemClock())
            assert (await LocalBackend(api).write(late)).samples_written == len(late.timestamps)
        files = await hour_files(proxy, hour, source=HourRead(proxy.reads))
        # the slots whose replicas asked include store-0 (R = 2 of 3: most of them) are read by quorum
        assert 0 < proxy.counters["hour_read_quorum_slots"] <= len({slot_of_labels(s, SLOTS) for s in series})
        want = await _own_hour(cluster.nodes["store-1"].store, hour)
        got = pq.read_table(io.BytesIO(files.samples))
        assert got.num_rows == (60 + 9) * len(series) == files.manifest["samples"]
        assert got.equals(pq.read_table(io.BytesIO(want.samples)))
        # and the quorum read repaired store-0 (in the background): the next hour read agrees everywhere
        for _ in range(200):
            if int(cluster.nodes["store-0"].store.stats()["samples"]) == (60 + 9) * len(series):
                break
            await asyncio.sleep(0.02)
        again = await hour_files(proxy, hour, source=HourRead(proxy.reads))
        assert proxy.counters["hour_read_digest_slots"] == 2 * SLOTS - proxy.counters["hour_read_quorum_slots"]
        assert pq.read_table(io.BytesIO(again.samples)).equals(got)
    finally:
        await cluster.close()
