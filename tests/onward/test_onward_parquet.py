"""Hourly Parquet: a store holding two hours of the simulated cluster writes one file set per closed
hour (to a directory and to fsspec's in-memory store); DuckDB, knowing nothing of metricsd, reads
them and counts every sample and every rollup; an hour already written is not written again."""

from __future__ import annotations

import io
from pathlib import Path

import duckdb
import fsspec
import numpy as np
import pyarrow.parquet as pq
import pytest

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.clock import ManualClock
from metricsd.model import make_labels
from metricsd.onward import parquet
from metricsd.onward.hourly import HOUR_MS, HourlyParquet, hour_files, store_columns
from metricsd.onward.parquet import LABEL_COLUMNS, SAMPLES_SCHEMA, SampleColumns
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import matchers_from_pb
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store
from metricsd.store.hourread import StoreHour

NOW = 1_790_002_800_000 + 3_000_000  # 50 minutes into an hour
_ALL_PB = [pb.Matcher(type=pb.Matcher.RE, name="__name__", value=".+")]


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
            "SELECT count(*), count(DISTINCT (metric, namespace, pod, container, resource, unit, labels)), "
            "min(timestamp), max(timestamp) "
            f"FROM read_parquet('{tmp_path}/pq/samples/*/*/*.parquet', hive_partitioning=true) "
            f"WHERE dt = '{day:%Y-%m-%d}' AND hour = {day.hour}").fetchone()
        assert (n, s) == (samples, series)
        assert lo.timestamp() * 1000 >= hour and hi.timestamp() * 1000 < hour + HOUR_MS
        (rolled,) = con.execute(
            f"SELECT sum(count) FROM read_parquet('{tmp_path}/pq/rollups/*/*/*.parquet', hive_partitioning=true) "
            f"WHERE dt = '{day:%Y-%m-%d}' AND hour = {day.hour}").fetchone()
        assert rolled == samples
    (cpu,) = con.execute(
        "SELECT count(*) FROM read_parquet('" + str(tmp_path) + "/pq/samples/*/*/*.parquet') "
        "WHERE metric = 'kube_pod_container_resource_requests' AND resource = 'cpu'").fetchone()
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


async def test_every_sample_is_in_its_series_rows_and_a_columnar_read_writes_the_same_file() -> None:
    """Row for row: each series' labels and samples as the store holds them, in label order; and
    the hour built from Store.read's arrays (hourly.store_columns) is the same table as the one
    built from the backend's columnar read (StoreAPI.read_columns, as `metricsd up` does)."""
    backend, _ = await _backend()
    closed = NOW // HOUR_MS * HOUR_MS - HOUR_MS
    store = backend.api.store
    via_pb = await hour_files(backend, closed)
    via_columns = await hour_files(backend, closed, store_columns(store))
    a, b = pq.read_table(io.BytesIO(via_pb.samples)), pq.read_table(io.BytesIO(via_columns.samples))
    assert a.equals(b) and via_pb.rollups == via_columns.rollups
    want = sorted((s.labels, s.timestamps.tolist(), s.values.tobytes())
                  for s in store.read(matchers_from_pb(_ALL_PB), closed, closed + HOUR_MS - 1) if len(s.timestamps))
    rows = a.to_pydict()
    got: dict[tuple[tuple[str, str], ...], tuple[list[int], list[float]]] = {}
    for i in range(a.num_rows):
        labels = tuple(sorted([(k, rows[k][i]) for k in LABEL_COLUMNS if rows[k][i] is not None]
                              + [("__name__", rows["metric"][i])] + list(rows["labels"][i])))
        ts, vs = got.setdefault(labels, ([], []))
        ts.append(int(rows["timestamp"][i].timestamp() * 1000))
        vs.append(rows["value"][i])
    assert [k for k in got] == sorted(got)  # series in label order
    assert sorted((k, ts, np.array(vs).tobytes()) for k, (ts, vs) in got.items()) == want
    # and `metricsd up`'s read of the whole hour (the store's rows, no selector) writes the same files
    whole = await hour_files(backend, closed, source=StoreHour(backend.api, series_per_read=7))
    assert whole.samples == via_pb.samples and whole.rollups == via_pb.rollups
    assert whole.manifest["samples"] == via_pb.manifest["samples"] == a.num_rows


def test_a_file_written_a_row_group_at_a_time_holds_the_same_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    counts = rng.integers(0, 700, 60)
    counts[7] = 2_500  # longer than a row group: a row group of its own
    labels = [make_labels("m" if i % 3 else "n", {"namespace": f"ns{i % 4}", "pod": f"p{i}", **(
        {"resource": "cpu", "device": f"d{i % 3}"} if i % 5 == 0 else {})}) for i in range(60)]
    ts = np.concatenate([np.arange(c, dtype=np.int64) * 10_000 + HOUR_MS for c in counts])
    cols = SampleColumns(labels, counts.astype(np.int64), ts, rng.standard_normal(len(ts)))
    whole = pq.read_table(io.BytesIO(parquet.to_parquet(cols)))
    monkeypatch.setattr(parquet, "ROW_GROUP_ROWS", 1_000)
    data = parquet.to_parquet(cols)
    assert pq.ParquetFile(io.BytesIO(data)).metadata.num_row_groups >= counts.sum() // 1_000
    assert pq.read_table(io.BytesIO(data)).to_pylist() == whole.to_pylist()
    assert whole.num_rows == counts.sum()
    # labels without a column of their own go in the `labels` map, per row
    rows = whole.select(["pod", "resource", "labels"]).to_pylist()
    assert {(r["pod"], r["resource"], tuple(r["labels"])) for r in rows} == {
        (f"p{i}", "cpu" if i % 5 == 0 else None, ((("device", f"d{i % 3}"),) if i % 5 == 0 else ()))
        for i in range(60) if counts[i]}


async def test_the_files_are_encoded_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Encoding an hour takes seconds; on the event loop it held back the process's requests and
    its election lease's keep-alive (another proxy then wrote the same hour at once)."""
    import threading

    from metricsd.onward import hourly

    backend, _ = await _backend()
    loop_thread = threading.current_thread()
    threads: list[threading.Thread] = []
    encode = hourly.to_parquet

    def spy(cols: SampleColumns) -> bytes:
        threads.append(threading.current_thread())
        return encode(cols)

    monkeypatch.setattr(hourly, "to_parquet", spy)
    files = await hour_files(backend, NOW // HOUR_MS * HOUR_MS - HOUR_MS)
    assert len(threads) == 2 and loop_thread not in threads and files.manifest["samples"]
