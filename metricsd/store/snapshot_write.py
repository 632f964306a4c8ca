"""Writing a snapshot section by section, each in pieces, so that taking one costs little memory.

A snapshot used to be built whole in memory: capture() copied every column, joined every
series' chunks into one bytes object (closed and open: as large as the samples), and the writer
then held each section's zstd output and a copy of it with its length in front. At 200,000
series that was ~650 MiB above a settled 437 (perf/RESULTS.md, "Issue 25 session 37"). Now:

- capture_lean() copies only what changes in place and must be as it was at the WAL position:
  the per-series columns, the label codes and the ring samples (in blocks of rows, so without
  the ring-wide temporaries, each block zstd-compressed at once: raw, 16 bytes a ring sample
  were 98 MiB at 200,000 series; they are written as they are, a frame a block). Chunks are
  held by reference: a series' closed and open chunk bytes are immutable and replaced, never
  changed, when the store appends (metricsd/store/chunks.py), so the objects captured stay
  what they were. Label values are append-only tables.
- write_sections() streams each section to the file in pieces of ~PIECE_BYTES: zstd through a
  streaming compressor, the CRC running beside it, the header written with a place-holder and
  filled in once the stored length is known (crc32_combine puts the header's CRC in front).
  References are dropped as the writer passes them, so a chunk replaced while the file is
  written is freed once written.

The file is the same version 2 (FORMAT.md "Snapshot"), read by the same reader.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import cramjam
import numpy as np

from metricsd.store.arena import Frozen
from metricsd.store.chunks import STRIDE, split_closed
from metricsd.store.engine import Store
from metricsd.store.snapshot import (
    _DTYPES,
    _END,
    _FILE_HEADER,
    _RAW_LEN,
    _SCHEMA,
    _SECTION,
    CODEC_RAW,
    CODEC_ZSTD,
    MAGIC,
    VERSION,
    ZSTD_LEVEL,
    ImageMeta,
    StoreImage,
)
from metricsd.store.wal.log import WalPosition

__all__ = ["LeanImage", "capture_lean", "crc32_combine", "image_sections", "lean_sections", "write_sections"]

PIECE_BYTES = 4 << 20  # a section is compressed and written this much at a time
ROWS_PER_PIECE = 16_384  # rows gathered at a time (ring samples, label pairs)

Pieces = Callable[[], Iterable[bytes | memoryview]]


class Frames(list[bytes]):
    """A section's content already zstd-compressed, a frame per piece (the ring samples, packed at
    the capture): written as they are, one frame after another (zstd reads concatenated frames
    as their contents concatenated)."""
Section = tuple[bytes, int, Pieces]  # tag, content bytes, the content in pieces (called once, when written)


# --- CRC -----------------------------------------------------------------------------------


def _gf2_times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(mat: list[int]) -> list[int]:
    return [_gf2_times(mat, m) for m in mat]


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """crc32(a + b) from crc32(a), crc32(b) and len(b) (zlib's crc32_combine, which Python's zlib
    does not offer): the header's CRC is the starting value of the payload's, and the payload's
    stored length, part of the header, is known only once it is written."""
    if len2 <= 0:
        return crc1
    op = [0xEDB88320] + [1 << k for k in range(31)]  # the CRC of one zero bit, as a matrix over GF(2)
    for _ in range(3):
        op = _gf2_square(op)  # 2, 4, then 8 zero bits: one zero byte
    while len2:
        if len2 & 1:
            crc1 = _gf2_times(op, crc1)
        len2 >>= 1
        if len2:
            op = _gf2_square(op)
    return crc1 ^ crc2


# --- the file ------------------------------------------------------------------------------


def _as_bytes(tag: bytes, a: np.ndarray) -> memoryview:
    dt = _DTYPES[_SCHEMA[tag]]  # every array in the type its tag says, whatever it was held as
    return np.ascontiguousarray(a, dtype=dt).reshape(-1).data.cast("B")


def _regrouped(pieces: Iterable[bytes | memoryview]) -> Iterator[bytes | memoryview]:
    """Small pieces joined up to ~PIECE_BYTES (one call into zstd and zlib per piece, not per row)."""
    group: list[bytes | memoryview] = []
    size = 0
    for p in pieces:
        n = memoryview(p).nbytes
        if n >= PIECE_BYTES and not group:
            yield p
            continue
        group.append(p)
        size += n
        if size >= PIECE_BYTES:
            yield b"".join(group)
            group, size = [], 0
    if group:
        yield b"".join(group)


def _stream(f: BinaryIO, tag: bytes, raw_len: int, pieces: Iterable[bytes | memoryview]) -> int:
    """Write one section (FORMAT.md "Section") from where the file is; returns its stored bytes.
    zstd when the first piece (the whole section, up to PIECE_BYTES) compresses to nine tenths or
    less: the pieces are gone once written (the writer drops its references), so the choice is
    made before, not after, as when a section was held whole."""
    start = f.tell()
    f.write(b"\0" * _SECTION.size)  # filled in below
    if isinstance(pieces, Frames):
        if raw_len >= 64:
            return _packed(f, start, tag, raw_len, pieces)
        pieces = [bytes(cramjam.zstd.decompress(p)) for p in pieces]  # as small sections are: raw
    groups = _regrouped(pieces)
    first = next(groups, b"")
    view = memoryview(first)
    codec = CODEC_RAW
    if raw_len >= 64 and _RAW_LEN.size + len(cramjam.zstd.compress(view, level=ZSTD_LEVEL)) <= 0.9 * view.nbytes:
        codec = CODEC_ZSTD
    crc, n = 0, 0
    comp = None
    if codec == CODEC_ZSTD:
        prefix = _RAW_LEN.pack(raw_len)
        f.write(prefix)
        crc, n = zlib.crc32(prefix), len(prefix)
        comp = cramjam.zstd.Compressor(level=ZSTD_LEVEL)
    seen = 0
    for piece in itertools.chain((first,), groups):
        seen += memoryview(piece).nbytes
        if comp is not None:
            comp.compress(piece if isinstance(piece, bytes) else bytes(piece))  # it takes no memoryview
            out = memoryview(comp.flush())
        else:
            out = memoryview(piece)
        crc = zlib.crc32(out, crc)
        n += out.nbytes
        f.write(out)
    if comp is not None:
        tail = comp.finish()
        crc = zlib.crc32(tail, crc)
        n += memoryview(tail).nbytes
        f.write(tail)
    if seen != raw_len:
        raise AssertionError(f"section {tag.decode()}: {seen} bytes written, {raw_len} announced")
    _finish(f, start, tag, codec, n, crc)
    return n


def _packed(f: BinaryIO, start: int, tag: bytes, raw_len: int, frames: Frames) -> int:
    prefix = _RAW_LEN.pack(raw_len)
    f.write(prefix)
    crc, n = zlib.crc32(prefix), len(prefix)
    for frame in frames:
        crc = zlib.crc32(frame, crc)
        n += len(frame)
        f.write(frame)
    _finish(f, start, tag, CODEC_ZSTD, n, crc)
    return n


def _finish(f: BinaryIO, start: int, tag: bytes, codec: int, n: int, crc: int) -> None:
    """The section's header, at ``start``, now that its stored length is known."""
    head = _SECTION.pack(tag, _SCHEMA[tag], codec, n, 0)[:-4]
    end = f.tell()
    f.seek(start)
    f.write(head + struct.pack("<I", crc32_combine(zlib.crc32(head), crc, n)))
    f.seek(end)


def write_sections(tmp: Path, sections: Iterable[Section]) -> int:
    """The whole file from its sections; fsynced; returns its size."""
    count = 0
    with open(tmp, "wb") as f:
        f.write(_FILE_HEADER.pack(MAGIC, VERSION, 0))
        for tag, raw_len, pieces in sections:
            _stream(f, tag, raw_len, pieces())
            count += 1
        end = _SECTION.pack(_END, 0, CODEC_RAW, count, 0)[:-4]
        f.write(end + struct.pack("<I", zlib.crc32(b"", zlib.crc32(end))))
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


def _array(tag: bytes, a: np.ndarray) -> Section:
    view = _as_bytes(tag, a)
    return tag, view.nbytes, lambda: (view,)


def _meta(position: WalPosition, meta: ImageMeta, n: int) -> Section:
    raw = json.dumps(dict(vars(meta), wal_segment=position.segment, wal_offset=position.offset, series=n),
                     sort_keys=True).encode()
    return b"META", len(raw), lambda: (raw,)


def image_sections(img: StoreImage) -> list[Section]:
    """An image already in memory (capture(), a version-1 file read back), section by section."""
    from metricsd.store.snapshot import _encode_labels

    lstl, lstb, lprn, lprs = _encode_labels(img.labels)
    out = [_meta(img.position, img.meta, len(img.ids))]
    for tag, value in ((b"SIDS", img.ids), (b"LSTL", lstl), (b"LSTB", lstb), (b"LPRN", lprn), (b"LPRS", lprs),
                       (b"HFIL", img.head_filled), (b"HUNS", img.head_unsealed), (b"HLTS", img.head_last_ts),
                       (b"HTSS", img.head_ts), (b"HVAL", img.head_vals), (b"CNUM", img.chunk_counts),
                       (b"CIDX", img.chunk_index), (b"CDAT", img.chunk_data), (b"CMAX", img.chunk_max),
                       (b"OCNT", img.open_count), (b"OMIN", img.open_min), (b"OHSH", img.open_hash),
                       (b"OLEN", img.open_len), (b"ODAT", img.open_data), (b"KT2 ", img.chain_t2),
                       (b"KV1 ", img.chain_v1), (b"KV2 ", img.chain_v2), (b"KSFT", img.chain_shift),
                       (b"KFAM", img.chain_family), (b"RHOU", img.roll_hour), (b"ROPN", img.roll_open),
                       (b"RBHR", img.block_hours), (b"RBSZ", img.block_sizes), (b"RROW", img.closed_rows),
                       (b"RVAL", img.closed_vals), (b"RCNT", img.closed_count)):
        if isinstance(value, np.ndarray):
            out.append(_array(tag, value))
        else:
            view = memoryview(value)
            out.append((tag, view.nbytes, lambda view=view: (view,)))  # type: ignore[misc]
    return out


# --- the lean capture ----------------------------------------------------------------------


@dataclass
class LeanImage:
    """What a snapshot needs from the store at the WAL position, without copying the chunks.

    ``columns`` are per-series arrays (tag -> array, in the file's types) and the closed rollups;
    ``chunk_data`` and ``open_data`` are the series' own arena regions frozen (store/arena.py's
    ``Frozen``: the store never writes a region again; closed chunks then their index, the open
    chunk);
    ``head_ts`` / ``head_vals`` the ring samples, a zstd frame per block of rows; labels as codes
    per label name into the index's append-only value tables."""

    position: WalPosition
    meta: ImageMeta
    n: int
    columns: dict[bytes, np.ndarray]
    head_ts: Frames  # zstd, int64
    head_vals: Frames  # zstd, float64
    chunk_data: Frozen
    open_data: Frozen
    label_names: list[str]
    label_codes: list[np.ndarray]
    label_values: list[list[str]]

    @property
    def ids(self) -> np.ndarray:
        return self.columns[b"SIDS"]


def _zstd(a: np.ndarray) -> bytes:
    return bytes(cramjam.zstd.compress(np.ascontiguousarray(a).data.cast("B"), level=ZSTD_LEVEL))


def capture_lean(store: Store, position: WalPosition) -> LeanImage:
    """The store at ``position``: call with no write in between the WAL reaching it and this.
    Copies of the per-series columns (the chunks' addresses among them) and of the ring samples,
    compressed; no Python object a series, nothing proportional to the chunks' bytes."""
    idx = store.index
    rows = np.flatnonzero(idx.alive[: idx.n_rows])
    h, c, ro = store.head, store.chunks, store.rollups
    filled = h.filled[rows].astype(np.int64)
    head_ts, head_vals = Frames(), Frames()
    for s in range(0, len(rows), ROWS_PER_PIECE):
        part, f = rows[s : s + ROWS_PER_PIECE], filled[s : s + ROWS_PER_PIECE]
        width = max(1, int(f.max()))
        ht, hv, _ = h.newest(part, width)
        mask = np.arange(width)[None, :] < f[:, None]
        # packed now: a copy of the rings raw is 16 bytes a sample, 98 MiB at 200,000 series
        head_ts.append(_zstd(ht[mask]))
        head_vals.append(_zstd(hv[mask]))
        del ht, hv, mask
    bh, bs, brow, bval, bcnt = ro.closed_of(rows)
    cols: dict[bytes, np.ndarray] = {
        b"SIDS": idx.id_column[rows].astype(np.uint64),
        b"HFIL": filled.astype(np.int32), b"HUNS": h.unsealed[rows].astype(np.int32),
        b"HLTS": h.last_ts[rows].astype(np.int64),
        b"CNUM": c.n_closed[rows].astype(np.int64), b"CMAX": c.max_ts[rows].astype(np.int64),
        b"OCNT": c.open_count[rows].astype(np.int64), b"OMIN": c.open_min[rows].astype(np.int64),
        b"OHSH": c.open_hash[rows].astype(np.uint64),
        b"KT2 ": c.t2[rows].astype(np.int64), b"KV1 ": c.v1[rows].astype(np.float64),
        b"KV2 ": c.v2[rows].astype(np.float64), b"KSFT": c.shift[rows].astype(np.int32),
        b"KFAM": c.family[rows].astype(np.int32),
        b"RHOU": ro.hour[rows].astype(np.int64),
        b"ROPN": np.stack([ro.min[rows], ro.max[rows], ro.sum[rows], ro.count[rows], ro.last[rows]], axis=1),
        b"RBHR": bh, b"RBSZ": bs, b"RROW": brow, b"RVAL": bval, b"RCNT": bcnt,
    }
    lc = idx.label_columns(rows)
    return LeanImage(
        position=position,
        meta=ImageMeta(max_ts=int(store.max_ts), samples_written=int(store.samples_written),
                       rejected={k: int(v) for k, v in store.rejected.items()}, head_keep=h.capacity,
                       chunk_samples=c.chunk_samples),
        n=len(rows), columns=cols, head_ts=head_ts, head_vals=head_vals,
        chunk_data=c.data.freeze(rows), open_data=c.open.freeze(rows),
        label_names=list(lc.names), label_codes=[np.asarray(x, np.int32) for x in lc.codes],
        label_values=[v for v in lc.values],  # type: ignore[misc]
    )


def _label_sections(img: LeanImage) -> list[Section]:
    """FORMAT.md's string table and pairs from the label codes: the names and the values some
    series uses, each once; per series its pairs in name order (the index's names are sorted, as
    the labels of a series are)."""
    table: dict[str, int] = {}
    remap: list[np.ndarray] = []
    for name, codes, values in zip(img.label_names, img.label_codes, img.label_values, strict=True):
        table.setdefault(name, len(table))
        used = np.zeros(len(values), bool)
        used[codes[codes >= 0]] = True
        m = np.full(len(values), -1, np.int32)
        for code in np.flatnonzero(used).tolist():
            m[code] = table.setdefault(values[code], len(table))
        remap.append(m)
    name_ids = np.array([table[nm] for nm in img.label_names], np.int32)
    offsets = np.cumsum([0] + [len(m) for m in remap])[:-1].astype(np.int64)
    flat = np.concatenate(remap) if remap else np.zeros(0, np.int32)
    codes = np.stack(img.label_codes) if img.label_codes else np.zeros((0, img.n), np.int32)
    per = (codes >= 0).sum(axis=0).astype(np.int32) if len(codes) else np.zeros(img.n, np.int32)
    strings = [s.encode() for s in table]
    del table

    def pairs() -> Iterator[memoryview]:
        for s in range(0, img.n, ROWS_PER_PIECE):
            block = codes[:, s : s + ROWS_PER_PIECE]
            r, k = np.nonzero(block.T >= 0)  # row-major: series after series, names in order
            out = np.empty((len(r), 2), np.int32)
            out[:, 0] = name_ids[k]
            out[:, 1] = flat[offsets[k] + block[k, r]]
            yield out.reshape(-1).data.cast("B")

    return [_array(b"LSTL", np.array([len(s) for s in strings], np.int32)),
            (b"LSTB", sum(map(len, strings)), lambda: strings),
            _array(b"LPRN", per), (b"LPRS", 8 * int(per.sum()), pairs)]


def lean_sections(img: LeanImage) -> list[Section]:
    """The sections of a lean capture, in the file's order. The chunk references are dropped as
    CDAT and ODAT are written (CIDX, before CDAT, reads the same objects): it can be written once."""
    cols = img.columns
    closed = cols[b"CNUM"]
    index_bytes = 8 * STRIDE * int(closed.sum())
    data_bytes = int(img.chunk_data.size.sum()) - index_bytes
    open_len = img.open_data.size

    def closed_payloads() -> Iterator[memoryview]:
        # a slab the store has given up since is freed once the writer is past its last row
        for d, k in zip(img.chunk_data.rows(release=True), closed.tolist(), strict=True):
            if k:
                yield split_closed(d, k)[0]

    def open_chunks() -> Iterator[bytes | memoryview]:
        return img.open_data.rows(release=True)

    def closed_index() -> Iterator[memoryview]:
        for d, k in zip(img.chunk_data.rows(), closed.tolist(), strict=True):
            if k:
                yield split_closed(d, k)[1].reshape(-1).data.cast("B")

    sec = [_meta(img.position, img.meta, img.n), _array(b"SIDS", cols[b"SIDS"]), *_label_sections(img)]
    sec += [_array(t, cols[t]) for t in (b"HFIL", b"HUNS", b"HLTS")]
    ring = 8 * int(cols[b"HFIL"].sum())
    sec += [(b"HTSS", ring, lambda: img.head_ts), (b"HVAL", ring, lambda: img.head_vals),
            _array(b"CNUM", closed), (b"CIDX", index_bytes, closed_index), (b"CDAT", data_bytes, closed_payloads),
            _array(b"CMAX", cols[b"CMAX"])]
    sec += [_array(t, cols[t]) for t in (b"OCNT", b"OMIN", b"OHSH")]
    sec += [_array(b"OLEN", open_len), (b"ODAT", int(open_len.sum()), open_chunks)]
    sec += [_array(t, cols[t]) for t in (b"KT2 ", b"KV1 ", b"KV2 ", b"KSFT", b"KFAM", b"RHOU", b"ROPN", b"RBHR",
                                          b"RBSZ", b"RROW", b"RVAL", b"RCNT")]
    return sec
