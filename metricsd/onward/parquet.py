"""Hourly Parquet files of raw samples and hourly rollups, for offline engines (DuckDB, Spark, Polars).

The schema and the layout are in FORMAT.md beside this file ("Hourly Parquet"). In short: per
closed hour, ``samples/dt=YYYY-MM-DD/hour=HH/part-0.parquet`` (one row per sample, sorted by series
then time) and ``rollups/dt=YYYY-MM-DD/hour=HH/part-0.parquet`` (one row per series), then
``samples/dt=.../hour=.../_SUCCESS`` (JSON: counts), written last, so a reader that sees it sees
the whole hour. Labels metricsd knows are columns of their own (dictionary-encoded: a run of a
series' rows costs a few bits); any others go in the ``labels`` map.

Building a table is pure (series in, Arrow table out); writing goes through fsspec, so the root
may be a directory or any URL fsspec opens (``s3://bucket/prefix``, ``memory://x``).
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from metricsd.model import METRIC_NAME, Labels

__all__ = ["FORMAT_VERSION", "LABEL_COLUMNS", "ROLLUPS_SCHEMA", "SAMPLES_SCHEMA", "HourFiles", "Rollups", "Series",
           "hour_dir", "rollups_table", "samples_table", "to_parquet"]

FORMAT_VERSION = 1
LABEL_COLUMNS = ("namespace", "pod", "container", "node", "workload", "cluster")
_DICT = pa.dictionary(pa.int32(), pa.string())
_LABELS = [pa.field("metric", _DICT, nullable=False),
           *(pa.field(n, _DICT, nullable=n not in ("namespace", "pod")) for n in LABEL_COLUMNS),
           pa.field("labels", pa.map_(pa.string(), pa.string()))]
_TS = pa.timestamp("ms", tz="UTC")
SAMPLES_SCHEMA = pa.schema([*_LABELS, pa.field("timestamp", _TS, nullable=False),
                            pa.field("value", pa.float64(), nullable=False)])
ROLLUPS_SCHEMA = pa.schema([*_LABELS, pa.field("hour", _TS, nullable=False),
                            *(pa.field(n, pa.float64(), nullable=False) for n in ("min", "max", "sum", "count")),
                            pa.field("last", pa.float64())])


@dataclass(frozen=True, slots=True)
class Series:
    labels: Labels
    timestamps: np.ndarray  # int64 ms, increasing
    values: np.ndarray  # float64


@dataclass(frozen=True, slots=True)
class Rollups:
    labels: Labels
    hours: np.ndarray  # int64 ms
    min: np.ndarray
    max: np.ndarray
    sum: np.ndarray
    count: np.ndarray
    last: np.ndarray  # NaN when not known: stored as null


def _label_columns(labels: Sequence[Labels], rows: np.ndarray) -> list[pa.Array]:
    """The label columns for ``rows`` (the index of each row's series in ``labels``)."""
    dicts = [dict(lab) for lab in labels]
    idx = pa.array(rows, pa.int32())
    out: list[pa.Array] = []
    for name in (METRIC_NAME, *LABEL_COLUMNS):
        per_series = [d.get(name) for d in dicts]
        enc = pa.array(per_series, pa.string()).dictionary_encode()
        codes = pc.take(enc.indices, idx)
        out.append(pa.DictionaryArray.from_arrays(codes, enc.dictionary))
    known = {METRIC_NAME, *LABEL_COLUMNS}
    extra = pa.array([[(k, v) for k, v in sorted(d.items()) if k not in known] for d in dicts],
                     pa.map_(pa.string(), pa.string()))
    out.append(pc.take(extra, idx))
    return out


def samples_table(series: Sequence[Series]) -> pa.Table:
    """One row per sample, series after series in the order given (sort them by labels first)."""
    counts = np.array([len(s.timestamps) for s in series], np.int64)
    rows = np.repeat(np.arange(len(series), dtype=np.int32), counts)
    ts = np.concatenate([s.timestamps for s in series]) if series else np.zeros(0, np.int64)
    vals = np.concatenate([s.values for s in series]) if series else np.zeros(0, np.float64)
    cols = [*_label_columns([s.labels for s in series], rows), pa.array(ts, _TS), pa.array(vals, pa.float64())]
    return pa.Table.from_arrays(cols, schema=SAMPLES_SCHEMA)


def rollups_table(series: Sequence[Rollups]) -> pa.Table:
    counts = np.array([len(s.hours) for s in series], np.int64)
    rows = np.repeat(np.arange(len(series), dtype=np.int32), counts)

    def col(name: str) -> np.ndarray:
        parts = [getattr(s, name) for s in series]
        return np.concatenate(parts) if parts else np.zeros(0)

    last = col("last").astype(np.float64)
    cols = [*_label_columns([s.labels for s in series], rows), pa.array(col("hours").astype(np.int64), _TS),
            *(pa.array(col(n).astype(np.float64), pa.float64()) for n in ("min", "max", "sum", "count")),
            pa.array(last, pa.float64(), mask=np.isnan(last))]
    return pa.Table.from_arrays(cols, schema=ROLLUPS_SCHEMA)


def to_parquet(table: pa.Table, time_column: str) -> bytes:
    """The file's bytes: zstd; the time column delta-encoded (a series' steps are nearly equal),
    floats byte-stream-split (a series' exponent and high mantissa bytes repeat), label columns
    dictionary-encoded. 1.19 bytes a sample on the benchmark workload (perf/RESULTS.md)."""
    buf = io.BytesIO()
    floats = [f.name for f in table.schema if pa.types.is_floating(f.type)]
    encodings = {time_column: "DELTA_BINARY_PACKED", **dict.fromkeys(floats, "BYTE_STREAM_SPLIT")}
    pq.write_table(table, buf, compression="zstd", compression_level=3,
                   use_dictionary=[f.name for f in table.schema if pa.types.is_dictionary(f.type) or
                                   f.name == "labels"],
                   column_encoding=encodings, row_group_size=1 << 20, write_statistics=True)
    return buf.getvalue()


def hour_dir(kind: str, hour_ms: int) -> str:
    """``samples/dt=2026-11-26/hour=07`` for the hour starting at ``hour_ms`` (UTC)."""
    t = np.datetime64(hour_ms, "ms").astype("datetime64[h]").item()
    return f"{kind}/dt={t:%Y-%m-%d}/hour={t:%H}"


@dataclass(frozen=True)
class HourFiles:
    """What one closed hour writes: paths relative to the root, and the marker's content."""

    hour_ms: int
    samples: bytes
    rollups: bytes
    manifest: dict[str, object]

    def files(self) -> list[tuple[str, bytes]]:
        """In writing order: the marker last."""
        return [(f"{hour_dir('rollups', self.hour_ms)}/part-0.parquet", self.rollups),
                (f"{hour_dir('samples', self.hour_ms)}/part-0.parquet", self.samples),
                (f"{hour_dir('samples', self.hour_ms)}/_SUCCESS", json.dumps(self.manifest).encode())]
