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
from dataclasses import dataclass

import lz4.block
import numpy as np
from google.protobuf.message import DecodeError

from metricsd.model import Labels
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import labels_from_pb, labels_to_pb

__all__ = ["SAMPLES", "SERIES", "Columns", "CorruptPayload", "decode_samples", "decode_series", "encode_samples",
           "encode_series", "kind_of"]

SERIES = 1
SAMPLES = 2
_COUNTS = struct.Struct("<II")  # FORMAT.md: entries, samples
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


def encode_series(series: list[tuple[int, Labels]]) -> bytes:
    req = pb.WriteRequest()
    for sid, labels in series:
        req.series.add(id=sid).labels.extend(labels_to_pb(labels))
    return bytes([SERIES]) + req.SerializeToString()


def decode_series(payload: bytes) -> list[tuple[int, Labels]]:
    if kind_of(payload) != SERIES:
        raise CorruptPayload(f"not a series payload (kind {payload[0]})")
    try:
        req = pb.WriteRequest.FromString(payload[1:])
        return [(s.id, labels_from_pb(s.labels)) for s in req.series]
    except (DecodeError, ValueError) as e:
        raise CorruptPayload(f"series payload: {e}") from None


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
