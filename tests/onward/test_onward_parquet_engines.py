"""Hourly Parquet read by Polars and by Spark, the two offline engines besides DuckDB the files are
for (FORMAT.md, "Reading without metricsd"). metricsd writes two closed hours of the simulated
cluster and says what the store holds for each (samples, series, the values' sum, the samples of
`resource=cpu` requests); the engines, given only the directory, must find the same in the
`samples` and `rollups` files through their own Hive partition discovery (`dt=`, `hour=`), read the
`labels` map as a map and the time column as a UTC timestamp. The reading parts import nothing of
metricsd.

Spark needs a Java runtime and pyspark (`make spark-deps`); without them its test is skipped,
saying so."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from test_onward_parquet import NOW, _backend

from metricsd.clock import ManualClock
from metricsd.onward.hourly import HOUR_MS, HourlyParquet
from metricsd.proto import metricsd_pb2 as pb
from metricsd.store.api import StoreAPI


@dataclass(frozen=True)
class Hour:
    """What the store holds for one hour, as metricsd reads it: what an engine must find."""

    start_ms: int
    day: str  # the dt= partition
    hour: int  # the hour= partition
    samples: int
    series: int
    value_sum: float
    cpu_requests: int  # samples of kube_pod_container_resource_requests{resource="cpu"}


def _held(api: StoreAPI, hour_ms: int) -> Hour:
    def read(*matchers: pb.Matcher) -> list[pb.SeriesData]:
        got = api.read(pb.ReadRequest(matchers=list(matchers), start_ms=hour_ms, end_ms=hour_ms + HOUR_MS - 1))
        return [s for s in got.series if len(s.timestamps)]

    every = read(pb.Matcher(type=pb.Matcher.RE, name="__name__", value=".+"))
    cpu = read(pb.Matcher(type=pb.Matcher.EQ, name="__name__", value="kube_pod_container_resource_requests"),
               pb.Matcher(type=pb.Matcher.EQ, name="resource", value="cpu"))
    values = np.concatenate([np.asarray(s.values, dtype=np.float64) for s in every])
    assert np.isfinite(values).all()  # the simulated cluster writes no NaN: a plain sum compares
    start = dt.datetime.fromtimestamp(hour_ms / 1000, dt.UTC)
    return Hour(hour_ms, f"{start:%Y-%m-%d}", start.hour, len(values), len(every), float(values.sum()),
                sum(len(s.timestamps) for s in cpu))


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Hour]]]:
    """Two closed hours written by metricsd's writer, and what the store holds for each."""
    root = tmp_path_factory.mktemp("engines") / "pq"

    async def write() -> list[Hour]:
        backend, _ = await _backend()
        writer = HourlyParquet(backend, str(root), ManualClock(NOW), delay_s=600)
        closed = NOW // HOUR_MS * HOUR_MS - HOUR_MS
        hours = [closed - HOUR_MS, closed]
        for h in hours:
            await writer.write_hour(h)
        return [_held(backend.api, h) for h in hours]

    hours = asyncio.run(write())
    assert all(h.samples > 10_000 and h.cpu_requests > 0 for h in hours)
    yield root, hours


def test_polars_reads_every_sample_and_rollup_of_each_closed_hour(written: tuple[Path, list[Hour]]) -> None:
    import polars as pl

    root, hours = written
    samples = pl.scan_parquet(f"{root}/samples/**/*.parquet", hive_partitioning=True)
    rollups = pl.scan_parquet(f"{root}/rollups/**/*.parquet", hive_partitioning=True)
    schema = samples.collect_schema()
    assert rollups.collect_schema()["hour_start"] == pl.Datetime("ms", "UTC")
    assert schema["labels"] == pl.Map(pl.String, pl.String)  # Polars 2's map type
    assert schema["timestamp"] == pl.Datetime("ms", "UTC")
    assert schema["value"] == pl.Float64
    for h in hours:
        in_hour = (pl.col("dt").cast(pl.String) == h.day) & (pl.col("hour") == h.hour)
        got = samples.filter(in_hour).select(
            n=pl.len(),
            series=pl.struct("metric", "namespace", "pod", "container", "node", "workload", "cluster", "resource",
                             "unit", "labels").n_unique(),
            total=pl.col("value").sum(),
            lo=pl.col("timestamp").min(),
            hi=pl.col("timestamp").max(),
        ).collect().row(0, named=True)
        assert (got["n"], got["series"]) == (h.samples, h.series)
        assert math.isclose(got["total"], h.value_sum, rel_tol=1e-9)
        assert h.start_ms <= got["lo"].timestamp() * 1000 and got["hi"].timestamp() * 1000 < h.start_ms + HOUR_MS
        cpu = samples.filter(in_hour & (pl.col("metric") == "kube_pod_container_resource_requests")).select(
            pl.col("resource").cast(pl.String)).filter(pl.col("resource") == "cpu").select(pl.len()).collect().item()
        assert cpu == h.cpu_requests
        rolled = rollups.filter(in_hour).select(pl.col("count").sum(), pl.col("sum").sum(), pl.len(),
                                                pl.col("hour_start").unique()).collect()
        assert rolled.height == 1 and rolled.row(0)[:3] == (h.samples, pytest.approx(h.value_sum, rel=1e-9), h.series)
        assert rolled.row(0)[3].timestamp() * 1000 == h.start_ms
    # the eager reader of one file agrees with the lazy scan
    one = pl.read_parquet(next((root / "samples").rglob("*.parquet")))
    assert one.height in {h.samples for h in hours} and one.schema["labels"] == schema["labels"]


SPARK_MISSING = (shutil.which("java") is None and "java is not installed") or None
try:
    import pyspark  # noqa: F401
except ImportError:
    SPARK_MISSING = SPARK_MISSING or "pyspark is not installed"


@pytest.mark.slow
@pytest.mark.skipif(SPARK_MISSING is not None, reason=f"{SPARK_MISSING}: run `make spark-deps` (as root for the JRE)")
def test_spark_reads_every_sample_and_rollup_of_each_closed_hour(written: tuple[Path, list[Hour]],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql import Column, SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    root, hours = written
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")  # read by the JVM pyspark starts: loopback only
    spark = (SparkSession.builder.master("local[1]").appName("metricsd-parquet-test")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.shuffle.partitions", "1").getOrCreate())
    try:
        samples = spark.read.parquet(f"{root}/samples")  # partitions discovered: dt, hour
        rollups = spark.read.parquet(f"{root}/rollups")
        fields = {f.name: f.dataType for f in samples.schema.fields}
        assert fields["labels"] == T.MapType(T.StringType(), T.StringType(), True)
        assert fields["timestamp"] == T.TimestampType()  # TIMESTAMP(MILLIS, isAdjustedToUTC=true)
        assert fields["value"] == T.DoubleType()
        assert {f.name: f.dataType for f in rollups.schema.fields}["hour_start"] == T.TimestampType()
        assert isinstance(fields["dt"], T.DateType | T.StringType) and fields["hour"] == T.IntegerType()
        # one job per file kind, every hour at once (each Spark job costs about a second here)
        key: list[Column | str] = [F.col("dt").cast("string").alias("day"), "hour"]
        per_hour = {(r["day"], r["hour"]): r for r in samples.groupBy(*key).agg(
            F.count(F.lit(1)).alias("n"),
            F.countDistinct(F.to_json(F.struct("metric", "namespace", "pod", "container", "node", "workload",
                                               "cluster", "resource", "unit", "labels"))).alias("series"),
            F.sum("value").alias("total"),
            F.min(F.unix_millis("timestamp")).alias("lo"),
            F.max(F.unix_millis("timestamp")).alias("hi"),
            F.count_if((F.col("metric") == "kube_pod_container_resource_requests")
                       & (F.col("resource") == "cpu")).alias("cpu"),
        ).collect()}
        rolled = {(r["day"], r["hour"]): r for r in rollups.groupBy(*key).agg(
            F.sum("count").alias("count"), F.sum("sum").alias("sum"), F.count(F.lit(1)).alias("rows"),
            F.min(F.unix_millis("hour_start")).alias("lo"), F.max(F.unix_millis("hour_start")).alias("hi"),
        ).collect()}
        assert sorted(per_hour) == sorted(rolled) == [(h.day, h.hour) for h in hours]
        for h in hours:
            got, r = per_hour[h.day, h.hour], rolled[h.day, h.hour]
            assert (got["n"], got["series"], got["cpu"]) == (h.samples, h.series, h.cpu_requests)
            assert math.isclose(got["total"], h.value_sum, rel_tol=1e-9)
            assert h.start_ms <= got["lo"] and got["hi"] < h.start_ms + HOUR_MS
            assert (r["count"], r["rows"], r["lo"], r["hi"]) == (h.samples, h.series, h.start_ms, h.start_ms)
            assert math.isclose(r["sum"], h.value_sum, rel_tol=1e-9)
    finally:
        spark.stop()
