"""Decoding block chunks (FORMAT.md, "Block chunks"): the reverse of metricsd/codec/blocks.py.

``decode_chunks`` reads a few chunks back: a short Python walk over the block headers, then the
payloads of every block unpacked and the chains summed up at once. ``decode_many`` reads many
chunks in lock step (the k-th block of every chunk together, ``walk_many`` finding them), so its
cost is per sample, not per chunk; codec/tail.py enters open chunks mid-way through it.

Pure functions, no state; safe to call from any thread.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from metricsd.codec import bitpack as bp
from metricsd.codec.bits import unpack_segments, unzigzag
from metricsd.codec.blocks import (
    DELTA,
    DOD,
    F_COUNT,
    F_SHIFT,
    F_TS,
    F_VAL_SHIFT,
    MAX_SCALE,
    SAME,
    XOR,
    XOR_FAMILY,
)
from metricsd.codec.errors import CorruptChunk

__all__ = ["FEW_CHUNKS", "chunk_header_size", "decode_chunks", "decode_many", "walk_many"]

# Below this many chunks walk_many walks their blocks in Python (a few microseconds a block)
# rather than in lock step (~60 NumPy calls per block position whatever the chunks: a one-row
# read entering its open chunk spent ~1.5 ms there, perf/RESULTS.md "Issue 25: a day, 200,000
# series, and the read path").
FEW_CHUNKS = 32
_POW10 = np.array([10.0**k for k in range(MAX_SCALE + 1)])
_U64 = np.uint64
_T1 = struct.Struct("<q")  # the chunk header's first timestamp
_V1 = struct.Struct("<Q")  # and an XOR chunk's first value bits


def chunk_header_size(buf: bytes | memoryview, pos: int = 0) -> int:
    """Bytes of the chunk header at ``pos``. Raises CorruptChunk."""
    _, end = _read_header(memoryview(buf), pos)
    return end - pos


@dataclass(frozen=True)
class _Header:
    family: int
    block: int
    t1: int
    d1: int
    c1: int  # decimal: m1; XOR: v1 bits (as uint64)
    e1: int


def _read_header(buf: memoryview, pos: int) -> tuple[_Header, int]:
    if pos + 10 > len(buf):
        raise CorruptChunk("chunk shorter than its header")
    family, block = buf[pos], buf[pos + 1]
    if not (family <= MAX_SCALE or family == XOR_FAMILY) or block == 0:
        raise CorruptChunk(f"chunk header: family {family:#x}, block size {block}")
    (t1,) = _T1.unpack_from(buf, pos + 2)
    d1, pos = bp.get_varint(buf, pos + 10)
    if family == XOR_FAMILY:
        if pos + 8 > len(buf):
            raise CorruptChunk("chunk shorter than its header")
        (c1,) = _V1.unpack_from(buf, pos)
        return _Header(family, block, t1, d1, c1, 0), pos + 8
    c1, pos = bp.get_varint(buf, pos)
    e1, pos = bp.get_varint(buf, pos)
    return _Header(family, block, t1, d1, c1, e1), pos


def decode_chunks(buf: bytes | memoryview, starts: list[int], ends: list[int], counts: list[int]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Samples of the chunks ``buf[starts[i]:ends[i]]``, one after the other (each must hold
    ``counts[i]`` samples): fresh (int64 timestamps, float64 values), bit for bit as encoded.

    Raises CorruptChunk, and nothing else, for bytes this codec did not write (the expected
    counts bound every allocation); timestamps must strictly increase within each chunk."""
    data = buf if isinstance(buf, bytes) else bytes(memoryview(buf).cast("B"))
    heads, blocks, per_chunk_blocks = _walk(data, starts, ends, counts, None)
    if sum(counts) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    return _reconstruct(np.frombuffer(data, dtype=np.uint8), np.array(blocks, np.int64).reshape(-1, 9)[:, 2:8],
                        _Heads.of(heads), np.array(per_chunk_blocks, np.int64), np.array(counts, np.int64))


def _walk(data: bytes, starts: list[int], ends: list[int], counts: list[int], shift0: list[int] | None
          ) -> tuple[list[_Header], list[tuple[int, ...]], list[int]]:
    """The chunk headers and block headers of a few chunks, a Python step per block: (headers, one
    row per block as walk_many gives them, blocks per chunk). Raises CorruptChunk."""
    size = len(data)
    view = memoryview(data)
    blocks: list[tuple[int, ...]] = []  # chunk, position, n, mode, wt, wv, shift, ts payload start, flags at
    heads: list[_Header] = []
    per_chunk_blocks: list[int] = []
    for c, (start, end, want) in enumerate(zip(starts, ends, counts, strict=True)):
        if not 0 <= start <= end <= size:
            raise CorruptChunk("chunk bounds outside the buffer")
        h, pos = _read_header(view, start)
        heads.append(h)
        got = 0
        shift = shift0[c] if shift0 is not None else 0
        first_block = len(blocks)
        xor_family = h.family == XOR_FAMILY
        while pos < end:  # FORMAT.md "Block": one Python step per block, the payloads are NumPy's
            flags = data[pos]
            at = pos
            pos += 1
            if flags & 0x07:
                raise CorruptChunk(f"block flags {flags:#x}")
            n = h.block
            wt = wv = 0
            mode = (flags >> F_VAL_SHIFT) & 3
            if flags & (F_COUNT | F_TS | F_SHIFT) or mode:
                if pos + 4 > end:  # the optional bytes: each is read only if there
                    tail = data[pos:end] + bytes(4)
                    if flags & F_COUNT and pos >= end:
                        raise CorruptChunk("block truncated")
                else:
                    tail = data[pos : pos + 4]
                j = 0
                if flags & F_COUNT:
                    n = tail[j]
                    j += 1
                    if n == 0:
                        raise CorruptChunk("empty block")
                if flags & F_TS:
                    wt = tail[j]
                    j += 1
                if mode:
                    wv = tail[j]
                    j += 1
                    if (mode == XOR) != xor_family:
                        raise CorruptChunk(f"value mode {mode} in a chunk of family {h.family:#x}")
                if flags & F_SHIFT:
                    shift = tail[j]
                    j += 1
                pos += j
                if pos > end:
                    raise CorruptChunk("block truncated")
                if wt > 64 or wv > 64 or shift > 63:
                    raise CorruptChunk(f"block widths {wt}, {wv}, shift {shift}")
            got += n
            if got > want:
                raise CorruptChunk(f"chunk holds more than the {want} samples expected")
            blocks.append((c, len(blocks) - first_block, n, mode, wt, wv, shift, pos, at))
            pos += (n * wt + 7) // 8 + (n * wv + 7) // 8
        if pos != end or got != want:
            raise CorruptChunk(f"chunk ends at byte {pos} of {end} after {got} of {want} samples")
        per_chunk_blocks.append(len(blocks) - first_block)
    return heads, blocks, per_chunk_blocks


@dataclass(frozen=True)
class _Heads:
    """The chunk headers of a decode, as columns."""

    family: np.ndarray  # int64
    t1: np.ndarray  # int64
    d1: np.ndarray  # int64
    m1: np.ndarray  # int64, decimal chunks (0 for XOR ones)
    x1: np.ndarray  # uint64, XOR chunks (0 for decimal ones)
    e1: np.ndarray  # int64

    @staticmethod
    def of(heads: list[_Header]) -> _Heads:
        xor = [h.family == XOR_FAMILY for h in heads]
        return _Heads(np.array([h.family for h in heads], np.int64), np.array([h.t1 for h in heads], np.int64),
                      np.array([h.d1 for h in heads], np.int64),
                      np.array([0 if x else h.c1 for h, x in zip(heads, xor, strict=True)], np.int64),
                      np.array([h.c1 if x else 0 for h, x in zip(heads, xor, strict=True)], np.uint64),
                      np.array([h.e1 for h in heads], np.int64))


def _reconstruct(raw: np.ndarray, blocks: np.ndarray, heads: _Heads, per_chunk_blocks: np.ndarray,
                 counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The samples of walked blocks (per block: n, mode, wt, wv, shift, ts payload start; the blocks
    of each chunk in order, chunk after chunk): every payload unpacked, every chain summed."""
    n_arr, mode_arr, wt_arr, wv_arr, shift_arr, tpos = (blocks[:, j] for j in range(6))
    total = int(counts.sum())
    n_chunks = len(heads.family)
    one_chunk = n_chunks == 1
    blk = np.repeat(np.arange(len(blocks)), n_arr)
    chunk = np.zeros(total, np.int64) if one_chunk else np.repeat(np.repeat(np.arange(n_chunks),
                                                                            per_chunk_blocks), n_arr)
    cstart = np.cumsum(counts) - counts  # first sample of each chunk
    local = np.arange(total) - cstart[chunk]  # position of each sample in its chunk
    with np.errstate(over="ignore"):
        # timestamps: d_i = d1 + sum(dod), t_i = t1 + sum(d), each chunk its own chain
        d1 = heads.d1[chunk]
        t1 = heads.t1[chunk]
        index = (blk, np.arange(total) - np.repeat(np.cumsum(n_arr) - n_arr, n_arr))  # segment_index(n_arr), shared
        if bool(wt_arr.any()):
            d = d1 + _segment_cumsum(unzigzag(unpack_segments(raw, tpos, n_arr, wt_arr, index)), cstart)
            t = t1 + _segment_cumsum(d, cstart)
            if bool(np.any((t[1:] <= t[:-1]) & (local[1:] > 0))):
                raise CorruptChunk("timestamps do not increase")
        else:  # every scrape on its chunk's grid: no payload at all
            if bool(np.any(d1 <= 0)):
                raise CorruptChunk("timestamps do not increase")
            t = t1 + d1 * (local + 1)
        vals = np.empty(total, np.float64)
        fam = heads.family
        y = unpack_segments(raw, tpos + (n_arr * wt_arr + 7) // 8, n_arr, wv_arr, index) if bool(wv_arr.any()) \
            else np.zeros(total, np.uint64)
        smode = mode_arr[blk]
        sshift = shift_arr[blk]
        is_xor = fam == XOR_FAMILY
        xor_chunk = is_xor[chunk]
        if bool(is_xor.any()):
            x = np.where(smode == XOR, y << sshift.astype(np.uint64), _U64(0))
            acc = np.bitwise_xor.accumulate(x)
            # per chunk: its own running XOR from its first sample, from the header's bits
            before = np.zeros(n_chunks, np.uint64)
            before[1:] = acc[cstart[1:] - 1]
            bits = acc ^ before[chunk] ^ heads.x1[chunk]
            vals[xor_chunk] = bits[xor_chunk].view(np.float64)
        if not bool(is_xor.all()):
            e1 = heads.e1[chunk]
            m1 = heads.m1[chunk]
            signed = unzigzag(y) << sshift
            dod = smode == DOD
            if bool(dod.all()):  # the delta of every sample is the one before plus its change
                delta = e1 + _segment_cumsum(signed, cstart)
            elif not bool(dod.any()):  # SAME (0) and DELTA give every delta itself
                delta = np.where(smode == DELTA, signed, 0)
            else:  # the last delta given before each sample (or e1), plus the changes since
                given = np.where(smode == DELTA, signed, 0)
                idx = np.arange(total)
                anchor = np.maximum.accumulate(np.where(dod, -1, idx))
                anchor = np.where(anchor >= cstart[chunk], anchor, -1)
                csum = _segment_cumsum(np.where(dod, signed, 0), cstart)
                at = np.maximum(anchor, 0)
                base = np.where(anchor >= 0, given[at], e1)
                delta = np.where(dod, base + csum - np.where(anchor >= 0, csum[at], 0), given)
            m = m1 + _segment_cumsum(delta, cstart)
            if bool(np.any((np.abs(m) >= 2**52) & ~xor_chunk)):
                raise CorruptChunk("decimal value out of range")
            f = m.astype(np.float64)
            scale = np.where(is_xor, 0, fam)
            if one_chunk:
                if scale[0]:
                    f /= _POW10[scale[0]]
            else:
                per = scale[chunk]
                np.divide(f, _POW10[per], out=f, where=per > 0)
            if bool(is_xor.any()):
                vals[~xor_chunk] = f[~xor_chunk]
            else:
                vals = f
    return t, vals


def _segment_cumsum(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Cumulative sums of ``x`` restarting at each index in ``starts`` (sorted, starts[0] == 0)."""
    c = np.cumsum(x)
    if len(starts) > 1:
        off = np.zeros(len(starts), dtype=c.dtype)
        off[1:] = c[starts[1:] - 1]
        c -= np.repeat(off, np.diff(np.append(starts, len(x))))
    return c


def _gather_le(raw: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """The little-endian ``width``-byte integers at ``pos`` (as uint64)."""
    b = raw[pos[:, None] + np.arange(width)[None, :]].astype(np.uint64)
    return (b << (np.uint64(8) * np.arange(width, dtype=np.uint64))[None, :]).sum(axis=1, dtype=np.uint64)


def _uvarints(raw: np.ndarray, pos: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """LEB128 varints at ``pos`` of every chunk at once: (values as uint64, position after each).
    Raises CorruptChunk for one running past ``end`` or over 10 bytes."""
    value = np.zeros(len(pos), np.uint64)
    at = pos.copy()
    going = np.ones(len(pos), bool)
    for j in range(10):
        idx = np.flatnonzero(going)
        if len(idx) == 0:
            return value, at
        if bool((at[idx] >= end[idx]).any()):
            raise CorruptChunk("varint runs past the chunk")
        b = raw[at[idx]].astype(np.uint64)
        value[idx] |= (b & np.uint64(0x7F)) << np.uint64(7 * j)
        at[idx] += 1
        going[idx] = b >= 0x80
    raise CorruptChunk("varint over 64 bits")


def decode_many(buf: bytes | memoryview, starts: np.ndarray, ends: np.ndarray, counts: np.ndarray,
                shift0: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """decode_chunks for many chunks at once (a full scan of many series): the block headers of
    every chunk are walked in lock step, a NumPy step per block position instead of a Python step
    per block, so the cost is per sample, not per chunk. Same answer and errors as decode_chunks.
    ``shift0``: each chunk's running value shift before its first block (codec/tail.py enters a
    chunk at a block whose shift was set by an earlier one); 0 by default, as in a chunk's start."""
    walked = walk_many(buf, starts, ends, counts, shift0)
    if walked is None:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    raw, heads, blocks = walked
    per_chunk = np.bincount(blocks[:, 0], minlength=len(heads.family))
    return _reconstruct(raw, blocks[:, 2:8], heads, per_chunk, np.asarray(counts, dtype=np.int64))


def walk_many(buf: bytes | memoryview, starts: np.ndarray, ends: np.ndarray, counts: np.ndarray,
              shift0: np.ndarray | None = None) -> tuple[np.ndarray, _Heads, np.ndarray] | None:
    """The chunk headers and the block headers of many chunks, walked in lock step (no payload
    read): (the buffer as uint8, the headers, one row per block: chunk, position in its chunk, n,
    mode, wt, wv, shift, payload start, flags byte position; each chunk's blocks in order, chunk
    after chunk). None when there is nothing to decode. Raises CorruptChunk as decode_chunks."""
    raw = np.frombuffer(buf, dtype=np.uint8)
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    k = len(starts)
    if k == 0 or int(counts.sum()) == 0:
        if bool((counts != 0).any() or (ends != starts).any()):
            raise CorruptChunk("chunk bounds and counts disagree")
        return None
    if bool((starts < 0).any() or (ends < starts).any() or (ends > len(raw)).any() or (starts + 10 > ends).any()):
        raise CorruptChunk("chunk bounds outside the buffer or shorter than a header")
    if k < FEW_CHUNKS:  # a Python step per block costs less than a lock step per block position
        data = buf if isinstance(buf, bytes) else raw.tobytes()
        few, rows, _ = _walk(data, starts.tolist(), ends.tolist(), counts.tolist(),
                             None if shift0 is None else np.asarray(shift0, np.int64).tolist())
        return raw, _Heads.of(few), np.array(rows, np.int64).reshape(-1, 9)
    padded = np.concatenate([raw, np.zeros(16, np.uint8)])  # header reads may look past a chunk's end
    # chunk headers (FORMAT.md "Chunk header")
    family = padded[starts].astype(np.int64)
    block = padded[starts + 1].astype(np.int64)
    if bool(((family > MAX_SCALE) & (family != XOR_FAMILY)).any() or (block == 0).any()):
        raise CorruptChunk("chunk header: family or block size")
    t1 = _gather_le(padded, starts + 2, 8).view(np.int64)
    d1, pos = _uvarints(padded, starts + 10, ends)
    xor = family == XOR_FAMILY
    m1 = np.zeros(k, np.uint64)
    e1 = np.zeros(k, np.uint64)
    x1 = np.zeros(k, np.uint64)
    dec = np.flatnonzero(~xor)
    if len(dec):
        m1[dec], pos[dec] = _uvarints(padded, pos[dec], ends[dec])
        e1[dec], pos[dec] = _uvarints(padded, pos[dec], ends[dec])
    xr = np.flatnonzero(xor)
    if len(xr):
        if bool((pos[xr] + 8 > ends[xr]).any()):
            raise CorruptChunk("chunk shorter than its header")
        x1[xr] = _gather_le(padded, pos[xr], 8)
        pos[xr] += 8
    heads = _Heads(family, t1, unzigzag(d1), unzigzag(m1), x1, unzigzag(e1))
    # blocks, one position at a time for every chunk that has one left (FORMAT.md "Block")
    steps: list[np.ndarray] = []
    got = np.zeros(k, np.int64)
    shift = np.zeros(k, np.int64) if shift0 is None else np.asarray(shift0, dtype=np.int64).copy()
    active = np.flatnonzero(pos < ends)
    step = 0
    while len(active):
        p = pos[active]
        flags = padded[p].astype(np.int64)
        if bool((flags & 0x07).any()):
            raise CorruptChunk("block flags")
        mode = (flags >> F_VAL_SHIFT) & 3
        has_count, has_ts, has_shift = (flags & F_COUNT) > 0, (flags & F_TS) > 0, (flags & F_SHIFT) > 0
        has_val = mode != SAME
        if bool(((mode == XOR) != xor[active])[has_val].any()):
            raise CorruptChunk("value mode outside its chunk's family")
        at = p + 1
        n = np.where(has_count, padded[at].astype(np.int64), block[active])
        at = at + has_count
        wt = np.where(has_ts, padded[at].astype(np.int64), 0)
        at = at + has_ts
        wv = np.where(has_val, padded[at].astype(np.int64), 0)
        at = at + has_val
        sh = np.where(has_shift, padded[at].astype(np.int64), shift[active])
        at = at + has_shift
        shift[active] = sh
        if bool((n == 0).any() or (wt > 64).any() or (wv > 64).any() or (sh > 63).any()):
            raise CorruptChunk("block count, widths or shift out of range")
        got[active] += n
        if bool((got[active] > counts[active]).any()):
            raise CorruptChunk("chunk holds more than the samples expected")
        steps.append(np.stack([active, np.full(len(active), step), n, mode, wt, wv, sh, at, p], axis=1))
        pos[active] = at + (n * wt + 7) // 8 + (n * wv + 7) // 8
        if bool((pos[active] > ends[active]).any()):
            raise CorruptChunk("block runs past its chunk")
        active = active[pos[active] < ends[active]]
        step += 1
    if bool((got != counts).any()):
        raise CorruptChunk("chunks hold other sample counts than expected")
    blocks = np.concatenate(steps)
    return raw, heads, blocks[np.lexsort((blocks[:, 1], blocks[:, 0]))]  # each chunk's blocks in order
