"""Timestamp encodings (FORMAT.md, "Timestamp section"): one type per encoding, one chooser.

Timestamps arrive as int64 milliseconds, strictly increasing, and are handled as uint64 so
that every difference wraps modulo 2**64 (a chunk may span the whole int64 range). The first and
last timestamps live in the chunk header, so a perfectly regular chunk needs no section at all.
Scrapes at a fixed interval with a few milliseconds of jitter on some samples are the common
case: they are stored as residuals against the grid ``min_t + i * step``, sparse when most
residuals are zero. Anything else falls back to Gorilla's delta-of-delta, frame-of-reference packed.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar, Protocol

import numpy as np

from metricsd.codec import bitpack as bp
from metricsd.codec.errors import CorruptChunk


class TsCode(IntEnum):
    """High nibble of the chunk's encoding byte (FORMAT.md)."""

    REGULAR = 1  # t_i = min_t + i * step, step = (max_t - min_t) / (n - 1) exactly; no section
    GRID_DENSE = 2  # every residual against the grid, frame-of-reference packed
    GRID_SPARSE = 3  # a bitmap of samples off the common residual, and only those residuals
    DOD = 4  # first delta, then n - 2 deltas of deltas, frame-of-reference packed


class TimestampEncoding(Protocol):
    code: ClassVar[TsCode]

    @staticmethod
    def decode(buf: bytes | bytearray | memoryview, pos: int, n: int, min_t: int, max_t: int) -> tuple[np.ndarray, int]:
        """Read the section at ``pos``; return (uint64 timestamps, position after the section)."""
        ...


def grid_step(n: int, min_t: int, max_t: int) -> int:
    """The grid interval: (max_t - min_t) / (n - 1) rounded half up; 0 for one sample."""
    return 0 if n < 2 else (max_t - min_t + (n - 1) // 2) // (n - 1)


_INDEX = np.arange(4096, dtype=np.uint64)
_INDEX.flags.writeable = False  # a constant: sample numbers for the common chunk sizes


def _grid(n: int, min_t: int, step: int) -> np.ndarray:
    i = _INDEX[:n] if n <= _INDEX.size else np.arange(n, dtype=np.uint64)
    return i * np.uint64(step & bp.MASK64) + np.uint64(min_t & bp.MASK64)


class Regular:
    # FORMAT.md "1 REGULAR": no bytes
    code: ClassVar[TsCode] = TsCode.REGULAR

    @staticmethod
    def decode(buf: bytes | bytearray | memoryview, pos: int, n: int, min_t: int, max_t: int) -> tuple[np.ndarray, int]:
        if n > 1 and (max_t - min_t) % (n - 1):
            raise CorruptChunk("regular timestamps do not divide the chunk's span")
        return _grid(n, min_t, grid_step(n, min_t, max_t)), pos


class GridDense:
    # FORMAT.md "2 GRID_DENSE": svarint base | u8 width | packed(n, width)
    code: ClassVar[TsCode] = TsCode.GRID_DENSE

    @staticmethod
    def encode(resid: np.ndarray, common: int, lo: int, width: int) -> bytes:
        """``resid`` are residuals less ``common``, all >= ``lo`` and below lo + 2**width."""
        out = bytearray()
        bp.put_varint(out, bp.to_int64(common + lo))
        out.append(width)
        out += bp.pack(resid - np.uint64(lo & bp.MASK64), width)
        return bytes(out)

    @staticmethod
    def decode(buf: bytes | bytearray | memoryview, pos: int, n: int, min_t: int, max_t: int) -> tuple[np.ndarray, int]:
        base, pos = bp.get_varint(buf, pos)
        width, pos = bp.get_u8(buf, pos)
        y, pos = bp.unpack(buf, pos, n, width)
        return _grid(n, min_t, grid_step(n, min_t, max_t)) + y + np.uint64(base & bp.MASK64), pos


class GridSparse:
    # FORMAT.md "3 GRID_SPARSE": svarint common | svarint base | u8 width | bitmap(n) | packed(k, width)
    code: ClassVar[TsCode] = TsCode.GRID_SPARSE

    @staticmethod
    def encode(exceptions: np.ndarray, mask: np.ndarray, common: int, base: int, width: int) -> bytes:
        out = bytearray()
        bp.put_varint(out, common)
        bp.put_varint(out, base)
        out.append(width)
        out += bp.put_bitmap(mask)
        out += bp.pack(exceptions - np.uint64(base & bp.MASK64), width)
        return bytes(out)

    @staticmethod
    def decode(buf: bytes | bytearray | memoryview, pos: int, n: int, min_t: int, max_t: int) -> tuple[np.ndarray, int]:
        common, pos = bp.get_varint(buf, pos)
        base, pos = bp.get_varint(buf, pos)
        width, pos = bp.get_u8(buf, pos)
        mask, pos = bp.get_bitmap(buf, pos, n)
        y, pos = bp.unpack(buf, pos, int(np.count_nonzero(mask)), width)
        t = _grid(n, min_t, grid_step(n, min_t, max_t)) + np.uint64(common & bp.MASK64)
        t[mask] += y + np.uint64(base & bp.MASK64)
        return t, pos


class DeltaOfDelta:
    # FORMAT.md "4 DOD": svarint delta0 | svarint base | u8 width | packed(n - 2, width)
    code: ClassVar[TsCode] = TsCode.DOD

    @staticmethod
    def encode(d: np.ndarray, dd: np.ndarray, base: int, width: int) -> bytes:
        out = bytearray()
        bp.put_varint(out, bp.to_int64(int(d[0])))
        bp.put_varint(out, base)
        out.append(width)
        out += bp.pack(dd - np.uint64(base & bp.MASK64), width)
        return bytes(out)

    @staticmethod
    def decode(buf: bytes | bytearray | memoryview, pos: int, n: int, min_t: int, max_t: int) -> tuple[np.ndarray, int]:
        if n < 2:
            raise CorruptChunk("delta-of-delta timestamps need two samples")
        d0, pos = bp.get_varint(buf, pos)
        base, pos = bp.get_varint(buf, pos)
        width, pos = bp.get_u8(buf, pos)
        y, pos = bp.unpack(buf, pos, n - 2, width)
        d = np.empty(n, np.uint64)
        d[0] = min_t & bp.MASK64
        d[1] = d0 & bp.MASK64
        d[2:] = y + np.uint64(base & bp.MASK64)
        np.cumsum(d[1:], out=d[1:])  # deltas from deltas of deltas (wraps mod 2**64)
        return np.cumsum(d, out=d), pos


DECODERS: dict[int, type[TimestampEncoding]] = {
    c.code: c for c in (Regular, GridDense, GridSparse, DeltaOfDelta)
}


def _varint_len(x: int) -> int:
    return max(1, (bp.zigzag(x).bit_length() + 6) // 7)


def encode_timestamps(t: np.ndarray, min_t: int, max_t: int) -> tuple[TsCode, bytes]:
    """Pick the smallest section for uint64 timestamps ``t``; cheap shape checks come first.

    Grid residuals are computed once: all zero is REGULAR; mostly non-zero (jitter on every
    scrape) goes straight to GRID_DENSE; otherwise the exceptions' bounds give the sizes of
    both grid encodings. Delta-of-delta is only costed when residuals are wide (the interval
    changed mid-chunk).
    """
    n = t.size
    if n <= 2:
        return TsCode.REGULAR, b""
    resid = t - _grid(n, min_t, grid_step(n, min_t, max_t))
    k = int(np.count_nonzero(resid))
    if not k:  # fast path: a perfectly regular scrape
        return TsCode.REGULAR, b""
    common = 0
    for i in (n // 2, n // 2 + 1):  # the first sample may be the odd one out: try the middle ones
        if 2 * k <= n:
            break
        mid = bp.to_int64(int(resid[i]))
        off = resid - np.uint64(mid & bp.MASK64)
        k_mid = int(np.count_nonzero(off))
        if 2 * k_mid <= n:
            common, resid, k = mid, off, k_mid
    if 2 * k > n:  # jitter on every scrape: sparse cannot win
        lo, hi = bp.bounds(resid)
        width = (hi - lo).bit_length()
        sparse = None
    else:
        mask = resid != 0
        exceptions = resid[mask]
        sbase, shi = bp.bounds(exceptions)
        swidth = (shi - sbase).bit_length()
        lo = min(sbase, 0)
        width = (max(shi, 0) - lo).bit_length()  # residuals are the exceptions and zeros
        sparse = bp.packed_size(k, swidth) + (n + 7) // 8 + _varint_len(common) + _varint_len(sbase)
    dense = bp.packed_size(n, width) + _varint_len(bp.to_int64(common + lo))
    if width > 16:
        d = t[1:] - t[:-1]
        dd = d[1:] - d[:-1]
        dbase, dwidth = bp.frame(dd)
        dod = _varint_len(bp.to_int64(int(d[0]))) + _varint_len(dbase) + bp.packed_size(n - 2, dwidth)
        if dod < dense and (sparse is None or dod < sparse):
            return TsCode.DOD, DeltaOfDelta.encode(d, dd, dbase, dwidth)
    if sparse is not None and sparse <= dense:
        return TsCode.GRID_SPARSE, GridSparse.encode(exceptions, mask, common, sbase, swidth)
    return TsCode.GRID_DENSE, GridDense.encode(resid, common, lo, width)
