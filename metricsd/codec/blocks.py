"""Block chunks: the store's compressed samples, sealed a block at a time (FORMAT.md, "Block chunks").

A series' samples are compressed as they arrive, in blocks of a few samples (the store's
head_keep, 32 by default): each block continues the chain of the one before (delta of delta
for timestamps, delta, delta of delta or XOR for values), so a block needs only a flags byte
and a width or two of header. A chunk is a short header (where the chain starts) and then
blocks appended one after another until the chunk is closed; nothing already written changes when a block is added.

``encode_blocks`` seals one block for each of many series in one pass: every choice (decimal
scale, transform, widths, shifts) and the byte assembly run over all blocks at once, with no
Python per block. The decoders (``decode_chunks``, ``decode_many``, ``walk_many``) are in
metricsd/codec/blockdecode.py; the constants of the layout live here, for both.

Pure functions, no state; safe to call from any thread.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from metricsd.codec.bits import bit_length, pack_into, zigzag

__all__ = ["DELTA", "DOD", "F_COUNT", "F_SHIFT", "F_TS", "F_VAL_SHIFT", "MAX_BLOCK", "MAX_SCALE", "NO_CHUNK",
           "SAME", "XOR", "XOR_FAMILY", "Chain", "Encoded", "encode_blocks"]

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


def _fits(v: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Value by value: whether ``v`` is m / 10**k exactly for int |m| < 2**52 (bit for bit, so -0.0,
    NaN and infinities never fit), and the integers m; the scales ``k`` broadcast against ``v``."""
    p = _POW10[k]
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = v * p
        ok = np.abs(scaled) < _MAX_EXACT  # also false for NaN
        m = np.rint(np.where(ok, scaled, 0.0)).astype(np.int64)
        back = m.astype(np.float64)
        np.divide(back, p, out=back, where=k > 0)
    fit: np.ndarray = ok & (back.view(np.uint64) == v.view(np.uint64))
    return fit, m


def _scale_fit(v: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Whether every value of each row fits the row's scale ``k[row]`` (see _fits), and the integers m."""
    ok, m = _fits(v, k[:, None])
    return np.asarray(ok.all(axis=1)), m


_SCALES = np.arange(MAX_SCALE + 1)


def _choose_family(v: np.ndarray) -> np.ndarray:
    """Per row: the smallest decimal scale that fits every value, else XOR_FAMILY.

    A row fits a scale only if its first value does, so the first column is tried at every scale
    in one step, and a whole row only at the scales its first value fits: a row of float noise
    (XOR) costs one value's checks, not 13 passes over the block (perf/RESULTS.md, session 44)."""
    fam = np.full(len(v), XOR_FAMILY, np.int64)
    first, _ = _fits(v[:, :1], _SCALES[None, :])
    left = np.asarray(first.any(axis=1))
    remaining = int(left.sum())
    for scale in np.flatnonzero(first.any(axis=0)).tolist():
        if not remaining:
            break
        todo = np.flatnonzero(left & first[:, scale])
        if len(todo):
            fit, _ = _scale_fit(v[todo], np.full(len(todo), scale, np.int64))
            won = todo[fit]
            fam[won] = scale
            left[won] = False
            remaining -= len(won)
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
    family, block size, t1, svarint d1, then svarint m1, svarint e1 (decimal) or 8 bytes (XOR).

    Built for the started rows only, in whole-matrix steps: every field's bytes side by side
    (48 columns), a mask of the bytes each row keeps, and the kept bytes moved left (a wave that
    starts chunks took ~190 NumPy calls over all its rows field byte by field byte before)."""
    k = len(started)
    out = np.zeros((k, 40), np.uint8)
    lens = np.zeros(k, np.int64)
    rows = np.flatnonzero(started)
    r = len(rows)
    if not r:
        return out, lens
    ts, dec = t1[rows], decimal[rows][:, None]
    n_var, var = _svarint_bytes(np.concatenate([ts - t2[rows], c1[rows], e1[rows]]))  # d1, m1, e1: one pass
    d_len, c_len, e_len = n_var[:r], n_var[r : 2 * r], n_var[2 * r :]
    d_mat, c_mat, e_mat = var[:r], var[r : 2 * r], var[2 * r :]
    fixed = np.empty((r, 2), np.uint8)
    fixed[:, 0] = family[rows].astype(np.uint8)
    fixed[:, 1] = block_size
    fields = np.concatenate([fixed, _le8(ts), d_mat, c_mat, e_mat, _le8(c1[rows])], axis=1)
    col = np.arange(10)
    keep = np.concatenate([np.ones((r, 10), bool), col < d_len[:, None], (col < c_len[:, None]) & dec,
                           (col < e_len[:, None]) & dec, np.broadcast_to(~dec, (r, 8))], axis=1)
    at = np.cumsum(keep, axis=1) - 1
    which, _ = np.nonzero(keep)
    sub = np.zeros((r, 40), np.uint8)
    sub[which, at[keep]] = fields[keep]
    out[rows] = sub
    lens[rows] = keep.sum(axis=1)
    return out, lens
