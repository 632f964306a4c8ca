"""Snapshots of a store's state: capture, file format (metricsd/store/FORMAT.md), restore.

A snapshot is the store as it stood at one WAL position, so a restart loads it and replays only
the records after that position. capture() copies what it needs while the caller holds the event
loop (no write can interleave); write_snapshot() may then run on another thread. The big columns
go to the file as raw little-endian arrays (NumPy tobytes/frombuffer): no per-sample objects.

Tombstoned series are not written, so rows are renumbered densely on restore; nothing outside
the store keeps row numbers across a restart.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import zlib
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from metricsd.model import Labels
from metricsd.store.engine import Store
from metricsd.store.head import NO_TS, OFFSET_MAX
from metricsd.store.settings import StoreSettings
from metricsd.store.wal.log import WalPosition, fsync_dir

__all__ = ["ImageMeta", "SnapshotError", "StoreImage", "capture", "list_snapshots", "read_snapshot", "restore",
           "write_snapshot"]

log = logging.getLogger("metricsd.store.snapshot")

MAGIC = b"MDSN"
VERSION = 1
_FILE_HEADER = struct.Struct("<4sHH")  # magic, version, flags
_SECTION = struct.Struct("<4sB3xQI")  # tag, dtype, pad, payload bytes, crc32 of payload
SUFFIX = ".snap"

# FORMAT.md "Snapshot sections": element type codes
_DTYPES: dict[int, np.dtype | None] = {0: None, 1: np.dtype("<i4"), 2: np.dtype("<i8"), 3: np.dtype("<u8"),
                                       4: np.dtype("<f8")}
_SCHEMA: dict[bytes, int] = {
    b"META": 0, b"SIDS": 3, b"LSTL": 1, b"LSTB": 0, b"LPRN": 1, b"LPRS": 1,
    b"HCNT": 1, b"HSEA": 1, b"HLTS": 2, b"HCMX": 2, b"HTSS": 2, b"HVAL": 4,
    b"CNUM": 2, b"CIDX": 2, b"CSMP": 2, b"CDAT": 0,
    b"RHOU": 2, b"ROPN": 4, b"RCLN": 2, b"RCLD": 4,
}
_END = b"END "


class SnapshotError(ValueError):
    """A snapshot file is damaged or not one this version reads; the loader skips it."""


@dataclass(frozen=True)
class ImageMeta:
    max_ts: int
    samples_written: int
    rejected: dict[str, int]
    head_capacity: int
    head_keep: int


@dataclass
class StoreImage:
    """A store's state as columns, live series only, in row order (n series)."""

    position: WalPosition  # the first WAL record not reflected here
    meta: ImageMeta
    ids: np.ndarray  # uint64[n]
    labels: list[Labels]
    head_count: np.ndarray  # int32[n]
    head_sealed: np.ndarray  # int32[n]
    head_last_ts: np.ndarray  # int64[n]
    head_chunk_max: np.ndarray  # int64[n]
    head_ts: np.ndarray  # int64[sum(head_count)], row after row
    head_vals: np.ndarray  # float64[sum(head_count)]
    chunk_counts: np.ndarray  # int64[n] chunks per series
    chunk_index: np.ndarray  # int64[3 * sum(chunk_counts)]: min_ts, max_ts, end offset in the series' bytes
    chunk_samples: np.ndarray  # int64[n]
    chunk_data: bytes  # every series' chunk bytes back to back
    roll_hour: np.ndarray  # int64[n]
    roll_open: np.ndarray  # float64[n, 5]: min, max, sum, count, last of the open hour
    closed_hours: np.ndarray  # int64[n]
    closed: np.ndarray  # float64[6 * sum(closed_hours)]: hour, min, max, sum, count, last


def capture(store: Store, position: WalPosition) -> StoreImage:
    """Copy the store's state (nothing shared with the live store). Call with no write in between
    the WAL reaching ``position`` and this; O(series + head samples + chunk bytes)."""
    idx = store.index
    rows = np.flatnonzero(idx.alive[: idx.n_rows])
    row_list = rows.tolist()
    labels: list[Labels] = []
    for r in row_list:
        lab = idx.labels[r]
        assert lab is not None
        labels.append(lab)
    h = store.head
    count = h.count[rows].astype(np.int32)
    mask = np.arange(h.capacity)[None, :] < count[:, None]
    chunk_lists = [store.chunks[r] for r in row_list]
    closed_bufs = [store.rollups.closed.get(r) for r in row_list]
    ro = store.rollups
    return StoreImage(
        position=position,
        meta=ImageMeta(max_ts=int(store.max_ts), samples_written=int(store.samples_written),
                       rejected={k: int(v) for k, v in store.rejected.items()}, head_capacity=h.capacity,
                       head_keep=h.keep),
        ids=idx.id_column[rows].astype(np.uint64),
        labels=labels,
        head_count=count,
        head_sealed=h.sealed[rows].astype(np.int32),
        head_last_ts=h.last_ts[rows].astype(np.int64),
        head_chunk_max=h.chunk_max_ts[rows].astype(np.int64),
        head_ts=(h.ts[rows].astype(np.int64) + h.base[rows][:, None])[mask],
        head_vals=h.vals[rows][mask],
        chunk_counts=np.array([len(c) for c in chunk_lists], dtype=np.int64),
        chunk_index=(np.concatenate([c.time_index() for c in chunk_lists]) if chunk_lists
                     else np.zeros(0, dtype=np.int64)),
        chunk_samples=np.array([c.samples for c in chunk_lists], dtype=np.int64),
        chunk_data=b"".join(c.data for c in chunk_lists),
        roll_hour=ro.hour[rows].astype(np.int64),
        roll_open=np.stack([ro.min[rows], ro.max[rows], ro.sum[rows], ro.count[rows], ro.last[rows]], axis=1),
        closed_hours=np.array([len(b) // 6 if b else 0 for b in closed_bufs], dtype=np.int64),
        closed=np.frombuffer(b"".join(b.tobytes() for b in closed_bufs if b), dtype=np.float64),
    )


# --- the file ------------------------------------------------------------------------------


def _encode_labels(labels: list[Labels]) -> tuple[np.ndarray, bytes, np.ndarray, np.ndarray]:
    """A string table (byte lengths, utf-8 bytes) and per series its pairs as string ids."""
    ids: dict[str, int] = {}
    strings: list[bytes] = []
    per: list[int] = []
    pairs: list[int] = []
    for lab in labels:
        per.append(len(lab))
        for name, value in lab:
            for s in (name, value):
                i = ids.get(s)
                if i is None:
                    i = ids[s] = len(strings)
                    strings.append(s.encode())
                pairs.append(i)
    return (np.array([len(s) for s in strings], dtype=np.int32), b"".join(strings), np.array(per, dtype=np.int32),
            np.array(pairs, dtype=np.int32))


def _decode_labels(lengths: np.ndarray, blob: bytes, per: np.ndarray, pairs: np.ndarray) -> list[Labels]:
    ends = np.cumsum(lengths, dtype=np.int64)
    if len(ends) and int(ends[-1]) != len(blob):
        raise SnapshotError("label string table lengths do not add up")
    starts = (ends - lengths).tolist()
    strings = [blob[s:e].decode() for s, e in zip(starts, ends.tolist(), strict=True)]
    if int(per.sum()) * 2 != len(pairs) or (len(pairs) and (int(pairs.min()) < 0 or int(pairs.max()) >= len(strings))):
        raise SnapshotError("label pairs do not match the string table")
    flat = [strings[i] for i in pairs.tolist()]
    out: list[Labels] = []
    pos = 0
    for k in per.tolist():
        out.append(tuple((flat[j], flat[j + 1]) for j in range(pos, pos + 2 * k, 2)))
        pos += 2 * k
    return out


def _sections(img: StoreImage) -> list[tuple[bytes, bytes | np.ndarray]]:
    meta = dict(vars(img.meta), wal_segment=img.position.segment, wal_offset=img.position.offset,
                series=len(img.ids))
    lstl, lstb, lprn, lprs = _encode_labels(img.labels)
    return [
        (b"META", json.dumps(meta, sort_keys=True).encode()),
        (b"SIDS", img.ids), (b"LSTL", lstl), (b"LSTB", lstb), (b"LPRN", lprn), (b"LPRS", lprs),
        (b"HCNT", img.head_count), (b"HSEA", img.head_sealed), (b"HLTS", img.head_last_ts),
        (b"HCMX", img.head_chunk_max), (b"HTSS", img.head_ts), (b"HVAL", img.head_vals),
        (b"CNUM", img.chunk_counts), (b"CIDX", img.chunk_index), (b"CSMP", img.chunk_samples),
        (b"CDAT", img.chunk_data),
        (b"RHOU", img.roll_hour), (b"ROPN", img.roll_open), (b"RCLN", img.closed_hours), (b"RCLD", img.closed),
    ]


def snapshot_path(directory: Path, position: WalPosition) -> Path:
    return directory / f"{position.segment:08d}{SUFFIX}"


def list_snapshots(directory: Path) -> list[tuple[int, Path]]:
    """(WAL segment it starts replay at, path), oldest first."""
    out = [(int(p.stem), p) for p in directory.glob(f"*{SUFFIX}") if p.stem.isdigit()]
    return sorted(out)


def _section_header(tag: bytes, dtype: int, payload: memoryview, count: int | None = None) -> bytes:
    """Tag, type and length are covered by the CRC with the payload, so no flipped bit goes unseen."""
    n = payload.nbytes if count is None else count
    head = _SECTION.pack(tag, dtype, n, 0)[:-4]
    return head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head)))


def write_snapshot(directory: Path, img: StoreImage) -> tuple[Path, int]:
    """Write atomically (temp file, fsync, rename, fsync the directory); returns (path, bytes).
    Safe to run on another thread: the image shares nothing with the store. Raises OSError (a full
    disk) with the temp file removed, so a failed snapshot does not keep the space it took."""
    directory.mkdir(parents=True, exist_ok=True)
    path = snapshot_path(directory, img.position)
    tmp = path.with_name(path.name + ".tmp")
    try:
        size = _write_file(tmp, _sections(img))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    fsync_dir(directory)
    return path, size


def _write_file(tmp: Path, secs: list[tuple[bytes, bytes | np.ndarray]]) -> int:
    written = 0
    with open(tmp, "wb") as f:
        f.write(_FILE_HEADER.pack(MAGIC, VERSION, 0))
        for tag, data in secs:
            # FORMAT.md "Snapshot section"
            raw = np.ascontiguousarray(data).reshape(-1).data.cast("B") if isinstance(data, np.ndarray) \
                else memoryview(data)
            f.write(_section_header(tag, _SCHEMA[tag], raw))
            f.write(raw)
            written += raw.nbytes
        f.write(_section_header(_END, 0, memoryview(b""), len(secs)))
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


def read_snapshot(path: Path) -> StoreImage:
    """Parse and verify a snapshot file. Raises SnapshotError (or OSError) when it is unusable."""
    buf = path.read_bytes()
    view = memoryview(buf)
    if len(buf) < _FILE_HEADER.size:
        raise SnapshotError("file shorter than its header")
    magic, version, flags = _FILE_HEADER.unpack_from(buf, 0)
    if magic != MAGIC or version != VERSION or flags:
        raise SnapshotError(f"not a version-{VERSION} snapshot (magic {bytes(magic)!r}, version {version})")
    pos = _FILE_HEADER.size
    found: dict[bytes, memoryview] = {}
    while True:
        if len(buf) - pos < _SECTION.size:
            raise SnapshotError(f"truncated at byte {pos} (no end marker)")
        tag, dtype, n, crc = _SECTION.unpack_from(buf, pos)
        head = view[pos : pos + _SECTION.size - 4]
        pos += _SECTION.size
        if tag == _END:
            if zlib.crc32(b"", zlib.crc32(head)) != crc:
                raise SnapshotError(f"end marker at byte {pos - _SECTION.size}: checksum mismatch")
            if n != len(found):
                raise SnapshotError(f"end marker counts {n} sections, found {len(found)}")
            if pos != len(buf):
                raise SnapshotError(f"{len(buf) - pos} bytes after the end marker")
            break
        if tag not in _SCHEMA or dtype != _SCHEMA[tag]:
            raise SnapshotError(f"unexpected section {bytes(tag)!r} (type {dtype}) at byte {pos - _SECTION.size}")
        if pos + n > len(buf):
            raise SnapshotError(f"section {tag.decode()} at byte {pos - _SECTION.size} runs past the end of the file "
                                f"({n} bytes from byte {pos}, {len(buf)} in the file)")
        payload = view[pos : pos + n]
        if zlib.crc32(payload, zlib.crc32(head)) != crc:
            raise SnapshotError(f"section {tag.decode()} at byte {pos - _SECTION.size}: checksum mismatch over bytes "
                                f"{pos - _SECTION.size}..{pos + n}")
        found[tag] = payload
        pos += n
    missing = sorted(t.decode() for t in set(_SCHEMA) - set(found))
    if missing:
        raise SnapshotError(f"sections missing: {missing}")
    return _image(found)


def _arr(found: dict[bytes, memoryview], tag: bytes) -> np.ndarray:
    dt = _DTYPES[_SCHEMA[tag]]
    assert dt is not None
    raw = found[tag]
    if raw.nbytes % dt.itemsize:
        raise SnapshotError(f"section {tag.decode()} is not a whole number of {dt} elements")
    return np.frombuffer(raw, dtype=dt)


def _image(found: dict[bytes, memoryview]) -> StoreImage:
    try:
        raw = json.loads(bytes(found[b"META"]))
        position = WalPosition(int(raw["wal_segment"]), int(raw["wal_offset"]))
        n = int(raw["series"])
        meta = ImageMeta(max_ts=int(raw["max_ts"]), samples_written=int(raw["samples_written"]),
                         rejected={str(k): int(v) for k, v in raw["rejected"].items()},
                         head_capacity=int(raw["head_capacity"]), head_keep=int(raw["head_keep"]))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise SnapshotError(f"bad META section: {e}") from e
    a = {t: _arr(found, t) for t, d in _SCHEMA.items() if d}
    img = StoreImage(
        position=position, meta=meta, ids=a[b"SIDS"],
        labels=_decode_labels(a[b"LSTL"], bytes(found[b"LSTB"]), a[b"LPRN"], a[b"LPRS"]),
        head_count=a[b"HCNT"], head_sealed=a[b"HSEA"], head_last_ts=a[b"HLTS"], head_chunk_max=a[b"HCMX"],
        head_ts=a[b"HTSS"], head_vals=a[b"HVAL"], chunk_counts=a[b"CNUM"], chunk_index=a[b"CIDX"],
        chunk_samples=a[b"CSMP"], chunk_data=bytes(found[b"CDAT"]), roll_hour=a[b"RHOU"],
        roll_open=a[b"ROPN"].reshape(-1, 5) if len(a[b"ROPN"]) % 5 == 0 else a[b"ROPN"],
        closed_hours=a[b"RCLN"], closed=a[b"RCLD"],
    )
    _check_shapes(img, n)
    return img


def _check_shapes(img: StoreImage, n: int) -> None:
    per_series = [img.ids, img.head_count, img.head_sealed, img.head_last_ts, img.head_chunk_max, img.chunk_counts,
                  img.chunk_samples, img.roll_hour, img.closed_hours]
    if len(img.labels) != n or any(len(x) != n for x in per_series) or img.roll_open.shape != (n, 5):
        raise SnapshotError(f"per-series sections do not all hold {n} series")
    if len(img.head_ts) != int(img.head_count.sum()) or len(img.head_vals) != len(img.head_ts):
        raise SnapshotError("head samples do not match head counts")
    if len(img.chunk_index) != 3 * int(img.chunk_counts.sum()):
        raise SnapshotError("chunk index does not match chunk counts")
    if len(img.closed) != 6 * int(img.closed_hours.sum()):
        raise SnapshotError("closed rollups do not match their counts")
    cap = img.meta.head_capacity
    if bool((img.head_sealed < 0).any() or (img.head_sealed > img.head_count).any() or (img.head_count > cap).any()):
        raise SnapshotError("head counts out of range")


# --- restore -------------------------------------------------------------------------------


def restore(img: StoreImage, settings: StoreSettings,
            progress: Callable[[int, int], None] | None = None) -> Store:
    """A new store holding the image. A head capacity different from the image's (changed
    chunk_samples or head_keep) is handled by sealing rows that no longer fit.
    Raises SnapshotError when the image contradicts itself."""
    store = Store(settings)
    n = len(img.ids)
    chunk_end = np.cumsum(img.chunk_counts)
    chunk_start = (chunk_end - img.chunk_counts).tolist()
    data = memoryview(img.chunk_data)
    off = 0
    ids = img.ids.tolist()
    samples = img.chunk_samples.tolist()
    try:
        for i in range(n):
            row = store.add_series(ids[i], img.labels[i])
            if row != i:
                raise SnapshotError(f"series {i} restored at row {row}")
            k0, k1 = chunk_start[i], int(chunk_end[i])
            if k1 > k0:
                time_index = img.chunk_index[3 * k0 : 3 * k1]
                nbytes = int(time_index[-1])
                store.chunks[i].restore(time_index, bytes(data[off : off + nbytes]), samples[i])
                off += nbytes
            if progress is not None and i % 4096 == 4095:
                progress(i + 1, n)
    except KeyError as e:
        raise SnapshotError(f"series id listed twice: {e}") from e
    if off != len(data):
        raise SnapshotError(f"chunk bytes: {len(data)} in the file, {off} referenced")
    _restore_head(store, img)
    ro = store.rollups
    ro.hour[:n] = img.roll_hour
    ro.min[:n], ro.max[:n], ro.sum[:n], ro.count[:n], ro.last[:n] = img.roll_open.T
    pos = 0
    for i, k in enumerate(img.closed_hours.tolist()):
        if k:
            ro.set_closed(i, array("d", img.closed[pos : pos + 6 * k].tobytes()))
            pos += 6 * k
    store.max_ts = img.meta.max_ts
    store.samples_written = img.meta.samples_written
    store.rejected = Counter(img.meta.rejected)
    if progress is not None:
        progress(n, n)
    return store


def _restore_head(store: Store, img: StoreImage) -> None:
    h = store.head
    n = len(img.ids)
    h.last_ts[:n] = img.head_last_ts
    h.chunk_max_ts[:n] = img.head_chunk_max
    counts = img.head_count.astype(np.int64)
    ends = np.cumsum(counts)
    starts = ends - counts
    first = np.zeros(n, np.int64)
    last = np.zeros(n, np.int64)
    filled = counts > 0
    first[filled] = img.head_ts[starts[filled]]
    last[filled] = img.head_ts[ends[filled] - 1]
    if img.meta.head_capacity == h.capacity and bool(np.all(last - first <= OFFSET_MAX)):
        h.count[:n] = img.head_count
        h.sealed[:n] = img.head_sealed
        h.base[:n] = first
        mask = np.arange(h.capacity)[None, :] < img.head_count[:, None]
        h.ts[:n][mask] = img.head_ts - np.repeat(first, counts)
        h.vals[:n][mask] = img.head_vals
        return
    log.warning("snapshot head (capacity %s) does not fit the settings' head (capacity %d, rows spanning "
                "at most %d ms): refitting rows", img.meta.head_capacity, h.capacity, OFFSET_MAX)
    for i in range(n):
        c = int(counts[i])
        t, v = img.head_ts[int(starts[i]) : int(ends[i])], img.head_vals[int(starts[i]) : int(ends[i])]
        s = int(img.head_sealed[i])
        if c <= h.capacity and (c == 0 or int(t[-1]) - int(t[0]) <= OFFSET_MAX):
            h.replace_row(i, t, v, s)
            continue
        store.chunks[i].append(t[s:], v[s:])  # seal what no longer fits; keep the newest as overlap
        k = min(h.keep, c)
        while k > 1 and int(t[-1]) - int(t[c - k]) > OFFSET_MAX:
            k -= 1
        h.replace_row(i, t[c - k :], v[c - k :], k)
        hi = store.chunks[i].max_ts()
        h.chunk_max_ts[i] = NO_TS if hi is None else hi
