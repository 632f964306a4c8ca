"""A write batch as columns: what a proto WriteRequest carries, as NumPy arrays, decoded once.

Remote write (metricsd/http/remote_write.py) decodes a request straight into this, a store writes
it with one vectorized append (store/api.py ``write_columns``), and a proxy routes it by slot and
sends each store its part as wire bytes built from the arrays (proxy/routing.py): no message
object is filled per series or per sample on the way. The wire form is WriteRequest's fields
(proto/metricsd.proto), each packed field one NumPy buffer:

    WriteRequest = [ 0x0a len ids: fixed64 little-endian ... ]       field 1
                   [ 0x12 len counts: varint ... ]                    field 2
                   [ 0x1a len timestamps: varint (int64) ... ]        field 3
                   [ 0x22 len values: double little-endian ... ]      field 4
                   { 0x2a len SeriesLabels }                          field 5, one per labelled series
    SeriesLabels = 0x09 id: fixed64  { 0x12 len Label }
    Label        = 0x0a len name  0x12 len value                      (proto3: an empty value left out)

Empty packed fields are left out, as protobuf leaves them, so a batch without labels encodes to
exactly what ``WriteRequest.SerializeToString`` gives for the same columns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from metricsd.model import Labels
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import labels_from_pb, varint

__all__ = ["ColumnarBackend", "WriteColumns", "labels_entry", "series_entries", "varints"]


def varints(u: np.ndarray) -> bytes:
    """Protobuf's packed varint encoding of ``u`` (uint64; an int64 array goes through ``.view``,
    so a negative value takes ten bytes, as protobuf's int64 does)."""
    u = np.ascontiguousarray(u, dtype=np.uint64)
    if not u.size:
        return b""
    lo, hi = int(u.min()), int(u.max())
    w = max(1, (hi.bit_length() + 6) // 7)
    digits = np.empty((u.size, w), dtype=np.uint8)
    for k in range(w):
        digits[:, k] = (u >> np.uint64(7 * k)) & np.uint64(0x7F)
    if max(1, (lo.bit_length() + 6) // 7) == w:  # every value has the same size (the usual case)
        digits[:, : w - 1] |= 0x80
        return digits.tobytes()
    size = np.ones(u.size, dtype=np.int64)
    for k in range(1, w):
        size += u >= np.uint64(1 << (7 * k))
    col = np.arange(w)
    digits[col[None, :] < (size - 1)[:, None]] |= 0x80
    return digits[col[None, :] < size[:, None]].tobytes()


def _field(number: int, data: bytes) -> list[bytes]:
    """A length-delimited field as pieces (tag and length, then the data): joined once by the caller."""
    return [varint(number << 3 | 2) + varint(len(data)), data] if data else []


def _string(number: int, s: str) -> bytes:
    b = s.encode("utf-8")
    return varint(number << 3 | 2) + varint(len(b)) + b if b else b""


def labels_entry(sid: int, labels: Labels) -> bytes:
    """One ``WriteRequest.series`` field (a SeriesLabels) as wire bytes. O(labels)."""
    body = [b"\x09", sid.to_bytes(8, "little")]
    for name, value in labels:
        label = _string(1, name) + _string(2, value)
        body += [b"\x12", varint(len(label)), label]
    inner = b"".join(body)
    return b"\x2a" + varint(len(inner)) + inner


def series_entries(labels: Mapping[int, Labels], ids: Iterable[int]) -> bytes:
    """The ``series`` fields of those ``ids`` that ``labels`` holds, in the order of ``ids``."""
    return b"".join(labels_entry(i, labels[i]) for i in ids if i in labels)


@dataclass(frozen=True)
class WriteColumns:
    """A columnar write batch (see proto WriteRequest): entry i is series ``ids[i]`` with
    ``counts[i]`` samples, entry after entry in ``timestamps`` / ``values``. ``labels`` holds the
    labels of the series that travel with their labels in this batch (new to the receiver).
    ``stamp_varints``, when set, is ``timestamps`` already varint-encoded, every varint of the
    same width, as bytes or as an (n, width) uint8 array (a remote-write sender's own bytes,
    passed on without encoding them again). Read only: arrays may be shared."""

    ids: np.ndarray  # uint64
    counts: np.ndarray  # int64
    timestamps: np.ndarray  # int64
    values: np.ndarray  # float64
    labels: Mapping[int, Labels] = field(default_factory=dict)
    stamp_varints: bytes | np.ndarray | None = None
    # The message these columns were read from (of_request): without labels, protobuf writes it
    # back faster than the columns are encoded.
    message: pb.WriteRequest | None = field(default=None, compare=False, repr=False)
    # ``ids`` as Python ints, when the batch's maker had them (the remote-write receiver): a
    # proxy's look-ups by id take them as they are instead of converting the array again.
    id_list: list[int] | None = field(default=None, compare=False, repr=False)

    @property
    def samples(self) -> int:
        return len(self.timestamps)

    def sample_fields(self) -> list[bytes]:
        """Fields 1-4 as pieces to join (or to join with more fields)."""
        given = self.stamp_varints
        if given is None:
            stamps = varints(self.timestamps.view(np.uint64))
        else:
            stamps = given.tobytes() if isinstance(given, np.ndarray) else given
        return [*_field(1, self.ids.astype("<u8", copy=False).tobytes()),
                *_field(2, varints(self.counts.astype(np.uint64, copy=False))),
                *_field(3, stamps),
                *_field(4, self.values.astype("<f8", copy=False).tobytes())]

    def wire(self, labelled: Iterable[int] | None = None) -> bytes:
        """The batch as WriteRequest bytes, with the labels of ``labelled`` (default: every series
        in ``labels``)."""
        labels = series_entries(self.labels, self.labels if labelled is None else labelled)
        if self.message is not None and not labels and not self.message.series:
            return self.message.SerializeToString()
        return b"".join([*self.sample_fields(), labels])

    def to_request(self) -> pb.WriteRequest:
        """The batch as a message, for a backend that takes only messages."""
        return pb.WriteRequest.FromString(self.wire())

    def select(self, keep: np.ndarray) -> WriteColumns:
        """The entries where ``keep`` (bool, per entry) holds, with their samples and labels."""
        per_sample = np.repeat(keep, self.counts)
        stamps = None
        given = self.stamp_varints
        if given is not None and len(self.timestamps):
            rows = given if isinstance(given, np.ndarray) else np.frombuffer(given, dtype=np.uint8).reshape(
                len(self.timestamps), -1)
            stamps = rows[per_sample]
        ids = self.ids[keep]
        labels = {i: self.labels[i] for i in ids.tolist() if i in self.labels} if self.labels else {}
        return WriteColumns(ids, self.counts[keep], self.timestamps[per_sample], self.values[per_sample], labels,
                            stamps)

    def with_labels(self, labels: Mapping[int, Labels]) -> WriteColumns:
        """The same samples with ``labels`` as the labels that travel with them."""
        return WriteColumns(self.ids, self.counts, self.timestamps, self.values, labels, self.stamp_varints,
                            id_list=self.id_list)

    @classmethod
    def of_request(cls, request: pb.WriteRequest) -> WriteColumns:
        """A message's columns (packed repeated fields copy in C). Raises InvalidSeries for a
        series' labels with a duplicate name."""
        return cls(np.array(request.ids, dtype=np.uint64), np.array(request.counts, dtype=np.int64),
                   np.array(request.timestamps, dtype=np.int64), np.array(request.values, dtype=np.float64),
                   {s.id: labels_from_pb(s.labels) for s in request.series}, message=request)


@runtime_checkable
class ColumnarBackend(Protocol):
    """A MetricsBackend that also takes a write as columns, without a message in between (a store
    in this process, a proxy). Same answers and errors as ``write`` of ``batch.to_request()``."""

    async def write_columns(self, batch: WriteColumns) -> pb.WriteResponse: ...
