"""Hourly rollups of many series as one message (RollupsResponse.batch, a RollupsBatch), not a
SeriesRollups message per series: what a Rollups call with ``columnar`` answers.

A store answered an hour's rollups of 40,000 series with a message each, six repeated fields
filled from Python lists: 17% of each store's CPU in the cluster's Parquet hour, and the proxy's
per-series merge 8% of its own (perf/RESULTS.md, "The cluster's Parquet hour, end to end").
Here the arrays go out as bytes (rpc/FORMAT.md, "RollupsBatch") and come back as arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from metricsd.columns import LabelColumns, SeriesColumns
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import InvalidSeries, batch_bytes, columns_from_batch, labels_from_pb, length_delimited

__all__ = ["RollupArrays", "arrays_batch_bytes", "rollups_batch_bytes", "rollups_from_batch", "rollups_from_response"]

_FIELDS = ("max", "sum", "count", "last")


@dataclass(frozen=True)
class RollupArrays:
    """``hours[offsets[i]:offsets[i + 1]]`` (and min, max, sum, count, last alike) are series i's."""

    ids: np.ndarray  # uint64
    labels: LabelColumns
    offsets: np.ndarray  # int64, len(ids) + 1
    hours: np.ndarray  # int64 ms
    min: np.ndarray
    max: np.ndarray
    sum: np.ndarray
    count: np.ndarray
    last: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    def take(self, idx: np.ndarray) -> RollupArrays:
        """The series ``idx``, in that order."""
        cols = SeriesColumns(self.labels, self.offsets, self.hours, self.min, self.ids).take(idx)
        lo, hi = self.offsets[idx], self.offsets[idx + 1]
        at = np.repeat(lo - (np.cumsum(hi - lo) - (hi - lo)), hi - lo) + np.arange(int((hi - lo).sum()))
        assert cols.ids is not None
        return RollupArrays(cols.ids, cols.labels, cols.offsets, cols.timestamps, cols.values,
                            *(getattr(self, f)[at] for f in _FIELDS))

    @staticmethod
    def concat(parts: Sequence[RollupArrays]) -> RollupArrays:
        cols = SeriesColumns.concat([SeriesColumns(p.labels, p.offsets, p.hours, p.min, p.ids) for p in parts])
        assert cols.ids is not None
        return RollupArrays(cols.ids, cols.labels, cols.offsets, cols.timestamps, cols.values,
                            *(np.concatenate([getattr(p, f) for p in parts]) if parts else np.zeros(0)
                              for f in _FIELDS))


def rollups_batch_bytes(ids: np.ndarray, labels: LabelColumns, points: Sequence[object]) -> bytes:
    """A RollupsResponse with ``batch`` set, serialised, from a store's per-series RollupPoints
    (store/rollup.py: hour, min, max, sum, count, last arrays each); series without hours left out."""
    counts = np.fromiter((len(p.hour) for p in points), np.int64, len(points))  # type: ignore[attr-defined]
    keep = np.flatnonzero(counts)
    pts = [points[i] for i in keep.tolist()]

    def cat(name: str, dtype: str) -> np.ndarray:
        return (np.concatenate([getattr(p, name) for p in pts]) if pts else np.zeros(0)).astype(dtype, copy=False)

    offsets = np.zeros(len(keep) + 1, np.int64)
    np.cumsum(counts[keep], out=offsets[1:])
    return arrays_batch_bytes(RollupArrays(np.asarray(ids, np.uint64)[keep], labels.take(keep), offsets,
                                           cat("hour", "<i8"), cat("min", "<f8"),
                                           *(cat(name, "<f8") for name in _FIELDS)))


def arrays_batch_bytes(a: RollupArrays) -> bytes:
    """A RollupsResponse with ``batch`` set, serialised, from arrays (the proxy's merged answer)."""
    series = SeriesColumns(a.labels, a.offsets, a.hours, a.min, a.ids)
    inner = length_delimited(1, batch_bytes(series)) + b"".join(
        length_delimited(k, np.ascontiguousarray(getattr(a, name), "<f8").tobytes())
        for k, name in enumerate(_FIELDS, start=2))
    return length_delimited(2, inner)


def rollups_from_batch(b: pb.RollupsBatch) -> RollupArrays:
    """Raises InvalidSeries when the arrays do not agree in length."""
    cols = columns_from_batch(b.series)
    extra = [np.frombuffer(getattr(b, f), dtype="<f8").astype(np.float64) for f in _FIELDS]
    if any(len(a) != len(cols.timestamps) for a in extra):
        raise InvalidSeries(f"a rollups batch of {len(cols.timestamps)} hours has a field of another length")
    assert cols.ids is not None
    return RollupArrays(cols.ids, cols.labels, cols.offsets, cols.timestamps, cols.values, *extra)


def rollups_from_response(resp: pb.RollupsResponse) -> RollupArrays:
    """A Rollups reply as arrays, whichever form it came in (batch, or a SeriesRollups per series)."""
    if resp.HasField("batch"):
        return rollups_from_batch(resp.batch)
    series = list(resp.series)
    counts = np.fromiter((len(s.hours) for s in series), np.int64, len(series))
    offsets = np.zeros(len(series) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    def field(name: str, dtype: type) -> np.ndarray:
        return np.array([x for s in series for x in getattr(s, name)], dtype)

    return RollupArrays(np.array([s.id for s in series], np.uint64),
                        LabelColumns.from_labels([labels_from_pb(s.labels) for s in series]), offsets,
                        field("hours", np.int64), field("min", np.float64),
                        *(field(f, np.float64) for f in _FIELDS))
