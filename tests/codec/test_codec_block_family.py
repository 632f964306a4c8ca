"""The block encoder's chunk starts (metricsd/codec/blocks.py): the family a new chunk gets is the
smallest decimal scale every value of its block fits, else XOR, and a started chunk's header is
the documented fields (FORMAT.md, "Block chunks"), against plain per-row references. The encoder
screens scales by a block's first value and builds the headers of the started rows only, in
whole-matrix steps; these pin that the shortcuts answer as the plain definitions do."""

from __future__ import annotations

import struct

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.codec.blocks import MAX_SCALE, XOR_FAMILY, _choose_family, _chunk_headers

_EXACT = 2.0**52


def _fits(x: float, k: int) -> bool:
    """x == m / 10**k bit for bit for an int |m| < 2**52: the definition, one value at a time."""
    scaled = x * 10.0**k
    if not abs(scaled) < _EXACT:  # NaN and infinities too
        return False
    back = float(round(scaled)) / 10.0**k if k else float(round(scaled))
    return struct.pack("<d", back) == struct.pack("<d", x)


def _family(row: list[float]) -> int:
    return next((k for k in range(MAX_SCALE + 1) if all(_fits(x, k) for x in row)), XOR_FAMILY)


_SPECIAL = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 2.0**60, 1e-13, 0.1, 0.3, 123.456]


@st.composite
def _rows(draw: st.DrawFn) -> list[list[float]]:
    n = draw(st.integers(1, 6))
    rows = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["decimal", "first-fits", "noise", "special"]))
        scale = draw(st.integers(0, MAX_SCALE + 1))
        ints = draw(st.lists(st.integers(-(10**9), 10**9), min_size=n, max_size=n))
        row = [m / 10.0**scale for m in ints]
        if kind == "first-fits":  # a first value at a small scale, a later one finer: the screen must not decide
            row[-1] = row[-1] + 10.0 ** -(scale + 3)
        elif kind == "noise":
            row = [draw(st.floats(allow_nan=False, allow_infinity=False)) for _ in range(n)]
        elif kind == "special":
            row = [draw(st.sampled_from(_SPECIAL)) for _ in range(n)]
        rows.append(row)
    return rows


@settings(max_examples=300, deadline=None)
@given(_rows())
def test_the_family_is_the_smallest_scale_every_value_fits(rows: list[list[float]]) -> None:
    got = _choose_family(np.array(rows, dtype=np.float64)).tolist()
    assert got == [_family(row) for row in rows]


def _svarint(x: int) -> bytes:
    z = (x << 1) ^ (x >> 63)
    z &= 2**64 - 1
    out = bytearray()
    while True:
        if z < 0x80:
            out.append(z)
            return bytes(out)
        out.append(z & 0x7F | 0x80)
        z >>= 7


def _header(family: int, block: int, t1: int, t2: int, c1: int, e1: int) -> bytes:
    """FORMAT.md's chunk header: family, block size, t1 (8 bytes), svarint d1, then svarint m1 and
    svarint e1 (decimal) or the 8 bytes before (XOR)."""
    head = bytes([family, block]) + struct.pack("<q", t1) + _svarint(t1 - t2)
    if family <= MAX_SCALE:
        return head + _svarint(c1) + _svarint(e1)
    return head + struct.pack("<q", c1)


_I64 = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-300, 300))
_FAMILIES = st.sampled_from([*range(MAX_SCALE + 1), XOR_FAMILY])
_T = st.integers(-(2**40), 2**40)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), _FAMILIES, _T, _T, _I64, _I64), min_size=1, max_size=10),
       st.integers(1, 255))
def test_started_rows_get_the_documented_header_and_others_none(rows: list[tuple[bool, int, int, int, int, int]],
                                                                 block: int) -> None:
    started, family, t1, t2, c1, e1 = (np.array(c) for c in zip(*rows, strict=True))
    family, t1, t2, c1, e1 = (a.astype(np.int64) for a in (family, t1, t2, c1, e1))
    mat, lens = _chunk_headers(started.astype(bool), family, block, t1, t2, family <= MAX_SCALE, c1, e1)
    for i, (s, f, a, b, c, e) in enumerate(rows):
        want = _header(f, block, a, b, c, e) if s else b""
        assert int(lens[i]) == len(want)
        assert mat[i, : len(want)].tobytes() == want
