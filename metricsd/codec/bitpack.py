"""Vectorised primitives shared by the encodings: fixed-width bit packing, frame of reference,
presence bitmaps and the varints of per-chunk scalars (FORMAT.md, "Primitives").

Per-sample work is NumPy only; Python code here runs a fixed number of times per chunk. All
integer sequences are handled as uint64 so that arithmetic wraps modulo 2**64: a delta or a
residual that overflows int64 still round-trips exactly. Readers take a buffer and a position
and return the new position; every one raises ``CorruptChunk`` when the bytes run short.
"""

from __future__ import annotations

import numpy as np

from metricsd.codec.errors import CorruptChunk

MASK64 = (1 << 64) - 1
_BE64 = np.dtype(">u8")


def _weights(width: int) -> np.ndarray:
    w = np.left_shift(np.uint64(1), np.arange(width - 1, -1, -1, dtype=np.uint64))
    w.flags.writeable = False
    return w


_WEIGHTS = tuple(_weights(w) for w in range(33))  # constants: 2**(width-1) .. 2**0


def zigzag(x: int) -> int:
    """Map an int64 (as a Python int) to a uint64 with small magnitudes first."""
    return ((x << 1) ^ (x >> 63)) & MASK64


def unzigzag(u: int) -> int:
    return (u >> 1) ^ -(u & 1)


def to_int64(u: int) -> int:
    """Interpret the low 64 bits of ``u`` as a signed int64."""
    u &= MASK64
    return u - (1 << 64) if u >> 63 else u


def put_uvarint(out: bytearray, u: int) -> None:
    """LEB128: 7 bits per byte, low group first, high bit set on all but the last byte."""
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)


def put_varint(out: bytearray, x: int) -> None:
    """A signed int64 as a zigzag LEB128 varint."""
    put_uvarint(out, zigzag(x))


def get_uvarint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Read a LEB128 varint of at most 10 bytes (one uint64); raise CorruptChunk otherwise."""
    result = 0
    shift = 0
    end = len(buf)
    while True:
        if pos >= end or shift > 63:
            raise CorruptChunk("varint runs past the chunk or over 64 bits")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
    if result > MASK64:
        raise CorruptChunk("varint over 64 bits")
    return result, pos


def get_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    u, pos = get_uvarint(buf, pos)
    return unzigzag(u), pos


def get_u8(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    if pos >= len(buf):
        raise CorruptChunk("chunk truncated")
    return buf[pos], pos + 1


def packed_size(count: int, width: int) -> int:
    return (count * width + 7) // 8


def _lane(width: int) -> int:
    """Bytes of the smallest power-of-two integer holding ``width`` bits."""
    return 1 if width <= 8 else 2 if width <= 16 else 4 if width <= 32 else 8


def pack(x: np.ndarray, width: int) -> bytes:
    """The low ``width`` bits of each uint64 in ``x``, MSB first, concatenated, zero-padded to a byte.

    The caller guarantees every value fits in ``width`` bits (0..64).
    """
    if width == 0 or x.size == 0:
        return b""
    lane = _lane(width)
    be = x.astype(f">u{lane}")
    if width == 8 * lane:  # fast path: whole bytes
        return be.tobytes()
    bits = np.unpackbits(be.view(np.uint8)).reshape(-1, 8 * lane)
    return np.packbits(np.ascontiguousarray(bits[:, 8 * lane - width :])).tobytes()


def unpack(buf: bytes | bytearray | memoryview, pos: int, count: int, width: int) -> tuple[np.ndarray, int]:
    """Read ``count`` values of ``width`` bits written by ``pack``; returns (uint64 array, new pos)."""
    if not 0 <= width <= 64:
        raise CorruptChunk(f"bit width {width} over 64")
    nbytes = packed_size(count, width)
    if pos + nbytes > len(buf):
        raise CorruptChunk("packed values run past the chunk")
    if width == 0 or count == 0:
        return np.zeros(count, np.uint64), pos
    raw = np.frombuffer(buf, np.uint8, nbytes, pos)
    lane = _lane(width)
    if width == 8 * lane:  # fast path: whole bytes
        return raw.view(f">u{lane}").astype(np.uint64), pos + nbytes
    bits = np.unpackbits(raw, count=count * width).reshape(count, width)
    if width <= 32:  # a matrix product with the bit weights beats re-packing for narrow values
        return bits @ _WEIGHTS[width], pos + nbytes
    full = np.zeros((count, 8 * lane), np.uint8)
    full[:, 8 * lane - width :] = bits
    return np.packbits(full, axis=1).view(f">u{lane}").ravel().astype(np.uint64), pos + nbytes


def bounds(x: np.ndarray) -> tuple[int, int]:
    """(min, max) of a uint64 sequence read as int64; (0, 0) when empty."""
    if x.size == 0:
        return 0, 0
    s = x.view(np.int64)
    # ufunc.reduce: cheaper than ndarray.min on short arrays
    return int(np.minimum.reduce(s)), int(np.maximum.reduce(s))


def frame(x: np.ndarray) -> tuple[int, int]:
    """Frame of reference of a uint64 sequence read as int64: (min as int64, bits of max - min)."""
    lo, hi = bounds(x)
    return lo, (hi - lo).bit_length()


def common_divisor(y: np.ndarray) -> int:
    """Greatest common divisor of non-negative offsets (1 when all are zero or there are none)."""
    if y.size == 0:
        return 1
    g = int(np.gcd.reduce(y))
    return g if g > 1 else 1


def put_bitmap(mask: np.ndarray) -> bytes:
    """One bit per position, MSB first, set where ``mask`` is true."""
    return np.packbits(mask).tobytes()


def get_bitmap(buf: bytes | bytearray | memoryview, pos: int, count: int) -> tuple[np.ndarray, int]:
    nbytes = (count + 7) // 8
    if pos + nbytes > len(buf):
        raise CorruptChunk("bitmap runs past the chunk")
    raw = np.frombuffer(buf, np.uint8, nbytes, pos)
    return np.unpackbits(raw, count=count).astype(bool), pos + nbytes
