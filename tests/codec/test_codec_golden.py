"""Pinned bytes for small chunks of every encoding: a change of format must show up here.

If a change is deliberate, regenerate the vectors and say so in FORMAT.md; chunks already in a
store's memory or snapshots are read with the old layout otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from metricsd.codec import decode_chunk, encode_chunk
from metricsd.codec.timestamps import TsCode
from metricsd.codec.values import ValueCode
from metricsd.model import STALE_NAN_BITS

T0 = 1_700_000_000_000
R8 = [T0 + 10_000 * i for i in range(8)]
SPECIAL = {"stale": STALE_NAN_BITS, "nan": 0x7FF8000000000000, "inf": 0x7FF0000000000000, "-inf": 0xFFF0000000000000}

Case = tuple[Sequence[int], Sequence[float | str], TsCode, ValueCode, str]

# name: (timestamps, values, timestamp encoding, value encoding, hex)
GOLDEN: dict[str, Case] = {
    "regular-const": (
        [0, 10_000, 20_000],
        [0.5] * 3,
        TsCode.REGULAR,
        ValueCode.CONST,
        "1103000000000000000000204e000000000000000000000000e03ffbc97a00",
    ),
    "one-stale-sample": (
        [-5],
        ["stale"],
        TsCode.REGULAR,
        ValueCode.CONST,
        "110100fbfffffffffffffffbffffffffffffff020000000000f07f12c0f1dd",
    ),
    "sparse-jitter-cpu-usec": (
        [T0, T0 + 10_000, T0 + 20_003, T0 + 30_000, T0 + 40_000, T0 + 50_000, T0 + 59_998, T0 + 70_000],
        [26183.140112, 26184.411171, 26185.71588, 26187.030838, 26188.333823, 26189.6, 26190.912345, 26192.2],
        TsCode.GRID_SPARSE,
        ValueCode.DECIMAL,
        "3208000068e5cf8b0100007079e6cf8b01000000030322a00601a08c988ac30182c89a01011013129684be8d8fc80000b45853e6a11c53f5",
    ),
    "dense-jitter-memory-pages": (
        [T0 + 1, T0 + 10_003, T0 + 20_000, T0 + 30_002, T0 + 40_004, T0 + 50_001, T0 + 60_000, T0 + 70_003],
        [4096.0 * p for p in (53_610, 53_500, 53_376, 53_645, 53_673, 53_600, 53_588, 53_700)],
        TsCode.GRID_DENSE,
        ValueCode.DECIMAL,
        "2208000168e5cf8b0100007379e6cf8b01000001032c284300008080c0d001802009751f0010d94b81a944baea8f8f",
    ),
    "regular-decimal-for": (
        R8,
        [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0],
        TsCode.REGULAR,
        ValueCode.DECIMAL,
        "1208000068e5cf8b0100007079e6cf8b0100000000020104203048156bee81ef",
    ),
    "regular-decimal-delta": (
        R8,
        [1e6 + 1000 * i + e for i, e in enumerate((0, 3, -2, 1, 0, -3, 2, 1))],
        TsCode.REGULAR,
        ValueCode.DECIMAL,
        "1208000068e5cf8b0100007079e6cf8b010000000180897ac60f02038223506430b663",
    ),
    "regular-decimal-dod": (
        R8,
        [1e6 * i * i + e for i, e in enumerate((0, 3, -2, 1, 0, -3, 2, 1))],
        TsCode.REGULAR,
        ValueCode.DECIMAL,
        "1208000068e5cf8b0100007079e6cf8b01000000020086897af091f4010204082381f6b9d924",
    ),
    "dod-xor-pack": (
        [0, 10_000, 20_000, 30_000, 130_000, 230_000, 330_000, 430_000],
        [1.0 / 3, 1.0 / 3, 1.0 / 3, 2.0 / 3, 2.0 / 3, 1.0 / 3, 1.0 / 3, 1.0 / 3],
        TsCode.DOD,
        ValueCode.XOR_PACK,
        "4308000000000000000000b08f060000000000a09c010011000000002bf200000000000000555555555555d53f3402000cc0a09d17c9",
    ),
    "regular-xor-pack-sparse": (
        [10_000 * i for i in range(24)],
        [1.0 / 3] * 12 + [2.0 / 3] * 6 + [1.0 / 3] * 6,
        TsCode.REGULAR,
        ValueCode.XOR_PACK,
        "13180000000000000000007082030000000000555555555555d53f340201001040f099a59527",
    ),
    "regular-xor-lz4-specials": (
        R8,
        ["stale", "nan", -0.0, "inf", "-inf", 5e-324, 1.0 / 3, 2.0**0.5],
        TsCode.REGULAR,
        ValueCode.XOR_LZ4,
        "1408000068e5cf8b0100007079e6cf8b01000091020200000001549800010021556e07003300552a08001333080013cb0800f002f5f008f8f000f0d5237f00ffff80ff3f0033504687",
    ),
}


def _inputs(case: Case) -> tuple[np.ndarray, np.ndarray]:
    t, v = case[0], case[1]
    bits = [SPECIAL[x] if isinstance(x, str) else int(np.float64(x).view(np.uint64)) for x in v]
    return np.array(t, np.int64), np.array(bits, np.uint64)


@pytest.mark.parametrize("name", list(GOLDEN))
def test_encoding_matches_the_pinned_bytes(name: str) -> None:
    t, bits = _inputs(GOLDEN[name])
    data = encode_chunk(t, bits.view(np.float64))
    assert data.hex() == GOLDEN[name][4]
    assert (TsCode(data[0] >> 4), ValueCode(data[0] & 15)) == GOLDEN[name][2:4]


@pytest.mark.parametrize("name", list(GOLDEN))
def test_pinned_bytes_decode_to_the_samples(name: str) -> None:
    t, bits = _inputs(GOLDEN[name])
    t2, v2 = decode_chunk(bytes.fromhex(GOLDEN[name][4]))
    np.testing.assert_array_equal(t2, t)
    np.testing.assert_array_equal(v2.view(np.uint64), bits)


def test_every_encoding_has_a_vector() -> None:
    assert {c[2] for c in GOLDEN.values()} == set(TsCode)
    assert {c[3] for c in GOLDEN.values()} == set(ValueCode)
