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

from proxy_cluster import (
    SLOTS,
    LocalCluster,
    RefreshingSource,
    StoreNode,
    fast_settings,
    make_map,
    moved_maps,
    start_cluster,
    workload,
    write_request,
)

from metricsd.clock import SystemClock
from metricsd.cluster.mapsource import StaticMapSource
from metricsd.maths.slots import slot_of_labels
from metricsd.model import Labels
from metricsd.onward.hourly import HOUR_MS, hour_files, store_columns
from metricsd.onward.parquet import HourFiles
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.hourread import HourRead
from metricsd.proxy.members import SlotNotHeld, grpc_connect
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


async def _digesting_cluster(members: int = 3) -> LocalCluster:
    """start_cluster's stores (RF 3), each served as a cluster's store is: the Metrics API and the
    store-to-store RPCs (Digest) on one real gRPC server (replica/servicer.py)."""
    nodes = {f"store-{i}": StoreNode(f"store-{i}", Store()) for i in range(members)}
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
    """Until the stores hold RF 3 copies of ``samples`` between them (with three stores: each all)."""
    deadline = time.monotonic() + 30
    while sum(int(n.store.stats()["samples"]) for n in cluster.nodes.values()) < 3 * samples:
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


class _NoLongerHolds:
    """A real store's gRPC client that answers for one slot as a store the slot has moved away
    from (SlotNotHeld: FAILED_PRECONDITION over gRPC): its Digest, Read and Rollups of that slot."""

    def __init__(self, backend: MetricsBackend, slot: int) -> None:
        self.backend = backend
        self.slot = slot

    def __getattr__(self, name: str) -> object:
        return getattr(self.backend, name)

    def _refuse(self, request: pb.ReadRequest | pb.DigestRequest) -> None:
        if self.slot in request.slots.slots:
            raise SlotNotHeld(f"slot {self.slot} is not held here")

    async def digest(self, request: pb.DigestRequest) -> pb.DigestResponse:
        self._refuse(request)
        got: pb.DigestResponse = await self.backend.digest(request)  # type: ignore[attr-defined]
        return got

    async def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        self._refuse(request)
        return await self.backend.read(request)

    async def rollups(self, request: pb.ReadRequest) -> pb.RollupsResponse:
        self._refuse(request)
        return await self.backend.rollups(request)


async def test_a_stale_map_refreshes_once_and_the_hour_is_read_whole() -> None:
    """Four stores, RF 3: in the proxy's stale map one slot is still on a member it moved away from.
    Every replica of that slot must answer (R = 3: no spare to make up for it), so the first read of
    the hour fails on it; the proxy refreshes its map and reads the hour again, every sample in it."""
    cluster = await _digesting_cluster(4)
    try:
        hour, series = await _an_hour(cluster, cluster.proxy())
        slot = slot_of_labels(series[0], SLOTS)
        stale, fresh, old_owner, _ = moved_maps(cluster, slot)
        base, old_address = grpc_connect(2.0), fresh.address(old_owner)

        def connect(address: str) -> MetricsBackend:
            b = base(address)
            return _NoLongerHolds(b, slot) if address == old_address else b  # type: ignore[return-value]

        source = RefreshingSource(stale, fresh)
        proxy = cluster.proxy(fast_settings(w=1, r=3), connect=connect, source=source)
        files = await hour_files(proxy, hour, source=HourRead(proxy.reads))
        assert source.refreshes == 1 and proxy.counters["stale_map_retries"] == 1
        assert files.manifest["samples"] == 60 * len(series) and files.manifest["series"] == len(series)
        assert pq.read_table(io.BytesIO(files.samples)).num_rows == 60 * len(series)
    finally:
        await cluster.close()
