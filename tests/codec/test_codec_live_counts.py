"""live_counts: non-stale samples per chunk from headers, checked against decoding every chunk."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from metricsd.codec import decode_chunk, encode_chunk, live_counts
from metricsd.model import STALE_NAN_BITS

STALE = np.array([STALE_NAN_BITS], dtype=np.uint64).view(np.float64)[0]


@st.composite
def chunks(draw: st.DrawFn) -> bytes:
    n = draw(st.integers(1, 40))
    ts = np.cumsum(np.array(draw(st.lists(st.integers(1, 5000), min_size=n, max_size=n)), dtype=np.int64))
    kind = draw(st.sampled_from(["const", "stale_const", "decimal", "float", "with_stale", "nan"]))
    if kind == "const":
        v = np.full(n, 0.25)
    elif kind == "stale_const":
        v = np.full(n, STALE)
    elif kind == "decimal":
        v = np.array(draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n)), dtype=np.float64) / 1000
    else:
        v = np.array(draw(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=n, max_size=n)))
        if kind == "with_stale":
            v[draw(st.integers(0, n - 1))] = STALE
        elif kind == "nan":
            v[draw(st.integers(0, n - 1))] = np.nan
    return encode_chunk(ts, v)


@given(st.lists(chunks(), min_size=1, max_size=8))
def test_known_counts_equal_decoded(parts: list[bytes]) -> None:
    buf = np.frombuffer(b"".join(parts), dtype=np.uint8)
    ends = np.cumsum([len(p) for p in parts])
    got = live_counts(buf, ends - np.array([len(p) for p in parts]), ends)
    for c, p in zip(got.tolist(), parts, strict=True):
        _, v = decode_chunk(p)
        want = int(np.count_nonzero(v.view(np.uint64) != np.uint64(STALE_NAN_BITS)))
        assert c in (-1, want)


def test_const_and_decimal_are_known() -> None:
    ts = np.arange(10, dtype=np.int64) * 1000
    xor = np.where(np.arange(10) == 4, STALE, 1.5 ** np.arange(10))
    parts = [encode_chunk(ts, np.full(10, 3.0)), encode_chunk(ts, np.full(10, STALE)),
             encode_chunk(ts, np.arange(10) / 100), encode_chunk(ts, xor)]
    buf = np.frombuffer(b"".join(parts), dtype=np.uint8)
    ends = np.cumsum([len(p) for p in parts])
    assert live_counts(buf, ends - np.array([len(p) for p in parts]), ends).tolist() == [10, 0, 10, -1]
