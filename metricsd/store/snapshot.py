"""Snapshots of a store's state: capture, file format (metricsd/store/FORMAT.md), restore.

A snapshot is the store as it stood at one WAL position, so a restart loads it and replays only
the records after that position. capture() copies what it needs while the caller holds the event
loop (no write can interleave); write_snapshot() may then run on another thread. Samples go to
the file as the store holds them, compressed chunk bytes (nothing is decoded or encoded again),
and the other columns as little-endian arrays, zstd-compressed where that makes them smaller.

Tombstoned series are not written, so rows are renumbered densely on restore; nothing outside
the store keeps row numbers across a restart. Version-1 files (raw head samples and version-1
chunks) are still read: metricsd/store/snapshot_v1.py turns them into a store.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from metricsd.codec.zstdsized import decompress_exact
from metricsd.model import Labels
from metricsd.store.chunks import STRIDE
from metricsd.store.engine import Store
from metricsd.store.head import OFFSET_MAX
from metricsd.store.seal import store_segments
from metricsd.store.settings import StoreSettings
from metricsd.store.wal.log import WalPosition, fsync_dir

if TYPE_CHECKING:
    from metricsd.store.slabfiles import SlabFiles
    from metricsd.store.snapshot_write import LeanImage

__all__ = ["ImageMeta", "SnapshotError", "StoreImage", "capture", "list_snapshots", "read_snapshot", "restore",
           "write_snapshot"]

log = logging.getLogger("metricsd.store.snapshot")

MAGIC = b"MDSN"
VERSION = 2
_FILE_HEADER = struct.Struct("<4sHH")  # magic, version, flags
_SECTION = struct.Struct("<4sBB2xQI")  # tag, dtype, codec, pad, payload bytes, crc32 of payload
_RAW_LEN = struct.Struct("<Q")  # a zstd payload starts with its decompressed length
SUFFIX = ".snap"
CODEC_RAW, CODEC_ZSTD = 0, 1
ZSTD_LEVEL = 1
MAX_SECTION_BYTES = 1 << 40  # a decompressed section larger than this is refused

# FORMAT.md "Snapshot sections": element type codes
_DTYPES: dict[int, np.dtype | None] = {0: None, 1: np.dtype("<i4"), 2: np.dtype("<i8"), 3: np.dtype("<u8"),
                                       4: np.dtype("<f8")}
_SCHEMA: dict[bytes, int] = {
    b"META": 0, b"SIDS": 3, b"LSTL": 1, b"LSTB": 0, b"LPRN": 1, b"LPRS": 1,
    b"HFIL": 1, b"HUNS": 1, b"HLTS": 2, b"HTSS": 2, b"HVAL": 4,
    b"CNUM": 2, b"CIDX": 2, b"CDAT": 0, b"CMAX": 2,
    b"OCNT": 2, b"OMIN": 2, b"OHSH": 3, b"OLEN": 2, b"ODAT": 0,
    b"KT2 ": 2, b"KV1 ": 4, b"KV2 ": 4, b"KSFT": 1, b"KFAM": 1,
    b"RHOU": 2, b"ROPN": 4, b"RBHR": 2, b"RBSZ": 2, b"RROW": 1, b"RVAL": 4, b"RCNT": 1,
}
_END = b"END "


class SnapshotError(ValueError):
    """A snapshot file is damaged or not one this version reads; the loader skips it."""


@dataclass(frozen=True)
class ImageMeta:
    max_ts: int
    samples_written: int
    rejected: dict[str, int]
    head_keep: int  # the ring's size and the block size it was taken with
    chunk_samples: int


@dataclass
class StoreImage:
    """A store's state as columns, live series only, in row order (n series)."""

    position: WalPosition  # the first WAL record not reflected here
    meta: ImageMeta
    ids: np.ndarray  # uint64[n]
    labels: list[Labels]
    head_filled: np.ndarray  # int32[n] ring samples
    head_unsealed: np.ndarray  # int32[n] of which in no block yet (the newest)
    head_last_ts: np.ndarray  # int64[n]
    head_ts: np.ndarray  # int64[sum(head_filled)], row after row, oldest first
    head_vals: np.ndarray  # float64[sum(head_filled)]
    chunk_counts: np.ndarray  # int64[n] closed chunks per series
    chunk_index: np.ndarray  # int64[5 * sum(chunk_counts)]: min_ts, max_ts, end, samples, hash per chunk
    chunk_data: bytes  # every series' closed chunks back to back
    chunk_max: np.ndarray  # int64[n] newest sealed sample (int64 min: none)
    open_count: np.ndarray  # int64[n] samples in the open chunk (0: none)
    open_min: np.ndarray  # int64[n]
    open_hash: np.ndarray  # uint64[n]
    open_len: np.ndarray  # int64[n] bytes of the open chunk
    open_data: bytes  # every series' open chunk back to back
    chain_t2: np.ndarray  # int64[n]
    chain_v1: np.ndarray  # float64[n]
    chain_v2: np.ndarray  # float64[n]
    chain_shift: np.ndarray  # int32[n]
    chain_family: np.ndarray  # int32[n]
    roll_hour: np.ndarray  # int64[n]
    roll_open: np.ndarray  # float64[n, 5]: min, max, sum, count, last of the open hour
    block_hours: np.ndarray  # int64[b] closed rollup hours, oldest first
    block_sizes: np.ndarray  # int64[b] series with a rollup in each
    closed_rows: np.ndarray  # int32[sum(block_sizes)] series (0..n-1), increasing within a block
    closed_vals: np.ndarray  # float64[4 * sum(block_sizes)]: min, max, sum, last
    closed_count: np.ndarray  # int32[sum(block_sizes)]


def capture(store: Store, position: WalPosition) -> StoreImage:
    """Copy the store's state (nothing shared with the live store). Call with no write in between
    the WAL reaching ``position`` and this; O(series + ring samples), plus joining the chunks' bytes."""
    idx = store.index
    rows = np.flatnonzero(idx.alive[: idx.n_rows])
    row_list = rows.tolist()
    labels: list[Labels] = []
    for r in row_list:
        lab = idx.labels[r]
        assert lab is not None
        labels.append(lab)
    h, c, ro = store.head, store.chunks, store.rollups
    filled = h.filled[rows].astype(np.int64)
    width = max(1, int(filled.max()) if len(rows) else 1)
    ht, hv, _ = h.newest(rows, width)
    mask = np.arange(width)[None, :] < filled[:, None]
    bh, bs, brow, bval, bcnt = ro.closed_of(rows)
    open_bufs = [c.open[r] for r in row_list]
    closed = [c.closed(r) for r in row_list]
    return StoreImage(
        position=position,
        meta=ImageMeta(max_ts=int(store.max_ts), samples_written=int(store.samples_written),
                       rejected={k: int(v) for k, v in store.rejected.items()}, head_keep=h.capacity,
                       chunk_samples=c.chunk_samples),
        ids=idx.id_column[rows].astype(np.uint64),
        labels=labels,
        head_filled=filled.astype(np.int32),
        head_unsealed=h.unsealed[rows].astype(np.int32),
        head_last_ts=h.last_ts[rows].astype(np.int64),
        head_ts=ht[mask],
        head_vals=hv[mask],
        chunk_counts=c.n_closed[rows].astype(np.int64),
        chunk_index=np.concatenate([closed[i][1].reshape(-1) for i in range(len(row_list))]) if row_list
        else np.zeros(0, np.int64),
        chunk_data=b"".join(closed[i][0] for i in range(len(row_list))),
        chunk_max=c.max_ts[rows].copy(),
        open_count=c.open_count[rows].astype(np.int64),
        open_min=c.open_min[rows].copy(),
        open_hash=c.open_hash[rows].copy(),
        open_len=np.array([len(b) for b in open_bufs], dtype=np.int64),
        open_data=b"".join(open_bufs),
        chain_t2=c.t2[rows].copy(),
        chain_v1=c.v1[rows].copy(),
        chain_v2=c.v2[rows].copy(),
        chain_shift=c.shift[rows].astype(np.int32),
        chain_family=c.family[rows].astype(np.int32),
        roll_hour=ro.hour[rows].astype(np.int64),
        roll_open=np.stack([ro.min[rows], ro.max[rows], ro.sum[rows], ro.count[rows], ro.last[rows]], axis=1),
        block_hours=bh, block_sizes=bs, closed_rows=brow, closed_vals=bval, closed_count=bcnt,
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


def decode_labels(lengths: np.ndarray, blob: bytes, per: np.ndarray, pairs: np.ndarray) -> list[Labels]:
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


def snapshot_path(directory: Path, position: WalPosition) -> Path:
    return directory / f"{position.segment:08d}{SUFFIX}"


def list_snapshots(directory: Path) -> list[tuple[int, Path]]:
    """(WAL segment it starts replay at, path), oldest first."""
    out = [(int(p.stem), p) for p in directory.glob(f"*{SUFFIX}") if p.stem.isdigit()]
    return sorted(out)


def write_snapshot(directory: Path, img: StoreImage | LeanImage) -> tuple[Path, int]:
    """Write atomically (temp file, fsync, rename, fsync the directory); returns (path, bytes).
    Safe to run on another thread: the image shares nothing with the store that the store changes
    (a LeanImage holds chunk bytes, which the store replaces and never changes). Raises OSError (a
    full disk) with the temp file removed, so a failed snapshot does not keep the space it took.
    Written section by section in pieces (metricsd/store/snapshot_write.py)."""
    from metricsd.store.snapshot_write import LeanImage, image_sections, lean_sections, write_sections

    directory.mkdir(parents=True, exist_ok=True)
    path = snapshot_path(directory, img.position)
    tmp = path.with_name(path.name + ".tmp")
    try:
        size = write_sections(tmp, lean_sections(img) if isinstance(img, LeanImage) else image_sections(img))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    fsync_dir(directory)
    return path, size


def read_sections(buf: bytes, schema: dict[bytes, int]) -> dict[bytes, memoryview]:
    """Every section of a snapshot file after its 8-byte header, CRC-checked and decompressed.
    Raises SnapshotError."""
    view = memoryview(buf)
    pos = _FILE_HEADER.size
    found: dict[bytes, memoryview] = {}
    while True:
        if len(buf) - pos < _SECTION.size:
            raise SnapshotError(f"truncated at byte {pos} (no end marker)")
        tag, dtype, codec, n, crc = _SECTION.unpack_from(buf, pos)
        head = view[pos : pos + _SECTION.size - 4]
        pos += _SECTION.size
        if tag == _END:
            if zlib.crc32(b"", zlib.crc32(head)) != crc or dtype or codec:
                raise SnapshotError(f"end marker at byte {pos - _SECTION.size}: checksum mismatch")
            if n != len(found):
                raise SnapshotError(f"end marker counts {n} sections, found {len(found)}")
            if pos != len(buf):
                raise SnapshotError(f"{len(buf) - pos} bytes after the end marker")
            break
        if tag not in schema or dtype != schema[tag] or codec not in (CODEC_RAW, CODEC_ZSTD) or tag in found:
            raise SnapshotError(f"unexpected section {bytes(tag)!r} (type {dtype}, codec {codec}) at byte "
                                f"{pos - _SECTION.size}")
        if pos + n > len(buf):
            raise SnapshotError(f"section {tag.decode()} at byte {pos - _SECTION.size} runs past the end of the file "
                                f"({n} bytes from byte {pos}, {len(buf)} in the file)")
        payload = view[pos : pos + n]
        if zlib.crc32(payload, zlib.crc32(head)) != crc:
            raise SnapshotError(f"section {tag.decode()} at byte {pos - _SECTION.size}: checksum mismatch over bytes "
                                f"{pos - _SECTION.size}..{pos + n}")
        found[tag] = _unpacked(tag, payload) if codec == CODEC_ZSTD else payload
        pos += n
    missing = sorted(t.decode() for t in set(schema) - set(found))
    if missing:
        raise SnapshotError(f"sections missing: {missing}")
    return found


def _unpacked(tag: bytes, payload: memoryview) -> memoryview:
    if len(payload) < _RAW_LEN.size:
        raise SnapshotError(f"section {tag.decode()}: compressed payload too short")
    (raw_len,) = _RAW_LEN.unpack_from(payload, 0)
    if raw_len > MAX_SECTION_BYTES:
        raise SnapshotError(f"section {tag.decode()} claims {raw_len} bytes")
    try:
        return decompress_exact(payload[_RAW_LEN.size :], raw_len)
    except ValueError as e:
        raise SnapshotError(f"section {tag.decode()}: {e}") from e


def read_snapshot(path: Path) -> StoreImage:
    """Parse and verify a snapshot file. Raises SnapshotError (or OSError) when it is unusable."""
    buf = path.read_bytes()
    if len(buf) < _FILE_HEADER.size:
        raise SnapshotError("file shorter than its header")
    magic, version, flags = _FILE_HEADER.unpack_from(buf, 0)
    if magic != MAGIC or version not in (1, VERSION) or flags:
        raise SnapshotError(f"not a version-{VERSION} snapshot (magic {bytes(magic)!r}, version {version})")
    if version == 1:
        from metricsd.store.snapshot_v1 import read_v1

        return capture(read_v1(buf), _v1_position(buf))
    return _image(read_sections(buf, _SCHEMA))


def _v1_position(buf: bytes) -> WalPosition:
    from metricsd.store.snapshot_v1 import position_v1

    return position_v1(buf)


def arr(found: dict[bytes, memoryview], tag: bytes, schema: dict[bytes, int]) -> np.ndarray:
    dt = _DTYPES[schema[tag]]
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
                         head_keep=int(raw["head_keep"]), chunk_samples=int(raw["chunk_samples"]))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise SnapshotError(f"bad META section: {e}") from e
    a = {t: arr(found, t, _SCHEMA) for t, d in _SCHEMA.items() if d}
    img = StoreImage(
        position=position, meta=meta, ids=a[b"SIDS"],
        labels=decode_labels(a[b"LSTL"], bytes(found[b"LSTB"]), a[b"LPRN"], a[b"LPRS"]),
        head_filled=a[b"HFIL"], head_unsealed=a[b"HUNS"], head_last_ts=a[b"HLTS"], head_ts=a[b"HTSS"],
        head_vals=a[b"HVAL"], chunk_counts=a[b"CNUM"], chunk_index=a[b"CIDX"], chunk_data=bytes(found[b"CDAT"]),
        chunk_max=a[b"CMAX"], open_count=a[b"OCNT"], open_min=a[b"OMIN"], open_hash=a[b"OHSH"],
        open_len=a[b"OLEN"], open_data=bytes(found[b"ODAT"]), chain_t2=a[b"KT2 "], chain_v1=a[b"KV1 "],
        chain_v2=a[b"KV2 "], chain_shift=a[b"KSFT"], chain_family=a[b"KFAM"], roll_hour=a[b"RHOU"],
        roll_open=a[b"ROPN"].reshape(-1, 5) if len(a[b"ROPN"]) % 5 == 0 else a[b"ROPN"],
        block_hours=a[b"RBHR"], block_sizes=a[b"RBSZ"], closed_rows=a[b"RROW"], closed_vals=a[b"RVAL"],
        closed_count=a[b"RCNT"],
    )
    _check_shapes(img, n)
    return img


def _check_shapes(img: StoreImage, n: int) -> None:
    per_series = [img.ids, img.head_filled, img.head_unsealed, img.head_last_ts, img.chunk_counts, img.chunk_max,
                  img.open_count, img.open_min, img.open_hash, img.open_len, img.chain_t2, img.chain_v1,
                  img.chain_v2, img.chain_shift, img.chain_family, img.roll_hour]
    if len(img.labels) != n or any(len(x) != n for x in per_series) or img.roll_open.shape != (n, 5):
        raise SnapshotError(f"per-series sections do not all hold {n} series")
    if len(img.head_ts) != int(img.head_filled.sum()) or len(img.head_vals) != len(img.head_ts):
        raise SnapshotError("head samples do not match head counts")
    if len(img.chunk_index) != STRIDE * int(img.chunk_counts.sum()):
        raise SnapshotError("chunk index does not match chunk counts")
    records = int(img.block_sizes.sum())
    if (len(img.block_hours) != len(img.block_sizes) or len(img.closed_rows) != records
            or len(img.closed_vals) != 4 * records or len(img.closed_count) != records):
        raise SnapshotError("closed rollups do not match their counts")
    ends = np.cumsum(img.block_sizes)
    inner = np.ones(records, bool)
    inner[(ends - img.block_sizes)[img.block_sizes > 0]] = False
    if bool((img.block_sizes < 0).any() or np.any(np.diff(img.block_hours) <= 0)
            or (records and (int(img.closed_rows.min()) < 0 or int(img.closed_rows.max()) >= n))
            or np.any(np.diff(img.closed_rows.astype(np.int64))[inner[1:]] <= 0)):
        raise SnapshotError("closed rollups out of order or out of range")
    if bool((img.head_unsealed < 0).any() or (img.head_unsealed > img.head_filled).any()
            or (img.head_filled > img.meta.head_keep).any()):
        raise SnapshotError("head counts out of range")
    if int(img.open_len.sum()) != len(img.open_data) or bool((img.open_len < 0).any() or (img.open_count < 0).any()):
        raise SnapshotError("open chunks do not match their lengths")


# --- restore -------------------------------------------------------------------------------


def restore(img: StoreImage, settings: StoreSettings,
            progress: Callable[[int, int], None] | None = None, files: SlabFiles | None = None) -> Store:
    """A new store holding the image. A head size or chunk size different from the image's
    (changed ``head_keep`` or ``chunk_samples``) is handled by closing the open chunks and
    sealing the ring's unsealed samples again. Raises SnapshotError when the image contradicts
    itself. ``files``: the chunk slabs' directory (metricsd/store/slabfiles.py), None for memory."""
    store = Store(settings)
    if files is not None:
        store.chunks.keep_in(files)
    n = len(img.ids)
    c = store.chunks
    ends = np.cumsum(img.chunk_counts)
    starts = (ends - img.chunk_counts).tolist()
    index = img.chunk_index.reshape(-1, STRIDE) if len(img.chunk_index) else np.zeros((0, STRIDE), np.int64)
    data = img.chunk_data
    off = 0
    ids = img.ids.tolist()
    open_count = img.open_count.tolist()
    data_view = memoryview(data)
    closed: list[bytes | memoryview] = []
    closed_sizes = np.zeros(n, np.int64)
    try:
        for i in range(n):
            row = store.add_series(ids[i], img.labels[i])
            if row != i:
                raise SnapshotError(f"series {i} restored at row {row}")
            k0, k1 = starts[i], int(ends[i])
            nbytes = int(index[k1 - 1, 2]) if k1 > k0 else 0
            if nbytes < 0 or off + nbytes > len(data):
                raise SnapshotError(f"series {i}: chunk bytes past the section")
            c.restore_row(i, index[k0:k1], int(img.open_min[i]), open_count[i], int(img.open_hash[i]),
                          int(img.chunk_max[i]), (int(img.chain_t2[i]), float(img.chain_v1[i]),
                                                  float(img.chain_v2[i]), int(img.chain_shift[i]),
                                                  int(img.chain_family[i])))
            if k1 > k0:
                closed += (data_view[off : off + nbytes], index[k0:k1].tobytes())
                closed_sizes[i] = nbytes + 8 * STRIDE * (k1 - k0)
            off += nbytes
            if progress is not None and i % 4096 == 4095:
                progress(i + 1, n)
    except KeyError as e:
        raise SnapshotError(f"series id listed twice: {e}") from e
    if off != len(data):
        raise SnapshotError(f"chunk bytes: {len(data)} in the file, {off} referenced")
    c.restore_bytes(closed, closed_sizes, img.open_data, img.open_len.astype(np.int64))
    del closed
    _restore_head(store, img)
    ro = store.rollups
    ro.hour[:n] = img.roll_hour
    ro.min[:n], ro.max[:n], ro.sum[:n], ro.count[:n], ro.last[:n] = img.roll_open.T
    ro.restore_closed(img.block_hours, img.block_sizes, img.closed_rows, img.closed_vals, img.closed_count)
    store.max_ts = img.meta.max_ts
    store.samples_written = img.meta.samples_written
    store.rejected = Counter(img.meta.rejected)
    if progress is not None:
        progress(n, n)
    return store


def _restore_head(store: Store, img: StoreImage) -> None:
    h, c = store.head, store.chunks
    n = len(img.ids)
    h.last_ts[:n] = img.head_last_ts
    filled = img.head_filled.astype(np.int64)
    ends = np.cumsum(filled)
    starts = ends - filled
    first = np.zeros(n, np.int64)
    last = np.zeros(n, np.int64)
    some = filled > 0
    first[some] = img.head_ts[starts[some]]
    last[some] = img.head_ts[ends[some] - 1]
    same_shape = img.meta.head_keep == h.capacity and img.meta.chunk_samples == c.chunk_samples
    if same_shape and bool(np.all(last - first <= OFFSET_MAX)):
        h.load(np.arange(n), filled, img.head_unsealed, img.head_ts, img.head_vals)
        return
    log.warning("snapshot head (%d samples a block, chunks of %d) does not fit the settings' (%d, %d): "
                "closing its open chunks and sealing the rings again", img.meta.head_keep, img.meta.chunk_samples,
                h.capacity, c.chunk_samples)
    c.close_all(np.arange(n))
    unsealed = img.head_unsealed.tolist()
    for i in range(n):
        t = img.head_ts[int(starts[i]) : int(ends[i])]
        v = img.head_vals[int(starts[i]) : int(ends[i])]
        u = unsealed[i]
        t, v = t[len(t) - u :], v[len(v) - u :]  # the samples in no chunk; sealed ones are in chunks
        if len(t):
            store_segments(h, c, np.array([i]), np.array([len(t)]), np.zeros(1, np.int64), t, v)
    h.last_ts[:n] = img.head_last_ts
