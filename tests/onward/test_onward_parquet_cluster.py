"""The hourly Parquet of a cluster's proxy: real stores over real gRPC and read ports on loopback
(three, RF 3) and a real ProxyBackend in front of them. The proxy's reads of the hour ask for
columns (ReadRequest.columnar: one SeriesBatch per store, merged as arrays), never a protobuf
message per series, and the files hold exactly what a store's own columnar read of the hour
(`metricsd up`'s path) gives."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "proxy"))

from proxy_cluster import LocalCluster, start_cluster, workload, write_request

from metricsd.clock import SystemClock
from metricsd.onward.hourly import HOUR_MS, hour_files, store_columns
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import MetricsBackend
from metricsd.store.api import LocalBackend, StoreAPI


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
