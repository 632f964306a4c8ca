"""Value encodings (FORMAT.md, "Value section"): one type per encoding, one chooser.

Values are float64 of any bit pattern; every encoding is checked to be bit-exact on the
uint64 view. Shape checks run cheapest first, as VictoriaMetrics does: a constant chunk
(requests, limits, OOM counts) costs 8 bytes; a chunk of "decimal" floats (whole bytes, or
CPU seconds at microsecond resolution: v == m / 10**k exactly) becomes integers, then delta,
delta-of-delta or plain frame of reference, divided by their common divisor (4096 for page
multiples) and bit-packed. Any other floats are XOR'd with their predecessor as in Gorilla, and
either packed in one window for the chunk or byte-shuffled and lz4'd, whichever is smaller.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar, Protocol

import lz4.block
import numpy as np

from metricsd.codec import bitpack as bp
from metricsd.codec.errors import CorruptChunk

MAX_SCALE = 12  # largest k tried for v == m / 10**k
_MAX_EXACT = float(2**52)  # |m| below this converts to float64 exactly, with room for rounding
_POW10 = tuple(10.0**k for k in range(MAX_SCALE + 1))


class ValueCode(IntEnum):
    """Low nibble of the chunk's encoding byte (FORMAT.md)."""

    CONST = 1  # one float64 for every sample
    DECIMAL = 2  # v == m / 10**k for int |m| < 2**52, m as FOR / delta / delta-of-delta, packed
    XOR_PACK = 3  # Gorilla XOR with one leading/trailing-zero window for the whole chunk
    XOR_LZ4 = 4  # Gorilla XOR, bytes shuffled into 8 planes, lz4 block


class Transform(IntEnum):
    """How DECIMAL turns integers into small offsets."""

    FOR = 0  # m itself
    DELTA = 1  # m[0], then m[i] - m[i-1]
    DOD = 2  # m[0], m[1] - m[0], then deltas of deltas


class ValueEncoding(Protocol):
    code: ClassVar[ValueCode]

    @staticmethod
    def decode(buf: bytes | bytearray | memoryview, pos: int, end: int, n: int) -> np.ndarray:
        """Read the section spanning ``buf[pos:end]``; return the uint64 bit patterns."""
        ...


def _expect_end(pos: int, end: int) -> None:
    if pos != end:
        raise CorruptChunk("value section length does not match its encoding")


class Const:
    # FORMAT.md "1 CONST": uint64 bits
    code: ClassVar[ValueCode] = ValueCode.CONST

    @staticmethod
    def encode(bits: np.ndarray) -> bytes:
        return bits[:1].astype("<u8").tobytes()

    @staticmethod
    def decode(buf: bytes | bytearray | memoryview, pos: int, end: int, n: int) -> np.ndarray:
        _expect_end(pos + 8, end)
        return np.full(n, np.frombuffer(buf, "<u8", 1, pos)[0], np.uint64)


def _probe_scale(x: float) -> int:
    """The k for which x == m / 10**k with m the digits of repr(x), or -1 if over MAX_SCALE.

    Python's repr is the shortest decimal that reads back as x, so its digits after the point
    (less the exponent) give the smallest k that can work, in one call rather than a loop.
    """
    mantissa, _, exponent = repr(x).partition("e")
    _, _, fraction = mantissa.partition(".")
    k = (0 if fraction == "0" else len(fraction)) - int(exponent or 0)
    return max(k, 0) if k <= MAX_SCALE else -1


def decimal_scale(v: np.ndarray) -> tuple[int, np.ndarray] | None:
    """The smallest k with v == m / 10**k bit-exactly for int64 |m| < 2**52, and m; else None.

    A few samples are probed with scalar arithmetic first, so random floats are rejected
    without touching the whole chunk; the chosen k is then verified on every sample.
    """
    amax = float(np.maximum.reduce(np.abs(v)))
    if not amax < _MAX_EXACT:  # also rejects NaN and Inf
        return None
    n = v.size
    k = 0
    for i in (0, n // 2, n - 1):
        kp = _probe_scale(float(v[i]))
        if kp < 0:
            return None
        k = max(k, kp)
    bits = v.view(np.uint64)
    for kk in range(k, min(k + 3, MAX_SCALE + 1)):  # usually one pass: probes rarely all end in 0
        p = _POW10[kk]
        if amax * p >= _MAX_EXACT:
            return None
        m = np.rint(v * p).astype(np.int64) if kk else v.astype(np.int64)
        r = m.astype(np.float64)  # int -> float turns -0.0 into 0.0, as decoding does
        if kk:
            r /= p
        if not np.count_nonzero(r.view(np.uint64) != bits):
            return kk, m
    return None


class Decimal:
    # FORMAT.md "2 DECIMAL": u8 k | u8 transform | svarint heads | svarint base | varint mult | u8 width | packed
    code: ClassVar[ValueCode] = ValueCode.DECIMAL

    @staticmethod
    def encode(scale: int, m: np.ndarray) -> bytes:
        n = m.size
        if n < 3:
            tr, x = 0, m
            lo, width = bp.frame(x)
        else:
            # rows: m, its deltas, its deltas of deltas; each row padded at the front with a
            # copy of its first own element so one min and one max serve all three
            rows = np.empty((3, n), np.int64)
            rows[0] = m
            np.subtract(m[1:], m[:-1], out=rows[1, 1:])
            np.subtract(rows[1, 2:], rows[1, 1:-1], out=rows[2, 2:])
            rows[1, 0] = rows[1, 1]
            rows[2, :2] = rows[2, 2]
            los = np.minimum.reduce(rows, axis=1).tolist()
            his = np.maximum.reduce(rows, axis=1).tolist()
            costs = [(h - lo).bit_length() * (n - i) + 64 * i for i, (lo, h) in enumerate(zip(los, his, strict=True))]
            tr = costs.index(min(costs))
            x = rows[tr, tr:]
            lo = los[tr]
            width = (his[tr] - lo).bit_length()
        y = (x - lo).view(np.uint64)
        mult = bp.common_divisor(y) if width else 1
        if mult > 1:
            y = y // np.uint64(mult)
            width = int(np.maximum.reduce(y)).bit_length()
        out = bytearray((scale, tr))
        if tr:
            bp.put_varint(out, int(m[0]))
        if tr == Transform.DOD:
            bp.put_varint(out, int(m[1]) - int(m[0]))
        bp.put_varint(out, lo)
        bp.put_uvarint(out, mult)
        out.append(width)
        out += bp.pack(y, width)
        return bytes(out)

    @staticmethod
    def decode(buf: bytes | bytearray | memoryview, pos: int, end: int, n: int) -> np.ndarray:
        scale, pos = bp.get_u8(buf, pos)
        tr, pos = bp.get_u8(buf, pos)
        if scale > MAX_SCALE or tr > Transform.DOD:
            raise CorruptChunk(f"decimal scale {scale} or transform {tr} unknown")
        heads = []
        for _ in range(tr):
            h, pos = bp.get_varint(buf, pos)
            heads.append(h)
        if n < tr + (tr > 0):
            raise CorruptChunk("too few samples for the decimal transform")
        lo, pos = bp.get_varint(buf, pos)
        mult, pos = bp.get_uvarint(buf, pos)
        width, pos = bp.get_u8(buf, pos)
        y, pos = bp.unpack(buf, pos, n - tr, width)
        _expect_end(pos, end)
        m = np.empty(n, np.uint64)
        m[: len(heads)] = [h & bp.MASK64 for h in heads]
        m[tr:] = y * np.uint64(mult) + np.uint64(lo & bp.MASK64)
        for i in reversed(range(tr)):  # undo delta-of-delta, then delta (wraps mod 2**64)
            np.cumsum(m[i:], out=m[i:])
        f = m.view(np.int64).astype(np.float64)
        if scale:
            f /= _POW10[scale]
        return f.view(np.uint64)


class XorPack:
    # FORMAT.md "3 XOR_PACK": uint64 first | u8 trailing | u8 width | u8 sparse | [bitmap(n - 1)] | packed
    code: ClassVar[ValueCode] = ValueCode.XOR_PACK

    @staticmethod
    def plan(xr: np.ndarray) -> tuple[int, int, int, bool]:
        """(section size, trailing zeros, width, sparse) for the n - 1 XORs ``xr``."""
        orr = int(np.bitwise_or.reduce(xr))
        tz = (orr & -orr).bit_length() - 1 if orr else 0
        width = orr.bit_length() - tz
        k = int(np.count_nonzero(xr))
        dense = bp.packed_size(xr.size, width)
        sparse = (xr.size + 7) // 8 + bp.packed_size(k, width)
        return 11 + min(dense, sparse), tz, width, sparse < dense

    @staticmethod
    def encode(first: np.ndarray, xr: np.ndarray, tz: int, width: int, sparse: bool) -> bytes:
        out = bytearray(first.astype("<u8").tobytes())
        out += bytes((tz, width, sparse))
        if sparse:
            mask = xr != 0
            out += bp.put_bitmap(mask)
            xr = xr[mask]
        out += bp.pack(xr >> np.uint64(tz), width)
        return bytes(out)

    @staticmethod
    def decode(buf: bytes | bytearray | memoryview, pos: int, end: int, n: int) -> np.ndarray:
        if pos + 11 > end or n < 2:
            raise CorruptChunk("XOR section too short")
        first = np.frombuffer(buf, "<u8", 1, pos)[0]
        tz, width, sparse = buf[pos + 8], buf[pos + 9], buf[pos + 10]
        if tz + width > 64 or sparse > 1:
            raise CorruptChunk("XOR window over 64 bits")
        pos += 11
        x = np.empty(n, np.uint64)
        x[0] = first
        if sparse:
            mask, pos = bp.get_bitmap(buf, pos, n - 1)
            y, pos = bp.unpack(buf, pos, int(np.count_nonzero(mask)), width)
            x[1:] = 0
            x[1:][mask] = y << np.uint64(tz)
        else:
            y, pos = bp.unpack(buf, pos, n - 1, width)
            x[1:] = y << np.uint64(tz)
        _expect_end(pos, end)
        return np.bitwise_xor.accumulate(x)


class XorLz4:
    # FORMAT.md "4 XOR_LZ4": lz4 block of the n XORs' 8 byte planes, low byte plane first
    code: ClassVar[ValueCode] = ValueCode.XOR_LZ4

    @staticmethod
    def encode(x: np.ndarray) -> bytes:
        planes = x.astype("<u8").view(np.uint8).reshape(-1, 8).T.tobytes()
        return bytes(lz4.block.compress(planes, store_size=False))

    @staticmethod
    def decode(buf: bytes | bytearray | memoryview, pos: int, end: int, n: int) -> np.ndarray:
        try:
            raw = lz4.block.decompress(buf[pos:end], uncompressed_size=8 * n)
        except lz4.block.LZ4BlockError as e:
            raise CorruptChunk(f"lz4: {e}") from None
        if len(raw) != 8 * n:
            raise CorruptChunk("lz4 block decompresses to the wrong size")
        planes = np.frombuffer(raw, np.uint8).reshape(8, n)
        x = np.ascontiguousarray(planes.T).view("<u8").ravel()
        return np.bitwise_xor.accumulate(x.astype(np.uint64))


DECODERS: dict[int, type[ValueEncoding]] = {c.code: c for c in (Const, Decimal, XorPack, XorLz4)}


def encode_values(v: np.ndarray, decimal: bool = True) -> tuple[ValueCode, bytes]:
    """Pick the smallest section for float64 ``v``; cheap shape checks come first.

    ``decimal=False`` skips DECIMAL, only so that the benchmark can show what it buys.
    """
    bits = v.view(np.uint64)
    const = not np.count_nonzero(bits != bits[0])  # fast path: requests, limits, idle counters
    return choose_values(bits, const, decimal_scale(v) if decimal and not const else None)


def choose_values(bits: np.ndarray, const: bool, dec: tuple[int, np.ndarray] | None) -> tuple[ValueCode, bytes]:
    """The section for uint64 ``bits`` once the cheap tests are made: constant, or decimal with
    ``dec`` (decimal_scale's answer), or else the smaller XOR encoding. encode_values makes the
    tests for one chunk, codec.encode_chunks for a block of them."""
    if const:
        return ValueCode.CONST, Const.encode(bits)
    if dec is not None:
        return ValueCode.DECIMAL, Decimal.encode(*dec)
    return encode_xor(bits)


def decimal_scales(v: np.ndarray) -> list[tuple[int, np.ndarray] | None]:
    """decimal_scale of each row of 2-D ``v``, the same answer row by row: the probes stay
    scalar (three reprs a row), the verification of each candidate scale runs once per group
    of rows that probed alike."""
    k, n = v.shape
    out: list[tuple[int, np.ndarray] | None] = [None] * k
    if k == 0 or n == 0:
        return out
    amax = np.maximum.reduce(np.abs(v), axis=1)
    groups: dict[int, list[int]] = {}
    probes = (0, n // 2, n - 1)
    for i in np.flatnonzero(amax < _MAX_EXACT).tolist():  # also rejects NaN and Inf
        row = v[i]
        k0 = 0
        for j in probes:
            kp = _probe_scale(float(row[j]))
            if kp < 0:
                break
            k0 = max(k0, kp)
        else:
            groups.setdefault(k0, []).append(i)
    bits = v.view(np.uint64)
    for k0, members in groups.items():
        rows = np.array(members, dtype=np.int64)
        for kk in range(k0, min(k0 + 3, MAX_SCALE + 1)):
            p = _POW10[kk]
            rows = rows[amax[rows] * p < _MAX_EXACT]  # past it: None, as decimal_scale returns
            if len(rows) == 0:
                break
            sub = v[rows]
            m = np.rint(sub * p).astype(np.int64) if kk else sub.astype(np.int64)
            r = m.astype(np.float64)
            if kk:
                r /= p
            exact = (r.view(np.uint64) == bits[rows]).all(axis=1)
            for j in np.flatnonzero(exact).tolist():
                out[int(rows[j])] = (kk, m[j])
            rows = rows[~exact]
    return out


def encode_xor(bits: np.ndarray) -> tuple[ValueCode, bytes]:
    """The XOR encodings of uint64 ``bits`` (not constant, not decimal): the smaller of the two."""
    x = np.empty_like(bits)
    x[0] = bits[0]
    np.bitwise_xor(bits[1:], bits[:-1], out=x[1:])
    size, tz, width, sparse = XorPack.plan(x[1:])
    lz = XorLz4.encode(x)
    if len(lz) < size:
        return ValueCode.XOR_LZ4, lz
    return ValueCode.XOR_PACK, XorPack.encode(x[:1], x[1:], tz, width, sparse)
