"""Hourly Parquet files of raw samples and hourly rollups, for offline engines (DuckDB, Spark, Polars).

The schema and the layout are in FORMAT.md beside this file ("Hourly Parquet"). In short: per
closed hour, ``samples/dt=YYYY-MM-DD/hour=HH/part-0.parquet`` (one row per sample, sorted by series
then time) and ``rollups/dt=YYYY-MM-DD/hour=HH/part-0.parquet`` (one row per series), then
``samples/dt=.../hour=.../_SUCCESS`` (JSON: counts), written last, so a reader that sees it sees
the whole hour. Labels metricsd knows are columns of their own (dictionary-encoded: a run of a
series' rows costs a few bits); any others go in the ``labels`` map.

Building a table is pure (columns of many series in, Arrow table out) and batch-shaped: labels are
looked at once per series, rows are NumPy gathers; writing goes through fsspec, so the root may be
a directory or any URL fsspec opens (``s3://bucket/prefix``, ``memory://x``).
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
from metricsd.rpc.rollupbatch import RollupArrays

__all__ = [
    "FORMAT_VERSION",
    "LABEL_COLUMNS",
    "ROLLUPS_SCHEMA",
    "ROW_GROUP_ROWS",
    "SAMPLES_SCHEMA",
    "HourFiles",
    "SampleColumns",
    "hour_dir",
    "rollups_table",
    "samples_table",
    "to_parquet",
]

# 2: the rollups' hour column is `hour_start` (it was `hour`, the name of the `hour=HH` partition,
# which Polars then failed to read (it parsed "13" as the column's timestamp) and Spark dropped)
# 3: `resource` and `unit` (kube-state-metrics' requests and limits: half the default workload's
# series) are columns of their own, no longer in the `labels` map: a map's entries are written per
# row (Arrow has no per-series map), which cost the writer ~0.1 s a million rows, a fifth of its
# CPU for the hour (perf/RESULTS.md, "Issue 26 session 35")
FORMAT_VERSION = 3
LABEL_COLUMNS = ("namespace", "pod", "container", "node", "workload", "cluster", "resource", "unit")
_DICT = pa.dictionary(pa.int32(), pa.string())
_LABELS = [pa.field("metric", _DICT, nullable=False),
           *(pa.field(n, _DICT, nullable=n not in ("namespace", "pod")) for n in LABEL_COLUMNS),
           pa.field("labels", pa.map_(pa.string(), pa.string()))]
_TS = pa.timestamp("ms", tz="UTC")
ROW_GROUP_ROWS = 1 << 20
SAMPLES_SCHEMA = pa.schema([*_LABELS, pa.field("timestamp", _TS, nullable=False),
                            pa.field("value", pa.float64(), nullable=False)])
ROLLUPS_SCHEMA = pa.schema([*_LABELS, pa.field("hour_start", _TS, nullable=False),
                            *(pa.field(n, pa.float64(), nullable=False) for n in ("min", "max", "sum", "count")),
                            pa.field("last", pa.float64())])


@dataclass(frozen=True)
class SampleColumns:
    """Raw samples of many series, as columns: series i has ``labels[i]`` and the next ``counts[i]``
    samples of ``timestamps`` / ``values`` (increasing in time), series after series."""

    labels: list[Labels]
    counts: np.ndarray  # int64
    timestamps: np.ndarray  # int64 ms
    values: np.ndarray  # float64

    @property
    def samples(self) -> int:
        return len(self.timestamps)

    @staticmethod
    def concat(parts: Sequence[SampleColumns]) -> SampleColumns:
        return SampleColumns([lab for p in parts for lab in p.labels], _cat([p.counts for p in parts], np.int64),
                             _cat([p.timestamps for p in parts], np.int64), _cat([p.values for p in parts], np.float64))


def _cat(parts: Sequence[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def _label_order(labels: Sequence[Labels]) -> list[int]:
    """The series in label order (their pairs, in name order, compared as one string each: in C,
    not pair by pair)."""
    keys = ["\x00".join([f"{k}\x01{v}" for k, v in lab]) for lab in labels]
    return sorted(range(len(labels)), key=keys.__getitem__)


def _gather(arrays: Sequence[np.ndarray], counts: np.ndarray, order: Sequence[int]) -> list[np.ndarray]:
    """Each array's rows (series after series, ``counts[i]`` of series i) with the series in
    ``order``: one slice a series, one copy of the data (no per-row index)."""
    starts = (np.cumsum(counts) - counts).tolist()
    n = counts.tolist()
    return [np.concatenate([a[starts[i]:starts[i] + n[i]] for i in order]) if order else a[:0] for a in arrays]


def _dictionary(values: list[str | None], counts: np.ndarray) -> pa.Array:
    """A dictionary column of rows that are, series after series, ``counts[i]`` rows with
    ``values[i]``: encoded per series, codes repeated, nulls as a bitmap (no per-row Python)."""
    enc = pa.array(values, pa.string()).dictionary_encode()
    codes = np.repeat(enc.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int32), counts)
    valid = enc.indices.is_valid().to_numpy(zero_copy_only=False)
    bitmap = None if valid.all() else pa.py_buffer(np.packbits(np.repeat(valid, counts), bitorder="little"))
    indices = pa.Array.from_buffers(pa.int32(), len(codes), [bitmap, pa.py_buffer(codes)])
    return pa.DictionaryArray.from_arrays(indices, enc.dictionary)


def _label_columns(labels: Sequence[Labels], counts: np.ndarray) -> list[pa.Array]:
    """The label columns of rows that are, series after series, ``counts[i]`` rows of series i:
    each column's codes are found per series, then repeated (never a Python step per row)."""
    dicts = [dict(lab) for lab in labels]
    out = [_dictionary([d.get(name) for d in dicts], counts) for name in (METRIC_NAME, *LABEL_COLUMNS)]
    known = {METRIC_NAME, *LABEL_COLUMNS}
    extra = pa.array([[(k, v) for k, v in sorted(d.items()) if k not in known] for d in dicts],
                     pa.map_(pa.string(), pa.string()))
    out.append(pc.take(extra, pa.array(np.repeat(np.arange(len(dicts), dtype=np.int32), counts))))
    return out


def samples_table(cols: SampleColumns, series: Sequence[int]) -> pa.Table:
    """The rows of ``series`` (indices into ``cols``, in that order), each series' samples in time order."""
    ts, values = _gather([cols.timestamps, cols.values], cols.counts, series)
    arrays = [*_label_columns([cols.labels[i] for i in series], cols.counts[list(series)]), pa.array(ts, _TS),
              pa.array(values, pa.float64())]
    return pa.Table.from_arrays(arrays, schema=SAMPLES_SCHEMA)


def rollups_table(cols: RollupArrays, labels: Sequence[Labels], series: Sequence[int]) -> pa.Table:
    """The rows of ``series`` (indices into ``cols``, whose labels as tuples are ``labels``), each
    series' hours in time order. ``last`` is NaN where not known: stored as null."""
    counts = cols.counts
    hours, mins, maxs, sums, count, last = _gather([cols.hours, cols.min, cols.max, cols.sum, cols.count, cols.last],
                                                   counts, series)
    arrays = [*_label_columns([labels[i] for i in series], counts[list(series)]),
              pa.array(hours.astype(np.int64), _TS),
              *(pa.array(a.astype(np.float64), pa.float64()) for a in (mins, maxs, sums, count)),
              pa.array(last.astype(np.float64), pa.float64(), mask=np.isnan(last))]
    return pa.Table.from_arrays(arrays, schema=ROLLUPS_SCHEMA)


def _row_groups(counts: Sequence[int], rows: int) -> list[tuple[int, int]]:
    """Consecutive runs of whole series of about ``rows`` rows (a longer series alone)."""
    out, start, n = [], 0, 0
    for i, c in enumerate(counts):
        if n and n + c > rows:
            out.append((start, i))
            start, n = i, 0
        n += c
    if n or not out:
        out.append((start, len(counts)))
    return out


def to_parquet(cols: SampleColumns | RollupArrays) -> bytes:
    """The file's bytes, series in label order, one row group (about ROW_GROUP_ROWS rows of whole
    series) built and written at a time: the memory of one row group's table, reused from one to
    the next (building the whole hour's table at once spent more time in the kernel, faulting in
    fresh memory, than in NumPy and Arrow). zstd; the time column delta-encoded (a series' steps
    are nearly equal), floats byte-stream-split (a series' exponent and high mantissa bytes
    repeat), label columns dictionary-encoded. 1.2 bytes a sample on the benchmark workload
    (perf/RESULTS.md)."""
    samples = isinstance(cols, SampleColumns)
    schema, time_column = (SAMPLES_SCHEMA, "timestamp") if samples else (ROLLUPS_SCHEMA, "hour_start")
    labels = cols.labels if isinstance(cols, SampleColumns) else cols.labels.to_list()
    order = _label_order(labels)
    counts = cols.counts[order].tolist() if order else []
    floats = [f.name for f in schema if pa.types.is_floating(f.type)]
    buf = io.BytesIO()
    with pq.ParquetWriter(buf, schema, compression="zstd", compression_level=3,
                          use_dictionary=[f.name for f in schema if pa.types.is_dictionary(f.type) or
                                          f.name == "labels"],
                          column_encoding={time_column: "DELTA_BINARY_PACKED",
                                           **dict.fromkeys(floats, "BYTE_STREAM_SPLIT")},
                          # Statistics where an engine prunes by them: the time and the metric (rows are
                          # sorted by labels, the metric first). On every label column they took a third
                          # of the encoding.
                          write_statistics=[time_column, "metric"]) as writer:
        for a, b in _row_groups(counts, ROW_GROUP_ROWS):
            part = order[a:b]
            table = (samples_table(cols, part) if isinstance(cols, SampleColumns)
                     else rollups_table(cols, labels, part))
            writer.write_table(table, row_group_size=ROW_GROUP_ROWS + max(counts[a:b], default=0))
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
