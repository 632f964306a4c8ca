"""Remote-write request bodies from columns: Prometheus remote write 1.0 (``prometheus.WriteRequest``)
and 2.0 (``io.prometheus.write.v2.Request``), snappy block compressed.

A request is built whole, with a few NumPy and Arrow calls, never a Python step per series or per
sample (the send path's CPU budget is 0.5 s per million samples, perf/RESULTS.md):

- the bytes a series repeats in every request (its 1.0 label fields, or its 2.0 label strings) are
  encoded once, when the sender learns the series, and kept in an Arrow binary column
  (series.py); a request gathers its entries' bytes with one ``take``;
- every sample's ``Sample`` field is a row of a NumPy byte matrix (tag, length, the double, the
  timestamp's varint), written for all samples of the request at once (``sample_bytes``);
- the varint lengths in front of each entry are NumPy too (``tagged_varints``), and one Arrow
  ``binary_join_element_wise`` lays header, labels and samples of every entry end to end.

The layouts are fixed by proto/prometheus_remote.proto and proto/prometheus_remote_v2.proto (the
protobuf wire format; FORMAT.md beside this file draws them). Fields come in field-number order
and both ``Sample`` fields are always written, so for samples with a non-zero value and timestamp
the bytes equal protobuf's own serialisation (the tests check that, and decode the bodies with
metricsd's remote-write scanner and with real receivers).

Pure: columns in, bytes out.
"""

from __future__ import annotations

from collections.abc import Sequence

import cramjam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from metricsd.model import Labels
from metricsd.rpc.wire import varint

__all__ = ["ONE_SAMPLE_TS", "V1_CONTENT_TYPE", "V2_CONTENT_TYPE", "binary_column", "encode_v1", "encode_v1_one",
           "encode_v2", "encode_v2_labels", "label_bytes_v1", "one_sample_prefix", "sample_bytes", "snappy",
           "tagged_varints", "varint_digits"]

V1_CONTENT_TYPE = "application/x-protobuf"
V2_CONTENT_TYPE = "application/x-protobuf;proto=io.prometheus.write.v2.Request"

BINARY = pa.large_binary()  # 64-bit offsets: a request is never cut at 2 GiB
_EMPTY = pa.scalar(b"", BINARY)

# Tags (field number << 3 | wire type 2), FORMAT.md "Remote write requests".
_V1_TIMESERIES = 0x0A  # WriteRequest.timeseries = 1
_V2_SYMBOLS = 0x22  # Request.symbols = 4
_V2_TIMESERIES = 0x2A  # Request.timeseries = 5
_V2_LABELS_REFS = 0x0A  # TimeSeries.labels_refs = 1, packed
_SAMPLES = 2  # TimeSeries.samples = 2 (1.0 and 2.0)


def label_bytes_v1(labels: Labels) -> bytes:
    """A series' ``repeated Label labels = 1`` fields of a 1.0 TimeSeries, sorted by name. An
    empty value is left out, as protobuf leaves out an empty string."""
    out = []
    for k, v in labels:
        kb, vb = k.encode(), v.encode()
        inner = b"\x0a" + varint(len(kb)) + kb + (b"\x12" + varint(len(vb)) + vb if vb else b"")
        out.append(b"\x0a" + varint(len(inner)) + inner)
    return b"".join(out)


def varint_digits(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each value's base-128 varint as a row of a uint8 matrix (continuation bits set; the row is
    as wide as the widest varint), and each varint's size. A negative int64 viewed as uint64 takes
    ten bytes, as protobuf writes it.

    Built a digit (column) at a time: a digit every value shares (the high digits of a request's
    timestamps, which lie minutes apart) is one fill, not a shift and a mask of every value."""
    u = np.ascontiguousarray(u, dtype=np.uint64)
    n = len(u)
    if not n:
        return np.zeros((0, 1), np.uint8), np.zeros(0, np.int64)
    lo, hi = int(u.min()), int(u.max())
    w = max(1, (hi.bit_length() + 6) // 7)
    one_size = max(1, (lo.bit_length() + 6) // 7) == w  # the usual case: every varint w bytes
    digits = np.empty((n, w), np.uint8)
    size = np.full(n, w if one_size else 1, np.int64)
    for j in range(w):
        shift = 7 * j
        more = 1 << (shift + 7)  # a value at least this has a digit after this one (continuation bit)
        if lo >> shift == hi >> shift:  # the same digit and continuation bit in every value
            digits[:, j] = ((lo >> shift) & 0x7F) | (0x80 if lo >= more else 0)
            continue
        digits[:, j] = (u >> np.uint64(shift)) & np.uint64(0x7F)
        if one_size:
            if j < w - 1:
                digits[:, j] |= 0x80
        elif j < w - 1:
            cont = u >= np.uint64(more)
            digits[:, j] |= cont.view(np.uint8) << 7
            size += cont
    return digits, size  # (with sizes mixed no digit is shared: lo has fewer digits than hi)


def _packed(rows: np.ndarray, size: np.ndarray) -> np.ndarray:
    """The first ``size[i]`` bytes of each row, back to back (one reshape when all are full; else
    a column at a time, each column written where its rows have that byte)."""
    if not len(size) or bool((size == rows.shape[1]).all()):  # fast path: one width (the usual case)
        return rows.reshape(-1)
    start = _offsets(size)
    out = np.empty(int(start[-1]), np.uint8)
    start = start[:-1]
    full = int(size.min())
    for j in range(rows.shape[1]):
        if j < full:
            out[start + j] = rows[:, j]
        else:
            has = size > j
            out[start[has] + j] = rows[has, j]
    return out


def _offsets(size: np.ndarray) -> np.ndarray:
    out = np.zeros(len(size) + 1, np.int64)
    np.cumsum(size, out=out[1:])
    return out


def binary_column(data: np.ndarray, offsets: np.ndarray) -> pa.Array:
    """An Arrow binary array over ``data`` (uint8): element i is ``data[offsets[i]:offsets[i + 1]]``.
    No copy: the array keeps ``data`` alive."""
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    return pa.Array.from_buffers(BINARY, len(offsets) - 1, [None, pa.py_buffer(offsets),
                                                             pa.py_buffer(np.ascontiguousarray(data, np.uint8))])


def tagged_varints(tag: int, u: np.ndarray) -> pa.Array:
    """Element i: the byte ``tag`` then the varint of ``u[i]`` (a field's tag and length)."""
    digits, size = varint_digits(u)
    rows = np.empty((len(u), digits.shape[1] + 1), np.uint8)
    rows[:, 0] = tag
    rows[:, 1:] = digits
    return binary_column(_packed(rows, size + 1), _offsets(size + 1))


def sample_bytes(timestamps: np.ndarray, values: np.ndarray, field: int = _SAMPLES) -> tuple[np.ndarray, np.ndarray]:
    """Every sample as an embedded ``Sample`` field (tag ``field``, length, then ``double value =
    1``, ``int64 timestamp = 2``), concatenated: the bytes (uint8) and where each sample's bytes
    end. The Sample message is the same in 1.0 and 2.0. A sample is a row of a byte matrix, so all
    samples take a few NumPy calls whatever their number."""
    digits, tl = varint_digits(timestamps.astype(np.int64).view(np.uint64))
    m = len(timestamps)
    rows = np.empty((m, 12 + digits.shape[1]), np.uint8)
    rows[:, 0] = (field << 3) | 2
    rows[:, 1] = 10 + tl  # 0x09 + 8 bytes + 0x10 + varint (<= 20: a one-byte length)
    rows[:, 2] = 0x09
    rows[:, 3:11] = np.ascontiguousarray(values, dtype="<f8").view(np.uint8).reshape(m, 8)
    rows[:, 11] = 0x10
    rows[:, 12:] = digits
    return _packed(rows, 12 + tl), np.cumsum(12 + tl)


def _entry_samples(counts: np.ndarray, timestamps: np.ndarray, values: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """Per entry, its samples' fields (a binary array) and their length in bytes."""
    data, ends = sample_bytes(timestamps, values)
    bounds = np.concatenate([[0], ends])[_offsets(counts)]
    return binary_column(data, bounds), np.diff(bounds)


def _lengths(arr: pa.Array) -> np.ndarray:
    return np.asarray(pc.binary_length(arr).to_numpy(zero_copy_only=False), dtype=np.int64)


def _join(*parts: pa.Array) -> bytes:
    """The parts' elements laid end to end, entry after entry: part 0 of entry 0, part 1 of entry 0, ..."""
    joined = pc.binary_join_element_wise(*parts, _EMPTY)
    end = int(np.frombuffer(joined.buffers()[1], np.int64, len(joined) + 1, joined.offset * 8)[-1])
    return joined.buffers()[2].slice(0, end).to_pybytes() if end else b""


def _as_binary(entries: pa.Array | Sequence[bytes]) -> pa.Array:
    if isinstance(entries, pa.Array):
        return entries if entries.type == BINARY else entries.cast(BINARY)
    return pa.array(entries, BINARY)


def encode_v1(entry_labels: pa.Array | Sequence[bytes], counts: np.ndarray, timestamps: np.ndarray,
              values: np.ndarray) -> bytes:
    """A 1.0 WriteRequest (uncompressed): entry i is a TimeSeries with labels ``entry_labels[i]``
    (label_bytes_v1) and the next ``counts[i]`` samples."""
    if not len(counts):
        return b""
    labels = _as_binary(entry_labels)
    samples, sample_len = _entry_samples(counts, timestamps, values)
    header = tagged_varints(_V1_TIMESERIES, _lengths(labels) + sample_len)
    return _join(header, labels, samples)


# A timestamp whose varint is 6 bytes: every ms timestamp from 1971 to 2109. In that range a
# one-sample 1.0 entry is its series' fixed prefix then 15 bytes (encode_v1_one).
ONE_SAMPLE_TS = (1 << 35, (1 << 42) - 1)
_ONE_SAMPLE_LEN = 18  # the Sample field: tag, length, 0x09 + 8 bytes, 0x10 + a 6-byte varint
_ONE_TAIL = 15  # what follows the prefix: the value's 8 bytes, 0x10, the timestamp's 6


def one_sample_prefix(labels: bytes) -> bytes:
    """A 1.0 TimeSeries of one sample whose timestamp is in ONE_SAMPLE_TS, up to the sample's value:
    the TimeSeries tag and length, the labels (label_bytes_v1), the Sample's tag, length and 0x09.
    A sender keeps it per series: the live shape's requests are this prefix and 15 bytes an entry."""
    return bytes([_V1_TIMESERIES]) + varint(len(labels) + _ONE_SAMPLE_LEN) + labels + \
        bytes([(_SAMPLES << 3) | 2, _ONE_SAMPLE_LEN - 2, 0x09])


def encode_v1_one(prefixes: pa.Array, timestamps: np.ndarray, values: np.ndarray) -> bytes:
    """``encode_v1`` of entries of one sample each whose timestamps are all in ONE_SAMPLE_TS, from
    each entry's ``one_sample_prefix``: the same bytes, with one join of two parts and no varint
    lengths to compute (a request of the live shape, where every series sends one sample)."""
    m = len(timestamps)
    if not m:
        return b""
    digits, _ = varint_digits(timestamps.astype(np.int64).view(np.uint64))
    if digits.shape[1] != 6:
        raise ValueError("encode_v1_one: a timestamp outside ONE_SAMPLE_TS")
    tails = np.empty((m, _ONE_TAIL), np.uint8)
    tails[:, :8] = np.ascontiguousarray(values, dtype="<f8").view(np.uint8).reshape(m, 8)
    tails[:, 8] = 0x10
    tails[:, 9:] = digits
    return _join(_as_binary(prefixes), binary_column(tails.reshape(-1), np.arange(0, _ONE_TAIL * (m + 1), _ONE_TAIL)))


def encode_v2(symbols: pa.Array, refs: np.ndarray, ref_counts: np.ndarray, counts: np.ndarray,
              timestamps: np.ndarray, values: np.ndarray) -> bytes:
    """A 2.0 Request (uncompressed). ``symbols`` is the sender's table of label strings (utf-8,
    element 0 the empty string), ``refs`` its indices of each entry's label names and values
    (``ref_counts[i]`` of them for entry i, in order). The request's own symbols table holds the
    strings its entries use, once, ``""`` first as the specification asks, and the references are
    renumbered into it."""
    if not len(counts):
        return b""
    used = np.unique(np.concatenate([np.zeros(1, np.int64), np.asarray(refs, np.int64)]))
    table = _as_binary(symbols).take(pa.array(used))
    symbol_part = _join(tagged_varints(_V2_SYMBOLS, _lengths(table)), table)
    local = np.searchsorted(used, refs).astype(np.uint64)
    digits, size = varint_digits(local)
    ref_bounds = _offsets(size)[_offsets(ref_counts)]
    ref_len = np.diff(ref_bounds)
    ref_header = tagged_varints(_V2_LABELS_REFS, ref_len)
    samples, sample_len = _entry_samples(counts, timestamps, values)
    body_len = _lengths(ref_header) + ref_len + sample_len
    series_part = _join(tagged_varints(_V2_TIMESERIES, body_len), ref_header,
                        binary_column(_packed(digits, size), ref_bounds), samples)
    return symbol_part + series_part


def encode_v2_labels(entry_labels: Sequence[Labels], counts: np.ndarray, timestamps: np.ndarray,
                     values: np.ndarray) -> bytes:
    """``encode_v2`` from each entry's labels (a symbols table built for them alone)."""
    symbols: dict[str, int] = {"": 0}
    refs = [symbols.setdefault(s, len(symbols)) for labels in entry_labels for pair in labels for s in pair]
    table = pa.array([s.encode() for s in symbols], BINARY)
    return encode_v2(table, np.array(refs, np.int64), np.array([2 * len(lab) for lab in entry_labels], np.int64),
                     counts, timestamps, values)


def snappy(raw: bytes) -> bytes:
    """The snappy *block* format remote write uses (not the framed one)."""
    return bytes(cramjam.snappy.compress_raw(raw))
