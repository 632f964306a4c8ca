"""Reading version-1 snapshots (raw head samples, version-1 chunks) into a store.

Stores before the compressed head wrote every head sample raw and sealed chunks in the
version-1 codec (metricsd/codec/FORMAT.md, "Chunk"). A restart after an upgrade loads such a
file once: its sections are checked as before, each series' samples are decoded and appended
to a fresh store (sealed in blocks as any write is), its rollups copied. The next snapshot is
written in the current version.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np

from metricsd.codec import CorruptChunk, decode_chunk
from metricsd.store.engine import Store
from metricsd.store.seal import store_segments
from metricsd.store.settings import StoreSettings
from metricsd.store.snapshot import SnapshotError, arr, decode_labels, read_sections
from metricsd.store.wal.log import WalPosition

__all__ = ["position_v1", "read_v1"]

_SCHEMA_V1: dict[bytes, int] = {
    b"META": 0, b"SIDS": 3, b"LSTL": 1, b"LSTB": 0, b"LPRN": 1, b"LPRS": 1,
    b"HCNT": 1, b"HSEA": 1, b"HLTS": 2, b"HCMX": 2, b"HTSS": 2, b"HVAL": 4,
    b"CNUM": 2, b"CIDX": 2, b"CSMP": 2, b"CDAT": 0,
    b"RHOU": 2, b"ROPN": 4, b"RCLN": 2, b"RCLD": 4,
}


def _meta(buf: bytes) -> dict[str, object]:
    found = read_sections(buf, _SCHEMA_V1)
    try:
        meta = json.loads(bytes(found[b"META"]))
        assert isinstance(meta, dict)
        return meta
    except (ValueError, AssertionError) as e:
        raise SnapshotError(f"bad META section: {e}") from e


def position_v1(buf: bytes) -> WalPosition:
    meta = _meta(buf)
    try:
        return WalPosition(int(meta["wal_segment"]), int(meta["wal_offset"]))  # type: ignore[call-overload]
    except (KeyError, TypeError, ValueError) as e:
        raise SnapshotError(f"bad META section: {e}") from e


def read_v1(buf: bytes) -> Store:
    """A store holding a version-1 snapshot file's state (default settings; restore() refits it).
    Raises SnapshotError when the file is damaged or contradicts itself."""
    found = read_sections(buf, _SCHEMA_V1)
    try:
        meta = json.loads(bytes(found[b"META"]))
        n = int(meta["series"])
        max_ts, written = int(meta["max_ts"]), int(meta["samples_written"])
        rejected = {str(k): int(v) for k, v in meta["rejected"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise SnapshotError(f"bad META section: {e}") from e
    a = {t: arr(found, t, _SCHEMA_V1) for t, d in _SCHEMA_V1.items() if d}
    labels = decode_labels(a[b"LSTL"], bytes(found[b"LSTB"]), a[b"LPRN"], a[b"LPRS"])
    per = [a[t] for t in (b"SIDS", b"HCNT", b"HSEA", b"HLTS", b"CNUM", b"CSMP", b"RHOU", b"RCLN")]
    if len(labels) != n or any(len(x) != n for x in per) or len(a[b"ROPN"]) != 5 * n:
        raise SnapshotError(f"per-series sections do not all hold {n} series")
    hcnt, hsea = a[b"HCNT"].astype(np.int64), a[b"HSEA"].astype(np.int64)
    if len(a[b"HTSS"]) != int(hcnt.sum()) or len(a[b"HVAL"]) != len(a[b"HTSS"]) or bool((hsea > hcnt).any()):
        raise SnapshotError("head samples do not match head counts")
    if len(a[b"CIDX"]) != 3 * int(a[b"CNUM"].sum()) or len(a[b"RCLD"]) != 6 * int(a[b"RCLN"].sum()):
        raise SnapshotError("chunk index or rollups do not match their counts")
    store = Store(StoreSettings(require_pod_labels=False))
    data = found[b"CDAT"]
    cidx = a[b"CIDX"].reshape(-1, 3)
    h_end = np.cumsum(hcnt)
    c_end = np.cumsum(a[b"CNUM"])
    off = 0
    ids = a[b"SIDS"].tolist()
    for i in range(n):
        try:
            row = store.add_series(ids[i], labels[i])
        except KeyError as e:
            raise SnapshotError(f"series id listed twice: {e}") from e
        k0, k1 = int(c_end[i] - a[b"CNUM"][i]), int(c_end[i])
        parts_t, parts_v = [], []
        start = 0
        for j in range(k0, k1):
            end = int(cidx[j, 2])
            if not start < end <= len(data) - off:
                raise SnapshotError(f"series {i}: chunk bytes out of range")
            try:
                t, v = decode_chunk(data[off + start : off + end])
            except CorruptChunk as e:
                raise SnapshotError(f"series {i}: {e}") from e
            parts_t.append(t)
            parts_v.append(v)
            start = end
        off += start
        h0 = int(h_end[i] - hcnt[i])
        parts_t.append(a[b"HTSS"][h0 + int(hsea[i]) : int(h_end[i])])
        parts_v.append(a[b"HVAL"][h0 + int(hsea[i]) : int(h_end[i])])
        t, v = np.concatenate(parts_t), np.concatenate(parts_v)
        if len(t) and bool(np.any(t[1:] <= t[:-1])):
            raise SnapshotError(f"series {i}: samples out of order")
        if len(t):
            store_segments(store.head, store.chunks, np.array([row]), np.array([len(t)]), np.zeros(1, np.int64),
                           t, np.ascontiguousarray(v))
    if off != len(data):
        raise SnapshotError(f"chunk bytes: {len(data)} in the file, {off} referenced")
    store.head.last_ts[:n] = a[b"HLTS"]
    ro = store.rollups
    ro.hour[:n] = a[b"RHOU"]
    ro.min[:n], ro.max[:n], ro.sum[:n], ro.count[:n], ro.last[:n] = a[b"ROPN"].reshape(-1, 5).T
    closed = a[b"RCLD"].reshape(-1, 6)  # per series, its hours: hour, min, max, sum, count, last
    rows = np.repeat(np.arange(n), a[b"RCLN"])
    order = np.lexsort((rows, closed[:, 0]))  # by hour, then series
    hours, sizes = np.unique(closed[order, 0].astype(np.int64), return_counts=True)
    ro.restore_closed(hours, sizes, rows[order].astype(np.int32), closed[order][:, [1, 2, 3, 5]].reshape(-1),
                      closed[order, 4].astype(np.int32))
    store.max_ts, store.samples_written, store.rejected = max_ts, written, Counter(rejected)
    return store
