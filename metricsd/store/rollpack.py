"""Closed hours of rollups, packed: ~8.5 bytes a series and hour instead of 40.

A closed hour's records (row, min, max, sum, last, count) are cut into frames of ``FRAME``
consecutive rows; each frame is one LZ4 block of its records' bytes laid out plane by plane
(metricsd/store/FORMAT.md, "Hourly rollups in memory"). Planes put the bytes that repeat (the
exponents, the high mantissa bytes, the rows' deltas of 1, counts of 360, min and max equal to
last) next to each other, where LZ4 finds them: on the side-by-side workload a day of 10,000
series packs to ~8.7 bytes a record (zstd: 8.4, but 5-10x slower to decode; transposing the
planes back costs more than LZ4 itself). A read decodes only the frames that hold its rows, so a
pod's hour does not decode the whole hour.
Pure functions, no state: metricsd/store/rollup.py decides when to pack.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import cramjam
import numpy as np

__all__ = ["FRAME", "Packed", "frames_of", "lookup", "pack", "replace", "unpack"]

FRAME = 1024
_FILL = 1024
_REC = 40  # bytes a record: row delta int32, count int32, 4 x float64
_LEVEL = 1


@dataclass
class Packed:
    """``row0[i]`` is frame i's first row, ``starts[i]:starts[i+1]`` its records; ``data[i]`` its
    LZ4 block."""

    row0: np.ndarray  # int32, increasing
    starts: np.ndarray  # int64, len(data) + 1
    data: list[bytes]
    dense: np.ndarray  # bool per frame: its rows are row0, row0 + 1, ... (no need to decode them)

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def nbytes(self) -> int:
        return self.row0.nbytes + self.starts.nbytes + self.dense.nbytes + sum(len(d) for d in self.data)


def _encode(rows: np.ndarray, vals: np.ndarray, count: np.ndarray) -> bytes:
    k = len(rows)
    rec = np.empty((k, _REC), np.uint8)
    rec[:, 0:4] = np.diff(rows.astype(np.int32), prepend=rows[:1].astype(np.int32)).view(np.uint8).reshape(k, 4)
    rec[:, 4:8] = count.astype(np.int32).view(np.uint8).reshape(k, 4)
    bits = np.ascontiguousarray(vals, dtype=np.float64).view(np.uint64).copy()
    bits[:, 0] ^= bits[:, 3]  # min and max are often the last value itself: zero bytes
    bits[:, 1] ^= bits[:, 3]
    rec[:, 8:] = bits.view(np.uint8).reshape(k, 32)
    return bytes(cramjam.lz4.compress_block(np.ascontiguousarray(rec.T).tobytes(), store_size=False))


def _planes(frame: bytes, row0: int, k: int, dense: bool) -> tuple[np.ndarray, np.ndarray]:
    """A frame's byte planes (40 x k) and its rows."""
    return _planes_of(_unlz4(frame, np.empty(k * _REC, np.uint8)).reshape(_REC, k), row0, dense)


def _planes_of(planes: np.ndarray, row0: int, dense: bool) -> tuple[np.ndarray, np.ndarray]:
    k = planes.shape[1]
    if dense:
        return planes, np.arange(row0, row0 + k, dtype=np.int32)
    delta = np.ascontiguousarray(planes[0:4].T).view(np.int32).ravel()
    return planes, (np.cumsum(delta, dtype=np.int64) + row0).astype(np.int32)


def _records(planes: np.ndarray, at: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """vals (k x 4) and count of the records at ``at`` (all when None)."""
    sel = planes[4:] if at is None else planes[4:, at]
    m = sel.shape[1]
    count = np.empty(m, np.int32)
    bits = np.empty((m, 4), np.uint64)
    _fill(sel, count, bits)
    _unxor(bits)
    return bits.view(np.float64), count


def _fill(sel: np.ndarray, count: np.ndarray, bits: np.ndarray) -> None:
    """Planes 4..39 of some records into their count and (still XORed) value bits."""
    m = len(count)
    count.view(np.uint8).reshape(m, 4)[...] = sel[0:4].T
    bits.view(np.uint8).reshape(m, 32)[...] = sel[4:].T


def _unxor(bits: np.ndarray) -> None:
    bits[:, 0] ^= bits[:, 3]
    bits[:, 1] ^= bits[:, 3]


def pack(rows: np.ndarray, vals: np.ndarray, count: np.ndarray, frame: int | None = None) -> Packed:
    """Records sorted by row (distinct), ``vals`` k x 4 (min, max, sum, last); frames of ``frame``
    records (default ``FRAME``, read at the call so tests can make frames small)."""
    frame = frame or FRAME
    cuts = [*range(0, len(rows), frame), len(rows)]
    data = [_encode(rows[s:e], vals[s:e], count[s:e]) for s, e in itertools.pairwise(cuts)]
    dense = np.array([int(rows[e - 1]) - int(rows[s]) == e - s - 1 for s, e in itertools.pairwise(cuts)], bool)
    return Packed(np.asarray(rows[cuts[:-1]], np.int32) if len(rows) else np.zeros(0, np.int32),
                  np.asarray(cuts if len(rows) else [0], np.int64), data, dense)


def frames_of(p: Packed, rows: np.ndarray) -> np.ndarray:
    """The frames that could hold ``rows`` (distinct frame numbers, increasing)."""
    if not p.data or len(rows) == 0:
        return np.zeros(0, np.int64)
    if len(rows) > 4 * len(p.data) and bool(np.all(rows[1:] >= rows[:-1])):
        # sorted rows (a selection's): search the frames' bounds among them instead
        at = np.searchsorted(rows, p.row0)
        at[0] = 0
        return np.flatnonzero(np.diff(np.append(at, len(rows))) > 0)
    hit = np.zeros(len(p.data), bool)
    hit[np.maximum(np.searchsorted(p.row0, rows, side="right") - 1, 0)] = True
    return np.flatnonzero(hit)


def unpack(p: Packed, frames: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The records of ``frames`` (all by default), rows increasing: decoded straight into one
    set of output arrays."""
    which = list(range(len(p.data))) if frames is None else frames.tolist()
    sizes = [int(p.starts[i + 1] - p.starts[i]) for i in which]
    n = sum(sizes)
    rows = np.empty(n, np.int32)
    count = np.empty(n, np.int32)
    bits = np.empty((n, 4), np.uint64)
    at = 0
    for i, k in zip(which, sizes, strict=True):
        planes, rows[at:at + k] = _planes(p.data[i], int(p.row0[i]), k, bool(p.dense[i]))
        for j in range(0, k, _FILL):  # transposing in slices of 1,024 records stays in cache
            e = min(j + _FILL, k)
            _fill(planes[4:, j:e], count[at + j:at + e], bits[at + j:at + e])
        at += k
    _unxor(bits)
    return rows, bits.view(np.float64), count


def replace(p: Packed, lo: int, hi: int, rows: np.ndarray, vals: np.ndarray, count: np.ndarray) -> Packed:
    """``p`` with frames ``lo:hi`` replaced by the records given (sorted by row, and lying between
    the frames before and after them): a change to a few rows re-encodes only the frames that
    hold them."""
    mid = pack(rows, vals, count)
    n_before = int(p.starts[lo])
    tail = p.starts[hi:] - p.starts[hi] + n_before + len(mid)
    starts = np.concatenate([p.starts[:lo], mid.starts[:-1] + n_before, tail])
    return Packed(np.concatenate([p.row0[:lo], mid.row0, p.row0[hi:]]).astype(np.int32), starts.astype(np.int64),
                  p.data[:lo] + mid.data + p.data[hi:], np.concatenate([p.dense[:lo], mid.dense, p.dense[hi:]]))


def lookup(p: Packed, want: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of ``want`` (rows, any order): the positions that have a record, and their vals and counts.
    Decodes only the frames that can hold them, and of those only the wanted records' bytes past
    the rows (a pod's hour costs a few microseconds, not a transposition of 1,024 records)."""
    frames = frames_of(p, want)
    if len(frames) and len(want) * 2 >= int(p.starts[frames[-1] + 1] - p.starts[frames[0]]):
        # most of the frames' rows wanted: decode the frames whole and search once
        rows, vals, count = unpack(p, frames)
        if len(rows) == len(want) and bool(np.array_equal(rows, want)):
            return np.arange(len(want)), vals, count
        at = np.minimum(np.searchsorted(rows, want), len(rows) - 1)
        found = np.flatnonzero(rows[at] == want)
        return found, vals[at[found]], count[at[found]]
    if len(frames) == 0:
        return np.zeros(0, np.int64), np.zeros((0, 4)), np.zeros(0, np.int32)
    # a few rows a frame: decode the frames into one buffer (frame j's planes at [j, :, :k]) and
    # take the wanted records' bytes from all of them with one index
    sizes = (p.starts[frames + 1] - p.starts[frames]).tolist()
    kmax = max(sizes)
    buf = np.empty((len(frames), _REC, kmax), np.uint8)
    for j, (f, k) in enumerate(zip(frames.tolist(), sizes, strict=True)):
        if k == kmax:
            _unlz4(p.data[f], buf[j].reshape(-1))
        else:
            buf[j, :, :k] = _unlz4(p.data[f], np.empty(_REC * k, np.uint8)).reshape(_REC, k)
    slot = np.zeros(len(p.data), np.int64)
    slot[frames] = np.arange(len(frames))
    f_of = np.maximum(np.searchsorted(p.row0, want, side="right") - 1, 0)
    s_of = slot[f_of]
    k_of = np.asarray(sizes, np.int64)[s_of]
    at = want - p.row0[f_of]  # a dense frame's record of each wanted row
    for j, f in enumerate(frames.tolist()):
        if p.dense[f]:
            continue
        mine = np.flatnonzero(f_of == f)
        k = sizes[j]
        _, rows = _planes_of(buf[j, :, :k], int(p.row0[f]), False)
        i = np.minimum(np.searchsorted(rows, want[mine]), k - 1)
        at[mine] = np.where(rows[i] == want[mine], i, -1)
    keep = np.flatnonzero((at >= 0) & (at < k_of))
    rec = buf[s_of[keep], 4:, at[keep]]  # m x 36: each record's count and value bytes, in order
    count = rec[:, 0:4].copy().view(np.int32).ravel()
    bits = rec[:, 4:].copy().view(np.uint64)
    _unxor(bits)
    return keep, bits.view(np.float64), count


def _unlz4(frame: bytes, out: np.ndarray) -> np.ndarray:
    try:
        got = cramjam.lz4.decompress_block_into(frame, out)  # type: ignore[arg-type]  # any writable buffer
    except cramjam.DecompressionError as e:  # only a bug can damage a frame in memory
        raise ValueError(f"rollup frame: {e}") from e
    if got != len(out):
        raise ValueError(f"rollup frame decodes to {got} bytes, not {len(out)}")
    return out
