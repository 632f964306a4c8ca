"""Block chunks: the store's compressed samples, sealed a block at a time (FORMAT.md, "Block chunks").

A series' samples are compressed as they arrive, in blocks of a few samples (the store's
head_keep, 32 by default): each block continues the chain of the one before (delta of delta
for timestamps, delta, delta of delta or XOR for values), so a block needs only a flags byte
and a width or two of header. A chunk is a short header (where the chain starts) and then
blocks appended one after another until the chunk is closed; nothing already written changes when a block is added.

``encode_blocks`` seals one block for each of many series in one pass: every choice (decimal
scale, transform, widths, shifts) and the byte assembly run over all blocks at once, with no
Python per block. ``decode_chunks`` reads chunks back: a short Python walk over the block
headers, then the payloads of every block unpacked and the chains summed up at once.

Pure functions, no state; safe to call from any thread.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from metricsd.codec import bitpack as bp
from metricsd.codec.bits import bit_length, pack_into, unpack_segments, unzigzag, zigzag
from metricsd.codec.errors import CorruptChunk

__all__ = ["MAX_BLOCK", "MAX_SCALE", "NO_CHUNK", "XOR_FAMILY", "Chain", "Encoded", "chunk_header_size",
           "decode_chunks", "decode_many", "encode_blocks", "walk_many"]

MAX_SCALE = 12  # decimal chunks: v == m / 10**k for k in 0..12 and int |m| < 2**52
XOR_FAMILY = 0x80  # the family byte of a chunk whose values are XOR'd float bits
NO_CHUNK = -1  # Chain.family of a series with no open chunk: the next block starts one
MAX_BLOCK = 255  # samples in one block (its count is a byte)

# block flags (FORMAT.md, "Block")
F_TS = 0x80  # dods packed; else every delta of delta is 0
F_VAL_SHIFT = 5
SAME, DELTA, DOD, XOR = 0, 1, 2, 3  # value modes, bits 6-5
F_SHIFT = 0x10  # a shift byte follows
F_COUNT = 0x08  # a count byte follows; else the chunk's block size

_POW10 = np.array([10.0**k for k in range(MAX_SCALE + 1)])
_MAX_EXACT = float(2**52)
_U64 = np.uint64
_T1 = struct.Struct("<q")
_V1 = struct.Struct("<Q")


@dataclass
class Chain:
    """Per series (arrays of one length), the state of its open chunk's chain: the two samples
    before the next block (``t1`` the newer), the running shift and the chunk's family
    (0..12: decimal scale; XOR_FAMILY; NO_CHUNK: no open chunk, the next block starts one)."""

    t1: np.ndarray  # int64
    t2: np.ndarray  # int64
    v1: np.ndarray  # float64
    v2: np.ndarray  # float64
    shift: np.ndarray  # int64, 0..63
    family: np.ndarray  # int64

    @staticmethod
    def empty(k: int) -> Chain:
        return Chain(np.zeros(k, np.int64), np.zeros(k, np.int64), np.zeros(k), np.zeros(k), np.zeros(k, np.int64),
                     np.full(k, NO_CHUNK, np.int64))

    def take(self, rows: np.ndarray) -> Chain:
        return Chain(self.t1[rows], self.t2[rows], self.v1[rows], self.v2[rows], self.shift[rows], self.family[rows])


@dataclass(frozen=True)
class Encoded:
    """Block i is ``data[offsets[i]:offsets[i + 1]]``, led by a chunk header when ``started[i]``
    (the series had no open chunk, or the block's values do not fit its chunk's family). ``after``
    is the chain after each block."""

    data: np.ndarray  # uint8
    offsets: np.ndarray  # int64[k + 1]
    started: np.ndarray  # bool[k]
    after: Chain


def _svarint_bytes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, k x 10 byte matrix) of zigzag LEB128 varints of int64 ``x``."""
    return _uvarint_bytes(zigzag(x))


def _uvarint_bytes(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z = np.asarray(z, dtype=np.uint64)
    n = np.maximum(1, (bit_length(z) + 6) // 7)
    j = np.arange(10, dtype=np.uint64)
    groups = ((z[:, None] >> (_U64(7) * j[None, :])) & _U64(0x7F)).astype(np.uint8)
    groups |= np.where(j[None, :] < (n[:, None] - 1).astype(np.uint64), np.uint8(0x80), np.uint8(0))
    return n, groups


def _le8(x: np.ndarray) -> np.ndarray:
    """k x 8 little-endian bytes of int64 / uint64 ``x``."""
    return np.ascontiguousarray(x).astype("<u8" if x.dtype == np.uint64 else "<i8").view(np.uint8).reshape(-1, 8)


def _trailing_zeros(u: np.ndarray) -> np.ndarray:
    """Trailing zero bits of each uint64 (0 for 0)."""
    u = np.asarray(u, dtype=np.uint64)
    return np.where(u > 0, bit_length(u & (_U64(0) - u)) - 1, 0)


def _scale_fit(v: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Whether every value of each row is m / 10**k[row] exactly for int |m| < 2**52 (bit for bit,
    so -0.0, NaN and infinities never fit), and the integers m."""
    p = _POW10[k][:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = v * p
        ok = np.abs(scaled) < _MAX_EXACT  # also false for NaN
        m = np.rint(np.where(ok, scaled, 0.0)).astype(np.int64)
        back = m.astype(np.float64)
        np.divide(back, p, out=back, where=k[:, None] > 0)
    return (ok & (back.view(np.uint64) == v.view(np.uint64))).all(axis=1), m


def _choose_family(v: np.ndarray) -> np.ndarray:
    """Per row: the smallest decimal scale that fits every value, else XOR_FAMILY."""
    k = len(v)
    fam = np.full(k, XOR_FAMILY, np.int64)
    todo = np.arange(k)
    for scale in range(MAX_SCALE + 1):
        if len(todo) == 0:
            break
        fit, _ = _scale_fit(v[todo], np.full(len(todo), scale, np.int64))
        fam[todo[fit]] = scale
        todo = todo[~fit]
    return fam


def encode_blocks(t: np.ndarray, v: np.ndarray, chain: Chain, block_size: int) -> Encoded:
    """Seal one block of ``n`` samples for each of ``k`` series: ``t`` (k x n int64, strictly
    increasing after each row's ``chain.t1`` unless the row starts a chunk) and ``v`` (k x n float64,
    any bit pattern). ``block_size`` goes into the header of each chunk started here; a block of
    another size records its count. Raises ValueError for n outside 1..255.

    The common rows cost least: a regular scrape (every delta of delta 0) and a value equal to
    the one before (requests, limits, idle counters) are tested with one comparison each, and
    only the other rows are transformed and packed."""
    t = np.ascontiguousarray(t, dtype=np.int64)
    v = np.ascontiguousarray(v, dtype=np.float64)
    k, n = t.shape
    if not 1 <= n <= MAX_BLOCK or not 1 <= block_size <= MAX_BLOCK:
        raise ValueError(f"a block holds 1..{MAX_BLOCK} samples, not {n} (block size {block_size})")
    bits = v.view(np.uint64)
    family = chain.family.astype(np.int64, copy=True)
    prev_bits = chain.v1.view(np.uint64)
    continuing = family != NO_CHUNK
    same = (bits == np.where(continuing, prev_bits, bits[:, 0])[:, None]).all(axis=1)
    # a block whose values leave its decimal chunk's scale starts a new chunk (a value equal to
    # the one before is a sample of the chunk already, so it fits)
    check = np.flatnonzero(continuing & (family <= MAX_SCALE) & ~same)
    m_check = None
    if len(check):
        fit, m_check = _scale_fit(v[check], family[check])
        family[check[~fit]] = NO_CHUNK
    started = family == NO_CHUNK
    any_started = bool(started.any())
    if any_started:
        family[started] = _choose_family(v[started])
        same &= ~started | (bits == bits[:, :1]).all(axis=1)

    # timestamps: the two before the block are the chain's, or, for a new chunk, virtual ones
    # that make its first deltas of deltas 0 (t_-1 = t_0 - (t_1 - t_0), ...)
    t1 = chain.t1
    t2 = chain.t2
    if any_started:
        step = t[:, 1] - t[:, 0] if n >= 2 else np.ones(k, np.int64)
        with np.errstate(over="ignore"):
            t1 = np.where(started, t[:, 0] - step, t1)
            t2 = np.where(started, t1 - step, t2)
    with np.errstate(over="ignore"):
        d_prev = t1 - t2
        first = t[:, 0] - t1
        irregular = first != d_prev
        if n > 1:
            irregular |= (t[:, 1:] - t[:, :-1] != first[:, None]).any(axis=1)
    wt = np.zeros(k, np.int64)
    ts_rows = np.flatnonzero(irregular)
    zt = None
    if len(ts_rows):
        with np.errstate(over="ignore"):
            tt = np.concatenate([t2[ts_rows, None], t1[ts_rows, None], t[ts_rows]], axis=1)
            d = tt[:, 1:] - tt[:, :-1]
            zt = zigzag(d[:, 1:] - d[:, :-1])
        wt[ts_rows] = bit_length(np.bitwise_or.reduce(zt, axis=1))

    # values
    shift = np.where(started, 0, chain.shift)
    new_shift = shift.copy()
    mode = np.full(k, SAME, np.int64)
    wv = np.zeros(k, np.int64)
    val_rows = np.flatnonzero(~same)
    decimal = family <= MAX_SCALE
    head_c1 = np.zeros(k, np.int64)  # chunk header: m_-1 (decimal) or the bits before (XOR)
    head_e1 = np.zeros(k, np.int64)
    dec_rows = val_rows[decimal[val_rows]]
    xor_rows = val_rows[~decimal[val_rows]]
    y_dec = y_xor = None
    if len(dec_rows):
        rows = dec_rows
        p = _POW10[family[rows]][:, None]
        # without new chunks these are the scale check's rows: its integers serve
        mv = m_check if m_check is not None and not any_started else np.rint(v[rows] * p).astype(np.int64)
        with np.errstate(invalid="ignore", over="ignore"):
            c1 = np.rint(chain.v1[rows] * p[:, 0]).astype(np.int64)
            c2 = np.rint(chain.v2[rows] * p[:, 0]).astype(np.int64)
        st = started[rows]
        if bool(st.any()):
            first_step = mv[:, 1] - mv[:, 0] if n >= 2 else np.zeros(len(rows), np.int64)
            c1 = np.where(st, mv[:, 0] - first_step, c1)
            c2 = np.where(st, c1 - first_step, c2)
            head_c1[rows], head_e1[rows] = c1, c1 - c2
        mm = np.concatenate([c2[:, None], c1[:, None], mv], axis=1)
        delta = mm[:, 2:] - mm[:, 1:-1]
        dd = delta - (mm[:, 1:-1] - mm[:, :-2])
        cur = shift[rows]
        sd = _best_shift(np.bitwise_or.reduce(delta.view(np.uint64), axis=1), cur, n)
        so = _best_shift(np.bitwise_or.reduce(dd.view(np.uint64), axis=1), cur, n)
        wd = _zigzag_width(delta, sd)
        wo = _zigzag_width(dd, so)
        use_dod = n * wo + 8 * (so != cur) < n * wd + 8 * (sd != cur)
        s = np.where(use_dod, so, sd)
        mode[rows] = np.where(use_dod, DOD, DELTA)
        new_shift[rows] = s
        wv[rows] = np.where(use_dod, wo, wd)
        y_dec = zigzag(np.where(use_dod[:, None], dd, delta) >> s[:, None])
    if len(xor_rows):
        rows = xor_rows
        b = bits[rows]
        prev = np.where(started[rows], b[:, 0], prev_bits[rows])
        x = b ^ np.concatenate([prev[:, None], b[:, :-1]], axis=1)
        cur = shift[rows]
        s = _best_shift(np.bitwise_or.reduce(x, axis=1), cur, n)
        mode[rows] = XOR
        new_shift[rows] = s
        y_xor = x >> s.astype(np.uint64)[:, None]
        wv[rows] = bit_length(np.bitwise_or.reduce(y_xor, axis=1))
    if any_started:
        xs = np.flatnonzero(started & ~decimal)
        head_c1[xs] = bits[xs, 0].view(np.int64)  # the bits before a new XOR chunk: its first value's
        ds = np.flatnonzero(started & decimal & same)  # a constant new decimal chunk: m_-1 = m_0
        if len(ds):
            head_c1[ds] = np.rint(v[ds, 0] * _POW10[family[ds]]).astype(np.int64)

    # bytes: [chunk header] flags [count] [wt] [wv] [shift] ts-payload value-payload
    has_shift = (mode != SAME) & (new_shift != shift)
    flags = (np.where(wt > 0, F_TS, 0) | (mode << F_VAL_SHIFT) | np.where(has_shift, F_SHIFT, 0)
             | (F_COUNT if n != block_size else 0))
    head = np.zeros((k, 5), np.uint8)
    head[:, 0] = flags
    hl = np.ones(k, np.int64)
    rk = np.arange(k)
    for present, value in ((np.full(k, n != block_size), np.full(k, n)), (wt > 0, wt), (mode != SAME, wv),
                           (has_shift, new_shift)):
        if bool(present.any()):
            head[rk[present], hl[present]] = value[present]
            hl += present
    chunk_len = np.zeros(k, np.int64)
    if any_started:
        ch, chunk_len = _chunk_headers(started, family, block_size, t1, t2, decimal, head_c1, head_e1)
    tl = (n * wt + 7) // 8
    vl = (n * wv + 7) // 8
    offsets = np.zeros(k + 1, np.int64)
    np.cumsum(chunk_len + hl + tl + vl, out=offsets[1:])
    total = int(offsets[-1])
    # payloads straight into their places in the output, as a big-endian bit stream
    words = np.zeros(total // 8 + 2, np.uint64)
    pay = 8 * (offsets[:-1] + chunk_len + hl)
    if zt is not None:
        keep = wt[ts_rows] > 0
        pack_into(words, pay[ts_rows[keep]], zt[keep], wt[ts_rows[keep]])
    pay += 8 * tl
    for rows, y in ((dec_rows, y_dec), (xor_rows, y_xor)):
        if y is not None:
            keep = wv[rows] > 0
            pack_into(words, pay[rows[keep]], y[keep], wv[rows[keep]])
    out = words.astype(">u8").view(np.uint8)[:total]
    at = offsets[:-1]
    if any_started:
        _scatter(out, at, chunk_len, ch)
        at = at + chunk_len
    _scatter(out, at, hl, head)

    after = Chain(t[:, -1].copy(), t[:, -2].copy() if n >= 2 else t1.copy(), v[:, -1].copy(),
                  v[:, -2].copy() if n >= 2 else np.where(started, v[:, 0], chain.v1), new_shift, family)
    return Encoded(np.ascontiguousarray(out), offsets, started, after)


def _best_shift(orr: np.ndarray, cur: np.ndarray, n: int) -> np.ndarray:
    """The shift for a block whose values OR to ``orr``: the running one ``cur`` while it divides
    them all, or their own trailing zeros when those are fewer, or when moving to them saves more
    bits than the shift byte costs. A block of zeros keeps the running shift."""
    tz = np.where(orr == 0, cur, _trailing_zeros(orr))
    return np.where((tz < cur) | (n * (tz - cur) > 8), tz, cur)


def _zigzag_width(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Bits of the widest zigzag(x >> s) in each row, from the row's extremes only."""
    hi = np.maximum.reduce(x, axis=1) >> s
    lo = np.minimum.reduce(x, axis=1) >> s
    return bit_length(np.maximum(zigzag(hi), zigzag(lo)))


def _scatter(out: np.ndarray, at: np.ndarray, lens: np.ndarray, mat: np.ndarray) -> None:
    """out[at[i] : at[i] + lens[i]] = mat[i, :lens[i]] for every row i."""
    cols = np.arange(mat.shape[1])
    mask = cols[None, :] < lens[:, None]
    out[(at[:, None] + cols[None, :])[mask]] = mat[mask]


def _chunk_headers(started: np.ndarray, family: np.ndarray, block_size: int, t1: np.ndarray, t2: np.ndarray,
                   decimal: np.ndarray, c1: np.ndarray, e1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(k x 40 bytes, lengths) of the chunk headers of the started rows (0 bytes elsewhere):
    family, block size, t1, svarint d1, then svarint m1, svarint e1 (decimal) or 8 bytes (XOR)."""
    k = len(started)
    out = np.zeros((k, 40), np.uint8)
    out[:, 0] = family.astype(np.uint8)
    out[:, 1] = block_size
    out[:, 2:10] = _le8(t1)
    lens = np.full(k, 10, np.int64)
    rk = np.arange(k)
    fields = [(np.ones(k, bool), *_svarint_bytes(t1 - t2)), (decimal, *_svarint_bytes(c1)),
              (decimal, *_svarint_bytes(e1)), (~decimal, np.full(k, 8, np.int64), _le8(c1))]
    for present, flen, mat in fields:
        for j in range(mat.shape[1]):
            put = present & (flen > j)
            out[rk[put], lens[put] + j] = mat[put, j]
        lens += np.where(present, flen, 0)
    return out, np.where(started, lens, 0)


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
    size = len(data)
    view = memoryview(data)
    blocks: list[tuple[int, int, int, int, int, int]] = []  # n, mode, wt, wv, shift, ts payload start
    heads: list[_Header] = []
    per_chunk_blocks: list[int] = []
    for start, end, want in zip(starts, ends, counts, strict=True):
        if not 0 <= start <= end <= size:
            raise CorruptChunk("chunk bounds outside the buffer")
        h, pos = _read_header(view, start)
        heads.append(h)
        got = shift = 0
        first_block = len(blocks)
        xor_family = h.family == XOR_FAMILY
        while pos < end:  # FORMAT.md "Block": one Python step per block, the payloads are NumPy's
            flags = data[pos]
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
            blocks.append((n, mode, wt, wv, shift, pos))
            pos += (n * wt + 7) // 8 + (n * wv + 7) // 8
        if pos != end or got != want:
            raise CorruptChunk(f"chunk ends at byte {pos} of {end} after {got} of {want} samples")
        per_chunk_blocks.append(len(blocks) - first_block)
    total = sum(counts)
    if total == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    return _reconstruct(np.frombuffer(data, dtype=np.uint8), np.array(blocks, np.int64).reshape(-1, 6),
                        _Heads.of(heads), np.array(per_chunk_blocks, np.int64), np.array(counts, np.int64))


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
