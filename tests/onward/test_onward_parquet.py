"""Hourly Parquet: a store holding two hours of the simulated cluster writes one file set per closed
hour (to a directory and to fsspec's in-memory store); DuckDB, knowing nothing of metricsd, reads
them and counts every sample and every rollup; an hour already written is not written again."""

from __future__ import annotations

from pathlib import Path

import duckdb
import fsspec
import numpy as np
import pyarrow.parquet as pq

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.clock import ManualClock
from metricsd.onward.hourly import HOUR_MS, HourlyParquet
from metricsd.onward.parquet import SAMPLES_SCHEMA
from metricsd.proto import metricsd_pb2 as pb
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

NOW = 1_790_002_800_000 + 3_000_000  # 50 minutes into an hour


async def _backend() -> tuple[LocalBackend, int]:
    backend = LocalBackend(StoreAPI(Store(), "t", ManualClock(NOW)))
    sim = Simulator(SimConfig(pods=12, containers=2, jitter_ms=300), NOW - 2 * HOUR_MS - 1_200_000)
    written = 0
    while sim.next_timestamp_ms < NOW:
        ts, values = sim.block(30)
        for req in write_requests(sim, ts, values, max_samples=50_000, send_labels_for=None):
            await backend.write(req)
            written += len(req.timestamps)
    return backend, written


def _in_hour(backend: LocalBackend, hour: int) -> tuple[int, int]:
    got = backend.api.read(pb.ReadRequest(matchers=[pb.Matcher(type=pb.Matcher.RE, name="__name__", value=".+")],
                                          start_ms=hour, end_ms=hour + HOUR_MS - 1))
    return sum(len(s.timestamps) for s in got.series), sum(1 for s in got.series if len(s.timestamps))


async def test_duckdb_reads_every_sample_of_each_closed_hour(tmp_path: Path) -> None:
    backend, _ = await _backend()
    writer = HourlyParquet(backend, str(tmp_path / "pq"), ManualClock(NOW), delay_s=600)
    due = writer.due()
    closed = NOW // HOUR_MS * HOUR_MS - HOUR_MS  # the hour that ended 50 minutes ago
    assert due[-1] == closed and closed - HOUR_MS in due
    for hour in (closed - HOUR_MS, closed):
        await writer.write_hour(hour)
    assert writer.due() == [h for h in due if h not in (closed - HOUR_MS, closed)]  # written once
    con = duckdb.connect()
    for hour in (closed - HOUR_MS, closed):
        samples, series = _in_hour(backend, hour)
        assert samples > 10_000
        day = np.datetime64(hour, "ms").astype("datetime64[h]").item()
        n, s, lo, hi = con.execute(
            "SELECT count(*), count(DISTINCT (metric, namespace, pod, container, labels)), min(timestamp), "
            f"max(timestamp) FROM read_parquet('{tmp_path}/pq/samples/*/*/*.parquet', hive_partitioning=true) "
            f"WHERE dt = '{day:%Y-%m-%d}' AND hour = {day.hour}").fetchone()
        assert (n, s) == (samples, series)
        assert lo.timestamp() * 1000 >= hour and hi.timestamp() * 1000 < hour + HOUR_MS
        (rolled,) = con.execute(
            f"SELECT sum(count) FROM read_parquet('{tmp_path}/pq/rollups/*/*/*.parquet', hive_partitioning=true) "
            f"WHERE dt = '{day:%Y-%m-%d}' AND hour = {day.hour}").fetchone()
        assert rolled == samples
    (cpu,) = con.execute(
        "SELECT count(*) FROM read_parquet('" + str(tmp_path) + "/pq/samples/*/*/*.parquet') "
        "WHERE metric = 'kube_pod_container_resource_requests' AND labels['resource'] = 'cpu'").fetchone()
    assert cpu > 0
    files = sorted(p.relative_to(tmp_path / "pq").as_posix() for p in (tmp_path / "pq").rglob("*") if p.is_file())
    assert all(".tmp" not in f for f in files) and len(files) == 6
    assert pq.read_schema(tmp_path / "pq" / files[-1]).equals(SAMPLES_SCHEMA, check_metadata=False)


async def test_the_files_go_through_fsspec_to_any_store_it_opens() -> None:
    backend, _ = await _backend()
    closed = NOW // HOUR_MS * HOUR_MS - HOUR_MS
    writer = HourlyParquet(backend, "memory://metricsd-test/pq", ManualClock(NOW))
    files = await writer.write_hour(closed)
    fs = fsspec.filesystem("memory")
    found = sorted(fs.find("/metricsd-test/pq"))
    assert [p.rsplit("/", 1)[1] for p in found] == ["part-0.parquet", "_SUCCESS", "part-0.parquet"]
    with fs.open(found[2], "rb") as f:  # samples/.../part-0.parquet
        table = pq.read_table(f)
    assert table.num_rows == files.manifest["samples"] == _in_hour(backend, closed)[0]
    assert closed not in writer.due()
