"""Round trips are bit-exact for any float64 bit pattern and any strictly increasing int64 times."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metricsd.codec import chunk_count, chunk_time_range, decode_chunk, encode_chunk
from metricsd.codec.timestamps import TsCode
from metricsd.codec.values import ValueCode
from metricsd.model import STALE_NAN_BITS

I64 = st.integers(-(2**63), 2**63 - 1)
U64 = st.integers(0, 2**64 - 1)
SPECIAL_BITS = [
    STALE_NAN_BITS,
    0x7FF8000000000000,  # quiet NaN
    0xFFF8000000000001,  # negative NaN with a payload
    0x8000000000000000,  # -0.0
    0x0000000000000001,  # smallest subnormal
    0x7FF0000000000000,  # +Inf
    0xFFF0000000000000,  # -Inf
    0x3FF0000000000000,  # 1.0
    0,
]


def _check(t: np.ndarray, bits: np.ndarray) -> bytes:
    v = bits.view(np.float64)
    data = encode_chunk(t, v)
    t2, v2 = decode_chunk(data)
    assert t2.dtype == np.int64 and v2.dtype == np.float64
    np.testing.assert_array_equal(t2, t)
    np.testing.assert_array_equal(v2.view(np.uint64), bits)
    assert chunk_count(data) == t.size
    assert chunk_time_range(data) == (int(t[0]), int(t[-1]))
    return data


@st.composite
def timestamps(draw: st.DrawFn) -> np.ndarray:
    shape = draw(st.sampled_from(["any", "regular", "jitter", "steps"]))
    if shape == "any":  # huge gaps, negative times, anywhere in int64
        return np.array(sorted(draw(st.lists(I64, min_size=1, max_size=100, unique=True))), np.int64)
    n = draw(st.integers(1, 200))
    start = draw(st.integers(-(2**50), 2**50))
    step = draw(st.integers(1, 100_000))
    t = start + np.arange(n, dtype=np.int64) * step
    if shape == "jitter" and step > 20:
        spread = draw(st.integers(1, min(step // 2 - 1, 50)))
        share = draw(st.sampled_from([0.05, 0.5, 1.0]))
        rng = np.random.default_rng(draw(st.integers(0, 2**32)))
        hit = rng.random(n) < share
        t[hit] += rng.integers(-spread, spread + 1, int(hit.sum()))
    elif shape == "steps":  # the interval changes mid-chunk
        t = np.cumsum(np.array(draw(st.lists(st.integers(1, 10**9), min_size=n, max_size=n)), np.int64))
    return t


@st.composite
def value_bits(draw: st.DrawFn, n: int) -> np.ndarray:
    shape = draw(st.sampled_from(["any", "special", "const", "int", "decimal", "counter"]))
    if shape == "any":
        return np.array(draw(st.lists(U64, min_size=n, max_size=n)), np.uint64)
    if shape == "special":
        pool = st.one_of(st.sampled_from(SPECIAL_BITS), U64)
        return np.array(draw(st.lists(pool, min_size=n, max_size=n)), np.uint64)
    if shape == "const":
        return np.full(n, draw(st.one_of(st.sampled_from(SPECIAL_BITS), U64)), np.uint64)
    ints = np.array(draw(st.lists(st.integers(-(2**53), 2**53), min_size=n, max_size=n)), np.int64)
    if shape == "int":
        return (ints.astype(np.float64) * draw(st.sampled_from([1.0, 4096.0, -1.0]))).view(np.uint64)
    if shape == "counter":
        rng = np.random.default_rng(draw(st.integers(0, 2**32)))
        ints = np.cumsum(rng.integers(0, draw(st.integers(1, 10**7)), n))
    k = draw(st.integers(1, 12))
    return (ints.astype(np.float64) / 10.0**k).view(np.uint64)


@given(st.data())
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_round_trip_is_bit_exact(data: st.DataObject) -> None:
    t = data.draw(timestamps())
    _check(t, data.draw(value_bits(t.size)))


@pytest.mark.slow
@given(st.data())
@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_round_trip_is_bit_exact_thoroughly(data: st.DataObject) -> None:
    t = data.draw(timestamps())
    _check(t, data.draw(value_bits(t.size)))


@given(st.lists(st.tuples(I64, U64), min_size=1, max_size=40, unique_by=lambda p: p[0]))
@settings(max_examples=100, deadline=None)
def test_round_trip_of_arbitrary_pairs(pairs: list[tuple[int, int]]) -> None:
    pairs.sort()
    _check(np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.uint64))


def test_the_extremes_of_int64_in_one_chunk() -> None:
    t = np.array([-(2**63), -1, 0, 2**63 - 1], np.int64)
    _check(t, np.array(SPECIAL_BITS[:4], np.uint64))


def test_one_sample() -> None:
    data = _check(np.array([-5], np.int64), np.array([STALE_NAN_BITS], np.uint64))
    assert chunk_time_range(data) == (-5, -5)


def test_the_largest_chunk() -> None:
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.integers(1, 20_000, 65535)).astype(np.int64)
    _check(t, rng.integers(0, 2**64, 65535, dtype=np.uint64))
    _check(np.arange(65535, dtype=np.int64) * 10_000, np.full(65535, 0x3FF0000000000000, np.uint64))


def _codes(t: np.ndarray, v: np.ndarray) -> tuple[TsCode, ValueCode]:
    enc = encode_chunk(t, v)[0]
    return TsCode(enc >> 4), ValueCode(enc & 15)


REGULAR = 1_700_000_000_000 + np.arange(120, dtype=np.int64) * 10_000


@pytest.mark.parametrize(
    ("t", "expected"),
    [
        (REGULAR, TsCode.REGULAR),
        (REGULAR + np.where(np.arange(120) % 10 == 3, 2, 0), TsCode.GRID_SPARSE),
        (REGULAR + np.arange(120) % 7, TsCode.GRID_DENSE),
        (np.concatenate([REGULAR[:60], REGULAR[59] + 15_000 * np.arange(1, 61)]), TsCode.DOD),
    ],
    ids=["regular", "occasional-jitter", "jitter-on-every-sample", "interval-changes"],
)
def test_each_timestamp_shape_gets_its_encoding(t: np.ndarray, expected: TsCode) -> None:
    v = np.full(t.size, 0.5)
    assert _codes(t, v)[0] == expected
    _check(t, v.view(np.uint64))


@pytest.mark.parametrize(
    ("v", "expected"),
    [
        (np.full(120, 0.5), ValueCode.CONST),
        (np.arange(120) * 4096.0 * 3 + 2**30, ValueCode.DECIMAL),
        (np.cumsum(np.arange(120) * 1_234_567 + 17) / 1e6, ValueCode.DECIMAL),
        (np.sin(np.arange(120) / 7.0), ValueCode.XOR_LZ4),
        (np.repeat(np.sqrt(np.arange(2.0, 14.0)), 10), ValueCode.XOR_PACK),
    ],
    ids=["constant", "bytes-in-pages", "cpu-seconds-in-usec", "arbitrary-floats", "steps-of-floats"],
)
def test_each_value_shape_gets_its_encoding(v: np.ndarray, expected: ValueCode) -> None:
    assert _codes(REGULAR, v)[1] == expected
    _check(REGULAR, v.view(np.uint64))


def test_realistic_shapes_fit_the_byte_budget() -> None:
    rng = np.random.default_rng(11)
    cpu = (26_000_000_000 + np.cumsum(rng.integers(400_000, 600_000, 120))) / 1e6
    mem = (50_000 + np.cumsum(rng.integers(-20, 21, 120))) * 4096.0
    assert len(encode_chunk(REGULAR, np.full(120, 0.25))) <= 32  # header, 8-byte value, CRC
    assert len(encode_chunk(REGULAR, cpu)) <= 23 + 20 + 120 * 18 // 8  # range 200k usec: 18 bits
    assert len(encode_chunk(REGULAR, mem)) <= 23 + 20 + 120 * 6 // 8  # +-20 pages: 6 bits
