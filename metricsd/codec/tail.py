"""The newest samples of block chunks, decoded without the chunk's older blocks.

A block continues its chunk's chain (codec/blocks.py), so a chunk was read from its header: a
30-minute window over a 720-sample chunk decoded all 720 samples of each series (perf/RESULTS.md,
"Issue 25: the remaining gaps"). But every step of the chain is linear, and the store keeps the
chain's end for each open chunk (its two newest samples: ``Chunks.max_ts``, ``t2``, ``v1``,
``v2``). So the blocks from some block ``b0`` on are decoded under a made-up header (t1 = 0,
d1 = 2**40, m1 = e1 = 0 or x1 = 0, the running shift the walk found before ``b0``) and the true
header is solved from the two newest samples:

- timestamps: t_i = t1 + (i + 1) d1 + T_i, where T_i is what the made-up header gives minus
  (i + 1) 2**40 (the large d1 only keeps the decoder's increasing-timestamps check quiet); the
  newest two samples give d1 and then t1;
- decimal values: m_i = m1 + M_i, plus (i + 1) e1 when every block from ``b0`` on is a delta of
  delta block (the newest two values give e1 and m1); when ``b0``'s block gives its deltas
  itself (delta or same), e1 plays no part and the newest value gives m1. A delta-of-delta
  block at ``b0`` followed later by another mode would leave e1 unknown: ``b0`` moves back to
  the nearest block that gives its deltas, or the chunk is left to a full decode;
- XOR values: bits_i = x1 ^ X_i, and the newest value gives x1.

The newest values are float64s of m / 10**k; m is recovered by rounding and kept only when it
divides back to the same float bit for bit (else the chunk is decoded in full). The answer is
the decoder's own arithmetic on the same integers, so it is bit for bit what a full decode
gives (tests/codec/test_codec_tail.py checks it against decode_chunks).

Pure functions, no state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from metricsd.codec.bitpack import put_uvarint
from metricsd.codec.blockdecode import decode_many, walk_many
from metricsd.codec.blocks import DOD, MAX_SCALE, XOR_FAMILY
from metricsd.codec.errors import CorruptChunk

__all__ = ["Tails", "decode_tails"]

_D1 = 1 << 40  # the made-up header's delta: keeps made-up timestamps increasing (dods sum far below it)
_POW10 = np.array([10.0**k for k in range(MAX_SCALE + 1)])
_LIMIT = 2**52


@dataclass(frozen=True)
class Tails:
    """Per chunk: ``ok`` (its tail was decoded; the others are the caller's to decode in full),
    ``counts`` (samples decoded, 0 where not ok) and ``before`` (the timestamp of the sample just
    before the decoded ones: a read of [start, ...] is answered by the tail when before < start);
    then the samples of the ok chunks, chunk after chunk."""

    ok: np.ndarray
    counts: np.ndarray
    before: np.ndarray
    t: np.ndarray
    v: np.ndarray


def _made_up_header(family: int, block: int) -> bytes:
    out = bytearray((family, block))
    out += bytes(8)  # t1 = 0
    put_uvarint(out, _D1 << 1)  # zigzag(2**40)
    if family == XOR_FAMILY:
        out += bytes(8)
    else:
        out += b"\x00\x00"  # m1 = e1 = 0
    return bytes(out)


def _exact_m(v: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(m, ok): the integer m with m / 10**scale == v bit for bit, as the decoder divides."""
    with np.errstate(invalid="ignore", over="ignore"):
        m_f = np.rint(v * _POW10[scale])
        ok = np.isfinite(m_f) & (np.abs(m_f) < _LIMIT)
        m = np.where(ok, m_f, 0).astype(np.int64)
        back = m.astype(np.float64)
        back = np.where(scale > 0, back / _POW10[scale], back)
    ok &= back.view(np.uint64) == np.asarray(v, np.float64).view(np.uint64)
    return m, ok


def decode_tails(buf: bytes, starts: np.ndarray, ends: np.ndarray, counts: np.ndarray, want: np.ndarray,
                 t_end: np.ndarray, t_prev: np.ndarray, v_end: np.ndarray, v_prev: np.ndarray) -> Tails:
    """The newest ``want[i]`` or more samples of each chunk ``buf[starts[i]:ends[i]]`` (of
    ``counts[i]`` samples), whose two newest samples are (t_prev, v_prev), (t_end, v_end).
    Raises CorruptChunk for bytes the codec did not write."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    k = len(starts)
    none = Tails(np.zeros(k, bool), np.zeros(k, np.int64), np.zeros(k, np.int64), np.zeros(0, np.int64),
                 np.zeros(0, np.float64))
    walked = walk_many(buf, starts, ends, counts)
    if walked is None:
        return none
    raw, heads, blocks = walked
    chunk, n, mode, shift, bpos = blocks[:, 0], blocks[:, 2], blocks[:, 3], blocks[:, 6], blocks[:, 8]
    nb = np.bincount(chunk, minlength=k)
    first = np.cumsum(nb) - nb  # each chunk's first block
    g = np.arange(len(blocks))
    # samples from each block to its chunk's end
    upto = np.cumsum(n)
    suffix = counts[chunk] - (upto - n - np.repeat(upto[first] - n[first], nb))
    enough = suffix >= np.maximum(want, 2)[chunk]  # a prefix of each chunk's blocks
    b0 = first + np.maximum(np.bincount(chunk, weights=enough, minlength=k).astype(np.int64) - 1, 0)
    b0 = np.minimum(b0, first + np.maximum(nb - 1, 0))
    xor = heads.family == XOR_FAMILY
    # decimal: a delta-of-delta block at b0 needs its anchor unless every later block is one too
    gives = mode != DOD  # delta or same: the block gives its deltas itself
    last_giver = np.maximum.accumulate(np.where(gives, g, -1))  # the newest such block at or before each
    givers_after = np.cumsum(gives[::-1])[::-1]  # such blocks from each block to the very end
    later = givers_after[b0] - np.append(givers_after, 0)[first + nb]  # ... to its chunk's end
    all_dod = ~xor & (later == 0)
    move = ~xor & ~all_dod & ~gives[b0]
    b0 = np.where(move, np.where(last_giver[b0] >= first, last_giver[b0], first), b0)
    ok = (b0 > first) & (nb > 0)
    m_end, ok_end = _exact_m(v_end, np.where(xor, 0, heads.family))
    m_prev, ok_prev = _exact_m(v_prev, np.where(xor, 0, heads.family))
    ok &= xor | (ok_end & (ok_prev | ~all_dod))
    take = np.flatnonzero(ok)
    if len(take) == 0:
        return none
    seg_start = bpos[b0[take]]
    seg_end = ends[take]
    tail_n = suffix[b0[take]]
    fam = heads.family[take]
    parts: list[bytes] = []
    new_starts = np.zeros(len(take), np.int64)
    new_ends = np.zeros(len(take), np.int64)
    at = 0
    data = raw.tobytes() if not isinstance(buf, bytes) else buf
    for j, (f, blk, s0, s1) in enumerate(zip(np.where(xor[take], XOR_FAMILY, 0).tolist(),
                                             raw[starts[take] + 1].tolist(), seg_start.tolist(), seg_end.tolist(),
                                             strict=True)):
        head = _made_up_header(f, blk)
        parts.append(head)
        parts.append(data[s0:s1])
        new_starts[j] = at
        at += len(head) + s1 - s0
        new_ends[j] = at
    shift0 = np.where(b0[take] > first[take], shift[np.maximum(b0[take] - 1, 0)], 0)
    try:
        t_m, f_m = decode_many(b"".join(parts), new_starts, new_ends, tail_n, shift0)
    except CorruptChunk:
        return none  # e.g. made-up values past 2**52: the caller decodes these chunks in full
    which = np.repeat(np.arange(len(take)), tail_n)
    cstart = np.cumsum(tail_n) - tail_n
    i1 = np.arange(len(t_m)) - cstart[which] + 1  # i + 1
    last = cstart + tail_n - 1
    with np.errstate(over="ignore", invalid="ignore"):
        big_t = t_m - i1 * _D1
        d1 = (t_end[take] - t_prev[take]) - (big_t[last] - big_t[last - 1])
        t1 = t_end[take] - tail_n * d1 - big_t[last]
        t = t1[which] + i1 * d1[which] + big_t
        vals = np.empty(len(t), np.float64)
        is_xor = xor[take]
        sx = is_xor[which]
        if bool(is_xor.any()):
            bits = f_m.view(np.uint64)
            x1 = np.asarray(v_end, np.float64)[take].view(np.uint64) ^ bits[last]
            vals[sx] = (bits ^ x1[which]).view(np.float64)[sx]
        if not bool(is_xor.all()):
            big_m = f_m.astype(np.int64)  # exact: family 0, |m| < 2**52 (the decoder checks)
            dd = all_dod[take]
            e1 = np.where(dd, (m_end[take] - m_prev[take]) - (big_m[last] - big_m[last - 1]), 0)
            m1 = m_end[take] - big_m[last] - tail_n * e1
            m = m1[which] + big_m + i1 * e1[which]
            bad = (np.abs(m) >= _LIMIT) & ~sx
            f = m.astype(np.float64)
            scale = np.where(is_xor, 0, fam)[which]
            np.divide(f, _POW10[scale], out=f, where=scale > 0)
            vals[~sx] = f[~sx]
            if bool(bad.any()):
                return none
    out_counts = np.zeros(k, np.int64)
    out_counts[take] = tail_n
    before = np.zeros(k, np.int64)
    before[take] = t1
    return Tails(ok, out_counts, before, t, vals)
