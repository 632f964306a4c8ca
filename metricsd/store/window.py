"""Per-series reduction over a time window, vectorised over series. Pure: no I/O, no clock.

Input is a padded matrix: row i holds ``count[i]`` samples at columns [0, count[i]) in time
order (the head's own layout, or chunks decoded and padded). For each evaluation time t the
window is (t - window, t], open on the left as in PromQL. Stale markers are not samples for
these functions; for ``last`` a stale marker as the newest sample means the series has ended.

``rate``/``increase`` follow Prometheus' extrapolatedRate (promql/functions.go): counter resets
add the value before the drop; the result is extrapolated to the window's edges when the first
or last sample lies within 1.1 average intervals of them (else by half an interval), and not
past the counter's zero point.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from metricsd.model import STALE_NAN_BITS

__all__ = ["SeriesFn", "reduce_windows"]


class SeriesFn(IntEnum):
    """Values equal the proto's SeriesFn enum."""

    AVG = 1
    MIN = 2
    MAX = 3
    LAST = 4
    SUM = 5
    COUNT = 6
    RATE = 7
    INCREASE = 8


def reduce_windows(
    ts: np.ndarray, vals: np.ndarray, count: np.ndarray, times: np.ndarray, window_ms: int, fn: SeriesFn
) -> tuple[np.ndarray, np.ndarray]:
    """Reduce every row over (t - window_ms, t] for each t in ``times``.

    Returns ``(values, samples)``, both shaped (rows, len(times)): the reduced value (NaN where
    the series has no value at t) and the number of samples it came from (0 where none).
    """
    n_rows, n_cols = ts.shape
    n_times = len(times)
    out = np.full((n_rows, n_times), np.nan)
    nsamp = np.zeros((n_rows, n_times), dtype=np.uint32)
    if n_rows == 0 or n_cols == 0 or n_times == 0:
        return out, nsamp
    valid = np.arange(n_cols)[None, :] < np.asarray(count)[:, None]
    stale = vals.view(np.uint64) == np.uint64(STALE_NAN_BITS)
    live = valid & ~stale
    rows = np.arange(n_rows)
    for j, t in enumerate(np.asarray(times, dtype=np.int64).tolist()):
        inwin = (ts > t - window_ms) & (ts <= t)
        if fn is SeriesFn.LAST:
            m = inwin & valid
            has = m.any(axis=1)
            idx = n_cols - 1 - np.argmax(m[:, ::-1], axis=1)
            ok = has & ~stale[rows, idx]
            out[ok, j] = vals[ok, idx[ok]]
            nsamp[ok, j] = 1
            continue
        m = inwin & live
        n = m.sum(axis=1)
        has = n > 0
        if fn is SeriesFn.COUNT:
            out[has, j] = n[has]
        elif fn in (SeriesFn.SUM, SeriesFn.AVG):
            s = np.where(m, vals, 0.0).sum(axis=1)
            out[has, j] = s[has] if fn is SeriesFn.SUM else s[has] / n[has]
        elif fn in (SeriesFn.MIN, SeriesFn.MAX):
            out[has, j] = _min_max(vals, m, has, fn is SeriesFn.MIN)
        else:
            has = n >= 2
            out[has, j] = _extrapolated(ts, vals, m, n, has, t, window_ms, fn is SeriesFn.RATE)
        nsamp[has, j] = n[has]
    return out, nsamp


def _min_max(vals: np.ndarray, m: np.ndarray, has: np.ndarray, is_min: bool) -> np.ndarray:
    """min/max_over_time: NaN samples are skipped unless every sample is NaN (as Prometheus)."""
    v = vals[has]
    mm = m[has]
    num = mm & ~np.isnan(v)
    fill = np.inf if is_min else -np.inf
    red = np.where(num, v, fill)
    res = red.min(axis=1) if is_min else red.max(axis=1)
    res[~num.any(axis=1)] = np.nan
    return res


def _extrapolated(
    ts: np.ndarray,
    vals: np.ndarray,
    m: np.ndarray,
    n: np.ndarray,
    has: np.ndarray,
    t: int,
    window_ms: int,
    is_rate: bool,
) -> np.ndarray:
    """Prometheus' extrapolatedRate for counters, for the rows in ``has`` (>= 2 samples)."""
    mt, v, tt, nn = m[has], vals[has], ts[has], n[has]
    n_cols = mt.shape[1]
    first_i = np.argmax(mt, axis=1)
    last_i = n_cols - 1 - np.argmax(mt[:, ::-1], axis=1)
    r = np.arange(len(mt))
    first_v, last_v = v[r, first_i], v[r, last_i]
    first_t, last_t = tt[r, first_i], tt[r, last_i]
    # Counter resets: a drop between consecutive in-window samples adds the value before it.
    # In-window samples are contiguous apart from skipped stale markers, so compare each sample
    # with the previous in-window one by carrying the last value forward.
    prev = _prev_in_mask(v, mt)
    drops = mt & ~np.isnan(prev) & (v < prev)
    correction = np.where(drops, prev, 0.0).sum(axis=1)
    result = last_v - first_v + correction
    range_start = t - window_ms
    dur_start = (first_t - range_start) / 1000.0
    dur_end = (t - last_t) / 1000.0
    sampled = (last_t - first_t) / 1000.0
    avg_step = sampled / (nn - 1)
    threshold = avg_step * 1.1
    dur_start = np.where(dur_start >= threshold, avg_step / 2, dur_start)
    with np.errstate(divide="ignore", invalid="ignore"):
        to_zero = sampled * (first_v / result)
    use_zero = (result > 0) & (first_v >= 0) & (to_zero < dur_start)
    dur_start = np.where(use_zero, to_zero, dur_start)
    dur_end = np.where(dur_end >= threshold, avg_step / 2, dur_end)
    factor = (sampled + dur_start + dur_end) / sampled
    if is_rate:
        factor = factor / (window_ms / 1000.0)
    return result * factor


def _prev_in_mask(v: np.ndarray, m: np.ndarray) -> np.ndarray:
    """For each masked position, the value at the previous masked position in its row (else NaN)."""
    n_rows, n_cols = v.shape
    idx = np.where(m, np.arange(n_cols)[None, :], -1)
    last_seen = np.maximum.accumulate(idx, axis=1)
    prev_idx = np.empty_like(last_seen)
    prev_idx[:, 0] = -1
    prev_idx[:, 1:] = last_seen[:, :-1]
    rows = np.arange(n_rows)[:, None]
    prev = v[rows, np.maximum(prev_idx, 0)]
    return np.where(prev_idx >= 0, prev, np.nan)
