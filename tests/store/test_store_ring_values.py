"""The head's ring values: int32 decimal offsets where exact, float64 (wide rows) where not.

Every value read back must have the bits written (NaN payloads such as the stale marker, -0.0,
infinities, any float), whatever the order of the writes and whichever encoding a row is in.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.store.head import Head
from metricsd.store.ringvalues import POW10, choose, decode, encode

STALE = np.array([0x7FF0000000000002], np.uint64).view(np.float64)[0]
ODD = [STALE, np.nan, -0.0, 0.0, np.inf, -np.inf, 1e300, 5e-324, 0.1 + 0.2, 2.0**53 + 2, -(2.0**60)]


def _bits(x: np.ndarray) -> list[int]:
    return np.asarray(x, np.float64).view(np.uint64).tolist()


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(ODD), min_size=1, max_size=40),
       st.integers(0, 12), st.integers(-(2**40), 2**40))
def test_encode_is_exact_where_it_says_so(vals: list[float], scale: int, ref: int) -> None:
    v = np.array(vals, np.float64)
    ok, mant = encode(v, np.full(len(v), POW10[scale]), np.full(len(v), float(ref)))
    assert bool(((mant[ok] >= -(2**31)) & (mant[ok] < 2**31) & (mant[ok] == np.rint(mant[ok]))).all())
    back = decode(mant[ok].astype(np.int32), np.full(int(ok.sum()), POW10[scale]), np.full(int(ok.sum()), float(ref)))
    assert _bits(back) == _bits(v[ok])


def test_odd_values_are_not_narrow_and_decimals_are() -> None:
    v = np.array([[STALE, 1.0], [-0.0, 1.0], [np.nan, 2.0], [0.25, 1.5], [18891.538192, 18892.91153],
                  [2.27e9, 2.39e9]])
    unit, ref, mant = choose(v, np.ones(v.shape, bool))
    assert np.isnan(unit[:3]).all() and unit[3:].tolist() == [100.0, 1e6, 1.0]
    narrow = ~np.isnan(unit)
    assert _bits(decode(mant[narrow], unit[narrow][:, None], ref[narrow][:, None])) == _bits(v[narrow])


def _value(kind: int, i: int, draw: np.random.Generator) -> float:
    if kind == 0:  # a counter in seconds with microseconds that runs past 2^31 microseconds
        return round(1e6 + 700.0 * i + float(draw.integers(0, 1_000_000)) / 1e6, 6)
    if kind == 1:  # bytes
        return float(draw.integers(0, 2**40))
    if kind == 2:  # a gauge with one decimal, sometimes negative
        return round(float(draw.normal(0, 100)), 1)
    if kind == 3:  # anything, now and then
        return float(ODD[int(draw.integers(0, len(ODD)))]) if draw.random() < 0.3 else round(float(draw.random()), 3)
    return float(draw.random()) * 10.0 ** float(draw.integers(-5, 5))  # any float


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 3, 8, 32]))
def test_the_ring_gives_back_the_bits_written(seed: int, capacity: int) -> None:
    rng = np.random.default_rng(seed)
    rows = 6
    head = Head(capacity, rows)
    kinds = rng.integers(0, 5, rows)
    written: list[list[tuple[int, float]]] = [[] for _ in range(rows)]
    t = np.full(rows, 1_000_000, np.int64)
    step = 0
    for _ in range(int(rng.integers(1, 25))):
        which = np.sort(rng.choice(rows, int(rng.integers(1, rows + 1)), replace=False))
        counts = rng.integers(1, 2 * capacity + 2, len(which)) if rng.random() < 0.5 else np.ones(len(which), np.int64)
        ts, vals = [], []
        for r, c in zip(which.tolist(), counts.tolist(), strict=True):
            for _ in range(c):
                t[r] += int(rng.integers(1, 20_000))
                step += 1
                v = _value(int(kinds[r]) if rng.random() < 0.9 else 3, step, rng)
                ts.append(int(t[r]))
                vals.append(v)
                written[r].append((int(t[r]), v))
        ts_a, vals_a = np.array(ts, np.int64), np.array(vals, np.float64)
        starts = np.cumsum(counts) - counts
        assert bool(head.fit(which, counts, starts, ts_a).all())
        head.write(which, counts, starts, ts_a, vals_a)
        if rng.random() < 0.1:  # emptied now and then (a slow-path series), or replaced (a merge)
            r = int(rng.integers(0, rows))
            if rng.random() < 0.5:
                head.clear(r)
                written[r] = []
            else:
                keep = written[r][-capacity:]
                head.replace_row(r, np.array([a for a, _ in keep], np.int64), np.array([b for _, b in keep]), 0)
        head._check(rows)
        for r in range(rows):
            want = written[r][-capacity:]
            got_t, got_v = head.samples(r)
            assert got_t.tolist() == [a for a, _ in want]
            assert _bits(got_v) == _bits(np.array([b for _, b in want], np.float64))
        every = np.arange(rows)
        _, nv, cnt = head.newest(every, capacity)
        for r in range(rows):
            want = written[r][-capacity:]
            assert _bits(nv[r, : int(cnt[r])]) == _bits(np.array([b for _, b in want], np.float64))
    assert head.wide_rows == int(np.isnan(head.unit[:rows]).sum())


def test_a_row_is_narrow_again_once_its_ring_is_emptied() -> None:
    head = Head(4, 2)
    rows, one, zero = np.array([0]), np.array([1]), np.array([0])
    head.write(rows, one, zero, np.array([10]), np.array([STALE]))
    assert np.isnan(head.unit[0]) and head.wide_rows == 1
    head.write(rows, np.array([4]), zero, np.array([11, 12, 13, 14]), np.array([1.5, 2.5, 3.5, 4.5]))
    assert head.wide_rows == 1 and head.samples(0)[1].tolist() == [1.5, 2.5, 3.5, 4.5]
    head.clear(0)
    assert head.wide_rows == 0
    head.write(rows, np.array([2]), zero, np.array([15, 16]), np.array([0.25, 7.0]))
    assert head.unit[0] == 100.0 and head.wide_rows == 0
    assert head.samples(0)[1].tolist() == [0.25, 7.0]


def test_a_nan_written_to_a_wide_row_stays_in_its_wide_values() -> None:
    # a wide row's unit is NaN, and a quiet NaN divided by it decodes to its own bits: the write
    # must still put it with the row's float64 values
    head = Head(4, 2)
    rows, one, zero = np.array([0]), np.array([1]), np.array([0])
    for t, v in ((10, STALE), (11, np.nan), (12, 2.5)):
        head.write(rows, one, zero, np.array([t]), np.array([v]))
    assert _bits(head.samples(0)[1]) == _bits(np.array([STALE, np.nan, 2.5]))
