"""Bit packing of many segments at once, each with its own width (FORMAT.md, "Block chunks").

``codec/bitpack.py`` packs one sequence at one width; the block encoder seals thousands of
series' blocks in one call, each block with the widths its own samples need. Here every
operation runs over the flat array of all values of all segments: a fixed number of NumPy calls
per call, none per segment or per value, whatever the mix of widths.

A segment of ``n`` values of ``w`` bits is written MSB first, values back to back, then zero
bits to a whole byte (``ceil(n * w / 8)`` bytes), exactly as ``bitpack.pack`` writes one. All
arithmetic is on uint64; a shift by 64 or more is never asked of NumPy (its result differs
between versions), the callers' masks take care of it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["bit_length", "pack_segments", "segment_index", "unpack_segments", "unzigzag", "zigzag"]

_U64 = np.uint64
_SIXTY_THREE = _U64(63)
_SIXTY_FOUR = _U64(64)


def zigzag(x: np.ndarray) -> np.ndarray:
    """int64 (any shape) -> uint64 with small magnitudes first: 0, -1, 1, -2, ... -> 0, 1, 2, 3, ..."""
    x = np.asarray(x, dtype=np.int64)
    return ((x << 1) ^ (x >> 63)).view(np.uint64)


def unzigzag(u: np.ndarray) -> np.ndarray:
    """The inverse of :func:`zigzag`: uint64 -> int64."""
    u = np.asarray(u, dtype=np.uint64)
    return ((u >> _U64(1)) ^ (_U64(0) - (u & _U64(1)))).view(np.int64)


def bit_length(u: np.ndarray) -> np.ndarray:
    """Bits needed for each uint64 (0 for 0), as int64: exact over the whole uint64 range (a
    float64 of the value would round 2**64 - 1 up to 2**64)."""
    u = np.asarray(u, dtype=np.uint64)
    hi = (u >> _U64(32)).astype(np.float64)
    lo = (u & _U64(0xFFFFFFFF)).astype(np.float64)
    return np.where(hi > 0, 32 + np.frexp(hi)[1], np.frexp(lo)[1]).astype(np.int64)


def segment_index(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For segments of ``counts`` values laid back to back: (segment of each value, position of
    each value within its segment)."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    seg = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    return seg, np.arange(total, dtype=np.int64) - starts[seg]


def _aligned(values: np.ndarray, width: np.ndarray) -> np.ndarray:
    """Each value moved to the top of its uint64 (``width`` bits kept; 0 when width is 0)."""
    shift = np.where(width > 0, 64 - width, 0).astype(np.uint64)
    return np.where(width > 0, values << shift, _U64(0))


def pack_segments(values: np.ndarray, counts: np.ndarray, widths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pack segment s (``counts[s]`` values of ``values``, in order) at ``widths[s]`` bits each.

    Returns (bytes as a uint8 array, the byte length of each segment); segment s starts where
    the ones before it end. The caller guarantees each value fits its segment's width (0..64).
    """
    values = np.asarray(values, dtype=np.uint64)
    counts = np.asarray(counts, dtype=np.int64)
    widths = np.asarray(widths, dtype=np.int64)
    nbytes = (counts * widths + 7) // 8
    total = int(nbytes.sum())
    if total == 0:
        return np.zeros(0, dtype=np.uint8), nbytes
    seg, pos = segment_index(counts)
    w = widths[seg]
    keep = w > 0
    if not bool(keep.all()):
        seg, pos, w, values = seg[keep], pos[keep], w[keep], values[keep]
    bit = 8 * (np.cumsum(nbytes) - nbytes)[seg] + pos * w  # global bit offset of each value
    word = bit >> 6
    shift = (bit & 63).astype(np.uint64)
    top = _aligned(values, w)
    hi = top >> shift
    spill = shift > 0
    lo = np.where(spill, top << np.where(spill, _SIXTY_FOUR - shift, _U64(0)), _U64(0))
    out = np.zeros(total // 8 + 2, dtype=np.uint64)
    # ``word`` never decreases along the values: sum each run of equal words (bits do not overlap)
    for part, dest in ((hi, word), (lo, word + 1)):
        first = np.flatnonzero(np.concatenate(([True], dest[1:] != dest[:-1])))
        out[dest[first]] += np.add.reduceat(part, first)
    return out.astype(">u8").view(np.uint8)[:total], nbytes


def unpack_segments(buf: np.ndarray, starts: np.ndarray, counts: np.ndarray, widths: np.ndarray,
                    index: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Read segment s: ``counts[s]`` values of ``widths[s]`` bits from byte ``starts[s]`` of the
    uint8 array ``buf``. Returns every segment's values back to back (uint64). The caller checks
    that each segment lies inside ``buf``; ``index`` is segment_index(counts) when it has it."""
    counts = np.asarray(counts, dtype=np.int64)
    widths = np.asarray(widths, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.uint64)
    padded = np.zeros((len(buf) + 23) // 8 * 8, dtype=np.uint8)
    padded[: len(buf)] = buf
    words = padded.view(">u8").astype(np.uint64)
    seg, pos = segment_index(counts) if index is None else index
    w = widths[seg]
    bit = 8 * starts[seg] + pos * w
    word = bit >> 6
    shift = (bit & 63).astype(np.uint64)
    # the 64 bits from ``bit`` on; (x >> 1) >> (63 - shift) is x >> (64 - shift), and 0 when shift is 0
    top = (words[word] << shift) | ((words[word + 1] >> _U64(1)) >> (_U64(63) - shift))
    return (top >> ((64 - w) & 63).astype(np.uint64)) * (w > 0)


def pack_rows(values: np.ndarray, widths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`pack_segments` of each row of the k x n uint64 matrix ``values``, row i at
    ``widths[i]`` bits: every row the same count, so positions come from broadcasting instead
    of per-value segment arithmetic. Returns (bytes, the byte length of each row)."""
    values = np.asarray(values, dtype=np.uint64)
    k, n = values.shape
    widths = np.asarray(widths, dtype=np.int64)
    nbytes = (n * widths + 7) // 8
    if k == 0 or n == 0 or not bool(widths.any()):
        return np.zeros(0, dtype=np.uint8), nbytes
    per = n + 1  # words a row may touch: n values of at most 64 bits, plus one spill
    bit = np.arange(n, dtype=np.int64)[None, :] * widths[:, None]
    word = (bit >> 6) + (np.arange(k, dtype=np.int64) * per)[:, None]
    shift = (bit & 63).astype(np.uint64)
    w = widths[:, None]
    top = np.where(w > 0, values << np.where(w > 0, 64 - w, 0).astype(np.uint64), _U64(0))
    out = np.zeros(k * per + 1, dtype=np.uint64)
    hi = (top >> shift).ravel()
    spill = shift > 0
    lo = np.where(spill, top << np.where(spill, _SIXTY_FOUR - shift, _U64(0)), _U64(0)).ravel()
    word = word.ravel()
    first = np.flatnonzero(np.concatenate(([True], word[1:] != word[:-1])))
    dest = word[first]
    out[dest] += np.add.reduceat(hi, first)
    out[dest + 1] += np.add.reduceat(lo, first)
    raw = out[: k * per].astype(">u8").view(np.uint8).reshape(k, 8 * per)
    return raw[np.arange(8 * per)[None, :] < nbytes[:, None]], nbytes


def pack_into(words: np.ndarray, bit_start: np.ndarray, values: np.ndarray, widths: np.ndarray) -> None:
    """Add row i of the k x n uint64 matrix ``values``, ``widths[i]`` bits a value, MSB first, into
    the bit stream ``words`` (native uint64 words read as big-endian, bit 0 the top bit of word 0)
    from bit ``bit_start[i]``. Rows must lie in increasing, disjoint bit ranges of zero bits, and
    every row's width be at least 1; ``words`` needs a spare word past the last bit written."""
    values = np.asarray(values, dtype=np.uint64)
    k, n = values.shape
    if k == 0 or n == 0:
        return
    w = np.asarray(widths, dtype=np.int64)[:, None]
    bit = np.arange(n, dtype=np.int64)[None, :] * w
    bit += np.asarray(bit_start, dtype=np.int64)[:, None]
    word = (bit >> 6).ravel()
    shift = np.bitwise_and(bit, 63, out=bit).view(np.uint64)  # bit is not needed any more
    top = values << (64 - w).view(np.uint64)
    hi = (top >> shift).ravel()
    # the bits that spill into the next word: top << (64 - shift), done as two shifts so that a
    # shift of 0 spills nothing (a shift by 64 is undefined)
    top <<= _SIXTY_THREE - shift
    top <<= _U64(1)
    lo = top.ravel()
    brk = np.empty(len(word), dtype=bool)
    brk[0] = True
    np.not_equal(word[1:], word[:-1], out=brk[1:])
    first = np.flatnonzero(brk)
    dest = word[first]
    words[dest] += np.add.reduceat(hi, first)
    words[dest + 1] += np.add.reduceat(lo, first)
