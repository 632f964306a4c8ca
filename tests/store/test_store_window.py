"""reduce_windows against a float loop over random series, NaNs, stale markers and resets."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import reduce_one

from metricsd.maths.window import SeriesFn, reduce_windows
from metricsd.model import stale_marker

FNS = {f.name.lower(): f for f in SeriesFn}


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


@st.composite
def series_sets(draw: st.DrawFn) -> list[tuple[list[int], list[float]]]:
    out = []
    for _ in range(draw(st.integers(1, 6))):
        n = draw(st.integers(0, 25))
        gaps = draw(st.lists(st.integers(1, 30_000), min_size=n, max_size=n))
        ts = list(np.cumsum(gaps).tolist())
        vals = []
        for _ in range(n):
            kind = draw(st.integers(0, 20))
            if kind == 0:
                vals.append(math.nan)
            elif kind == 1:
                vals.append(stale_marker())
            else:
                vals.append(float(draw(st.integers(0, 1000))))
        out.append((ts, vals))
    return out


@settings(max_examples=150, deadline=None)
@given(series_sets(), st.sampled_from(sorted(FNS)), st.integers(1_000, 200_000),
       st.lists(st.integers(0, 800_000), min_size=1, max_size=4))
def test_reduce_windows_matches_a_float_loop(series: list[tuple[list[int], list[float]]], fn: str, window: int,
                                              times: list[int]) -> None:
    width = max(1, max(len(t) for t, _ in series))
    ts = np.zeros((len(series), width), dtype=np.int64)
    vals = np.zeros((len(series), width))
    count = np.zeros(len(series), dtype=np.int64)
    for i, (t, v) in enumerate(series):
        ts[i, : len(t)] = t
        vals[i, : len(v)] = v
        count[i] = len(t)
    got_v, got_s = reduce_windows(ts, vals, count, np.array(times), window, FNS[fn])
    for i, (t, v) in enumerate(series):
        for j, at in enumerate(times):
            want_v, want_s = reduce_one(t, v, at, window, fn)
            assert int(got_s[i, j]) == want_s, (fn, i, at)
            if want_s:
                assert _close(float(got_v[i, j]), want_v), (fn, i, at, got_v[i, j], want_v)


def test_rate_of_a_steady_counter_is_its_slope() -> None:
    ts = np.arange(0, 120_000, 10_000, dtype=np.int64)[None, :]
    vals = (np.arange(12) * 5.0)[None, :]
    v, s = reduce_windows(ts, vals, np.array([12]), np.array([110_000]), 60_000, SeriesFn.RATE)
    assert v[0, 0] == pytest.approx(0.5)
    assert s[0, 0] == 6


def test_counter_reset_adds_the_value_before_the_drop() -> None:
    ts = np.array([[10_000, 20_000, 30_000, 40_000]])
    vals = np.array([[10.0, 20.0, 5.0, 15.0]])
    v, _ = reduce_windows(ts, vals, np.array([4]), np.array([40_000]), 40_000, SeriesFn.INCREASE)
    # raw increase 15 - 10 + 20 = 25 over 30 s sampled; extrapolated to the 40 s window edges
    # (start: 10 s gap >= 1.1 * 10 s? no, 10 < 11, so extend fully): 25 * 40 / 30
    assert v[0, 0] == pytest.approx(25 * 40 / 30)


def test_a_stale_marker_as_newest_sample_ends_last() -> None:
    ts = np.array([[10_000, 20_000]])
    vals = np.array([[1.0, stale_marker()]])
    v, s = reduce_windows(ts, vals, np.array([2]), np.array([25_000]), 300_000, SeriesFn.LAST)
    assert math.isnan(v[0, 0]) and s[0, 0] == 0


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("fn", list(SeriesFn))
def test_range_path_equals_the_per_time_path(seed: int, fn: SeriesFn) -> None:
    rng = np.random.default_rng(seed)
    n, c = 40, 60
    gaps = rng.integers(1, 20_000, size=(n, c))
    ts = np.cumsum(gaps, axis=1) - rng.integers(0, 300_000, size=(n, 1))
    vals = np.cumsum(rng.uniform(0, 5, size=(n, c)), axis=1)
    vals[rng.random((n, c)) < 0.05] = 0.0  # counter resets
    vals[rng.random((n, c)) < 0.03] = np.nan
    vals[rng.random((n, c)) < 0.03] = stale_marker()
    count = rng.integers(0, c + 1, size=n)
    times = np.sort(rng.integers(-100_000, 1_000_000, size=25))
    window = int(rng.integers(1_000, 200_000))
    got_v, got_s = reduce_windows(ts, vals, count, times, window, fn)
    for j, t in enumerate(times.tolist()):
        want_v, want_s = reduce_windows(ts, vals, count, np.array([t]), window, fn)
        np.testing.assert_array_equal(got_s[:, j], want_s[:, 0])
        np.testing.assert_allclose(got_v[:, j], want_v[:, 0], rtol=1e-9, atol=1e-9, equal_nan=True)
