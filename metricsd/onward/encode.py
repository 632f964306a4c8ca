"""Remote-write request bodies from columns: Prometheus remote write 1.0 (``prometheus.WriteRequest``)
and 2.0 (``io.prometheus.write.v2.Request``), snappy block compressed.

The labels of a series are encoded once (``label_bytes_v1``) and kept by the sender; a request is
then the concatenation, per entry, of a TimeSeries header, those bytes and the samples' bytes,
which NumPy writes for all samples of a request at once (``sample_bytes``). The message layout
is fixed by the proto files in proto/ (prometheus_remote.proto, prometheus_remote_v2.proto);
the receiver's decoder (metricsd/http/remote_write_scan.py) reads exactly these bytes, which the
tests check, as they check the 1.0 body against the generated message classes.

Pure: columns in, bytes out.
"""

from __future__ import annotations

from collections.abc import Sequence

import cramjam
import numpy as np

from metricsd.model import Labels
from metricsd.proto import prometheus_remote_v2_pb2 as v2
from metricsd.rpc.wire import varint

__all__ = ["V1_CONTENT_TYPE", "V2_CONTENT_TYPE", "encode_v1", "encode_v2", "label_bytes_v1", "sample_bytes",
           "snappy"]

V1_CONTENT_TYPE = "application/x-protobuf"
V2_CONTENT_TYPE = "application/x-protobuf;proto=io.prometheus.write.v2.Request"


def label_bytes_v1(labels: Labels) -> bytes:
    """A series' ``repeated Label labels = 1`` fields of a 1.0 TimeSeries, sorted by name."""
    out = []
    for k, v in labels:
        kb, vb = k.encode(), v.encode()
        inner = b"\x0a" + varint(len(kb)) + kb + b"\x12" + varint(len(vb)) + vb
        out.append(b"\x0a" + varint(len(inner)) + inner)
    return b"".join(out)


def _varint_lengths(u: np.ndarray) -> np.ndarray:
    """Bytes of each value's base-128 varint (1..10)."""
    n = np.ones(len(u), np.int64)
    for k in range(1, 10):
        n += u >= np.uint64(1 << (7 * k))
    return n


def sample_bytes(timestamps: np.ndarray, values: np.ndarray, field: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Every sample as an embedded ``Sample`` field (tag ``field``, length, then ``double value =
    1``, ``int64 timestamp = 2``), concatenated: the bytes (uint8) and where each sample's bytes
    end. The Sample message is the same in 1.0 and 2.0."""
    u = timestamps.astype(np.int64).view(np.uint64)  # a negative int64 is a 10-byte varint, as protobuf writes it
    tl = _varint_lengths(u)
    inner = 10 + tl  # 0x09 + 8 bytes + 0x10 + varint
    size = 2 + inner  # tag + one-byte length (inner <= 20)
    ends = np.cumsum(size)
    starts = ends - size
    out = np.zeros(int(ends[-1]) if len(ends) else 0, np.uint8)
    out[starts] = (field << 3) | 2
    out[starts + 1] = inner
    out[starts + 2] = 0x09
    vb = values.astype("<f8").view(np.uint8).reshape(-1, 8)
    for k in range(8):
        out[starts + 3 + k] = vb[:, k]
    out[starts + 11] = 0x10
    rest = u.copy()
    for k in range(int(tl.max()) if len(tl) else 0):
        live = tl > k
        byte = (rest & np.uint64(0x7F)).astype(np.uint8)
        more = tl > k + 1
        byte[more] |= 0x80
        out[(starts + 12 + k)[live]] = byte[live]
        rest >>= np.uint64(7)
    return out, ends


def encode_v1(entry_labels: Sequence[bytes], counts: np.ndarray, timestamps: np.ndarray,
              values: np.ndarray) -> bytes:
    """A 1.0 WriteRequest (uncompressed): entry i is a TimeSeries with labels ``entry_labels[i]``
    (label_bytes_v1) and the next ``counts[i]`` samples."""
    if not len(counts):
        return b""
    raw, ends = sample_bytes(timestamps, values)
    sample_end = np.concatenate([[0], ends])[np.cumsum(counts)]
    sample_start = np.concatenate([[0], sample_end[:-1]])
    data = raw.tobytes()
    parts: list[bytes] = []
    add = parts.append
    for labels, a, b in zip(entry_labels, sample_start.tolist(), sample_end.tolist(), strict=True):
        add(b"\x0a" + varint(len(labels) + b - a) + labels)
        add(data[a:b])
    return b"".join(parts)


def encode_v2(entry_labels: Sequence[Labels], counts: np.ndarray, timestamps: np.ndarray,
              values: np.ndarray) -> bytes:
    """A 2.0 Request (uncompressed): a symbols table (``""`` first, as the specification asks)
    and per entry its label references and samples."""
    symbols: dict[str, int] = {"": 0}
    req = v2.Request()
    ts_list, v_list = timestamps.tolist(), values.tolist()
    at = 0
    for labels, n in zip(entry_labels, counts.tolist(), strict=True):
        refs = []
        for k, v in labels:
            refs.append(symbols.setdefault(k, len(symbols)))
            refs.append(symbols.setdefault(v, len(symbols)))
        series = req.timeseries.add(labels_refs=refs)
        series.samples.extend(v2.Sample(value=val, timestamp=t) for t, val in
                              zip(ts_list[at:at + n], v_list[at:at + n], strict=True))
        at += n
    req.symbols.extend(symbols)
    return req.SerializeToString()


def snappy(raw: bytes) -> bytes:
    """The snappy *block* format remote write uses (not the framed one)."""
    return bytes(cramjam.snappy.compress_raw(raw))
