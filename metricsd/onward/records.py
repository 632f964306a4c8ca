"""What the onward buffer holds: the payloads of its records, as bytes (FORMAT.md, "Payloads").

A record is the agent's spool record (metricsd/agent/spool.py: length, CRC-32, seq, queued_ms,
samples, payload); its payload here is one of two kinds, told apart by the first byte:

- ``SERIES``: the labels of series that the samples records after it refer to by id, as a
  metricsd WriteRequest holding only ``series`` (SeriesLabels). A segment repeats the labels of
  every series it refers to, so a segment is readable on its own: dropping the oldest one never
  leaves a reader without the labels of what follows.
- ``SAMPLES``: one accepted batch, columnar: entries (series id, sample count) and the samples,
  series after series, little-endian arrays compressed with LZ4 as one block.

Pure: bytes in, NumPy arrays out. Every decoder raises :class:`CorruptPayload` on bytes it cannot
trust, never anything else.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import lz4.block
import numpy as np
from google.protobuf.message import DecodeError

from metricsd.model import Labels
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import labels_from_pb, labels_to_pb, length_delimited

__all__ = ["SAMPLES", "SERIES", "Columns", "CorruptPayload", "decode_samples", "decode_series", "decode_series_entries",
           "decode_series_ids", "encode_samples",
           "encode_series", "kind_of", "series_entry"]

SERIES = 1
SAMPLES = 2
_COUNTS = struct.Struct("<II")  # FORMAT.md: entries, samples
_SERIES_FIELD = 5  # WriteRequest.series
_MAX_SAMPLES = 1 << 26  # a count above this in one record is damage, not a batch


class CorruptPayload(ValueError):
    """A payload whose bytes do not decode; the message says where it went wrong."""


@dataclass(frozen=True, slots=True)
class Columns:
    """Samples as metricsd's WriteRequest holds them: ``counts[i]`` samples of series ``ids[i]``,
    series after series, each series' timestamps increasing."""

    ids: np.ndarray  # uint64
    counts: np.ndarray  # int64
    timestamps: np.ndarray  # int64
    values: np.ndarray  # float64

    @property
    def samples(self) -> int:
        return len(self.timestamps)

    @staticmethod
    def empty() -> Columns:
        return Columns(np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64))


def kind_of(payload: bytes) -> int:
    if not payload:
        raise CorruptPayload("empty payload")
    return payload[0]


def series_entry(sid: int, labels: Labels) -> bytes:
    """One series as a serialized SeriesLabels (what ``encode_series`` takes)."""
    return pb.SeriesLabels(id=sid, labels=labels_to_pb(labels)).SerializeToString()


def encode_series(entries: Iterable[bytes]) -> bytes:
    """A series payload of serialized SeriesLabels: a client's own (the tee keeps them as they
    came, so a series' labels are never decoded to be logged) or ``series_entry``'s."""
    return bytes([SERIES]) + b"".join(length_delimited(_SERIES_FIELD, e) for e in entries)


def _series_of(payload: bytes) -> Sequence[pb.SeriesLabels]:
    if kind_of(payload) != SERIES:
        raise CorruptPayload(f"not a series payload (kind {payload[0]})")
    try:
        return pb.WriteRequest.FromString(payload[1:]).series
    except (DecodeError, ValueError) as e:
        raise CorruptPayload(f"series payload: {e}") from None


def decode_series(payload: bytes) -> list[tuple[int, Labels]]:
    try:
        return [(s.id, labels_from_pb(s.labels)) for s in _series_of(payload)]
    except ValueError as e:  # InvalidSeries: a duplicate label name
        raise CorruptPayload(f"series payload: {e}") from None


def decode_series_entries(payload: bytes) -> list[tuple[int, bytes]]:
    """The series of a payload as (id, serialized SeriesLabels), labels not decoded."""
    return [(s.id, s.SerializeToString()) for s in _series_of(payload)]


def decode_series_ids(payload: bytes) -> tuple[np.ndarray, Callable[[int], Labels]]:
    """The ids of a series payload, and the labels of its i-th series on demand: a reader that
    knows most of the series decodes only the labels of the others."""
    series = _series_of(payload)
    ids = np.fromiter((s.id for s in series), np.uint64, len(series))
    return ids, lambda i: labels_from_pb(series[i].labels)


def encode_samples(cols: Columns) -> bytes:
    body = b"".join((
        _COUNTS.pack(len(cols.ids), len(cols.timestamps)),
        cols.ids.astype("<u8").tobytes(),
        cols.counts.astype("<u4").tobytes(),
        cols.timestamps.astype("<i8").tobytes(),
        cols.values.astype("<f8").tobytes(),
    ))
    return bytes([SAMPLES]) + lz4.block.compress(body, store_size=True)


def decode_samples(payload: bytes) -> Columns:
    if kind_of(payload) != SAMPLES:
        raise CorruptPayload(f"not a samples payload (kind {payload[0]})")
    try:
        body = lz4.block.decompress(payload[1:])
    except Exception as e:  # lz4 raises LZ4BlockError, a plain Exception
        raise CorruptPayload(f"samples payload: lz4: {e}") from None
    if len(body) < _COUNTS.size:
        raise CorruptPayload("samples payload: shorter than its header")
    n, m = _COUNTS.unpack_from(body)
    if m > _MAX_SAMPLES or len(body) != _COUNTS.size + 12 * n + 16 * m:
        raise CorruptPayload(f"samples payload: {len(body)} bytes do not hold {n} entries and {m} samples")
    at = _COUNTS.size
    ids = np.frombuffer(body, "<u8", n, at).astype(np.uint64)
    counts = np.frombuffer(body, "<u4", n, at + 8 * n).astype(np.int64)
    ts = np.frombuffer(body, "<i8", m, at + 12 * n).astype(np.int64)
    values = np.frombuffer(body, "<f8", m, at + 12 * n + 8 * m).astype(np.float64)
    if int(counts.sum()) != m:
        raise CorruptPayload(f"samples payload: counts add up to {int(counts.sum())}, not {m}")
    return Columns(ids, counts, ts, values)
