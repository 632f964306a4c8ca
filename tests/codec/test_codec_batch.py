"""encode_chunks (a burst of seals) is byte for byte encode_chunk of each row."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_codec_roundtrip import SPECIAL_BITS, timestamps, value_bits

from metricsd.codec import encode_chunk, encode_chunks
from metricsd.codec.chunk import HEADER_SIZE
from metricsd.codec.values import decimal_scale, decimal_scales


@st.composite
def blocks(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """k rows of n samples: each row's timestamps and values of any shape the codec knows."""
    n = draw(st.integers(1, 130))
    k = draw(st.integers(1, 6))
    t_rows, v_rows = [], []
    for _ in range(k):
        t = draw(timestamps())
        while t.size < n:
            t = draw(timestamps())
        t_rows.append(t[:n])
        v_rows.append(draw(value_bits(n)).view(np.float64))
    return np.stack(t_rows), np.stack(v_rows)


@given(blocks())
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
def test_a_block_encodes_as_its_rows_do(block: tuple[np.ndarray, np.ndarray]) -> None:
    t, v = block
    assert encode_chunks(t, v) == [encode_chunk(t[i], v[i]) for i in range(len(t))]


def test_regular_constant_rows_take_the_fast_path_and_others_not() -> None:
    n = 120
    t = 1_700_000_000_000 + 10_000 * np.arange(n, dtype=np.int64)
    rows_t = np.stack([t, t, t + np.r_[0, np.zeros(n - 2, np.int64), 3], t])
    rows_v = np.stack([np.full(n, 0.25), np.arange(n, dtype=np.float64), np.full(n, 0.25),
                       np.full(n, np.uint64(SPECIAL_BITS[0])).view(np.float64)])
    got = encode_chunks(rows_t, rows_v)
    assert got == [encode_chunk(rows_t[i], rows_v[i]) for i in range(4)]
    assert len(got[0]) == HEADER_SIZE + 8 + 4 and got[0][0] == 0x11  # header, one value, CRC; REGULAR | CONST


def test_bad_rows_raise_as_encode_chunk_does() -> None:
    t = np.stack([np.arange(5, dtype=np.int64), np.array([0, 1, 1, 2, 3], np.int64)])
    with pytest.raises(ValueError, match="strictly increasing"):
        encode_chunks(t, np.zeros((2, 5)))
    with pytest.raises(ValueError, match="two-dimensional"):
        encode_chunks(np.arange(5), np.zeros(5))
    assert encode_chunks(np.zeros((0, 5), np.int64), np.zeros((0, 5))) == []


@given(blocks())
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
def test_decimal_scales_of_a_block_are_those_of_its_rows(block: tuple[np.ndarray, np.ndarray]) -> None:
    _, v = block
    for got, row in zip(decimal_scales(v), v, strict=True):
        want = decimal_scale(row)
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert got[0] == want[0] and got[1].tolist() == want[1].tolist()
