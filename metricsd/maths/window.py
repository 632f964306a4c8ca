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

__all__ = ["SeriesFn", "reduce_ranges", "reduce_windows"]


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
    if n_times > 1:
        ranged = reduce_ranges(ts, vals, np.asarray(count), np.asarray(times, dtype=np.int64), window_ms, fn)
        if ranged is not None:
            return ranged
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


def _compact(ts: np.ndarray, vals: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Drop the entries not in ``keep`` from each row, left-aligned: (ts, vals, count)."""
    new_count = keep.sum(axis=1)
    width = max(1, int(new_count.max()) if len(new_count) else 1)
    r, c = np.nonzero(keep)
    pos = (np.cumsum(keep, axis=1) - 1)[r, c]
    out_t = np.zeros((len(ts), width), dtype=np.int64)
    out_v = np.zeros((len(ts), width))
    out_t[r, pos] = ts[r, c]
    out_v[r, pos] = vals[r, c]
    return out_t, out_v, new_count


def _pairs(ufunc: np.ufunc, x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """ufunc over x[lo:hi] for many (lo, hi) pairs at once (flat indices; result undefined if lo >= hi)."""
    xs = np.append(x, 0.0)  # hi may be len(x)
    idx = np.empty(2 * lo.size, dtype=np.int64)
    idx[0::2] = lo.ravel()
    idx[1::2] = hi.ravel()
    return ufunc.reduceat(xs, idx)[0::2].reshape(lo.shape)


def reduce_ranges(
    ts: np.ndarray, vals: np.ndarray, count: np.ndarray, times: np.ndarray, window_ms: int, fn: SeriesFn
) -> tuple[np.ndarray, np.ndarray] | None:
    """reduce_windows for many evaluation times at once (range queries); None if it does not apply.

    Each row's window bounds at every time come from one searchsorted over all rows' keys
    (row * span + time offset, increasing across the flattened matrix); sums, minima and maxima
    of each window are then ``reduceat`` over those bounds, exact like a loop, with no prefix-sum
    cancellation. Costs O(rows x times x log) plus the samples covered, not rows x columns per time.
    """
    n_rows, n_cols = ts.shape
    n_times = len(times)
    valid = np.arange(n_cols)[None, :] < count[:, None]
    stale = vals.view(np.uint64) == np.uint64(STALE_NAN_BITS)
    if fn is not SeriesFn.LAST and bool((stale & valid).any()):
        ts, vals, count = _compact(ts, vals, valid & ~stale)
        n_cols = ts.shape[1]
        valid = np.arange(n_cols)[None, :] < count[:, None]
        stale = np.zeros_like(valid)
    if not bool(valid.any()):
        return np.full((n_rows, n_times), np.nan), np.zeros((n_rows, n_times), dtype=np.uint32)
    base = min(int(ts[valid].min()), int(times.min()) - window_ms)
    top = max(int(ts[valid].max()), int(times.max()))
    span = top - base + 2
    if span * n_rows >= 2**62:
        return None  # keys would overflow: let the per-time path answer
    rows = np.arange(n_rows, dtype=np.int64)[:, None]
    keys = np.where(valid, ts - base, span - 1) + rows * span
    flat = keys.ravel()
    row_off = rows * n_cols
    hi = np.searchsorted(flat, rows * span + (times[None, :] - base), side="right") - row_off
    lo = np.searchsorted(flat, rows * span + (times[None, :] - window_ms - base), side="right") - row_off
    n = hi - lo
    out = np.full((n_rows, n_times), np.nan)
    nsamp = np.zeros((n_rows, n_times), dtype=np.uint32)
    flat_lo, flat_hi = lo + row_off, hi + row_off
    v = vals.ravel()
    has = n > 0
    if fn is SeriesFn.LAST:
        last_i = np.where(has, flat_hi - 1, 0)
        ok = has & ~stale.ravel()[last_i]
        out[ok] = v[last_i[ok]]
        nsamp[ok] = 1
        return out, nsamp
    if fn is SeriesFn.COUNT:
        out[has] = n[has]
    elif fn in (SeriesFn.SUM, SeriesFn.AVG):
        sums = _pairs(np.add, v, flat_lo, flat_hi)
        out[has] = sums[has] if fn is SeriesFn.SUM else sums[has] / n[has]
    elif fn in (SeriesFn.MIN, SeriesFn.MAX):
        red = _pairs(np.fmin if fn is SeriesFn.MIN else np.fmax, v, flat_lo, flat_hi)
        out[has] = red[has]
    else:
        has = n >= 2
        first_i, last_i = np.where(has, flat_lo, 0), np.where(has, flat_hi - 1, 0)
        t = ts.ravel()
        first_v, last_v = v[first_i], v[last_i]
        first_t, last_t = t[first_i], t[last_i]
        # a drop at flat position i (v[i] < v[i-1], same row) adds v[i-1]; pairs inside the window
        prev = np.empty_like(v)
        prev[0] = np.nan
        prev[1:] = v[:-1]
        prev[::n_cols] = np.nan  # no predecessor at the start of a row
        drops = np.where(v < prev, prev, 0.0)
        corr = _pairs(np.add, drops, np.minimum(flat_lo + 1, flat_hi), flat_hi)
        corr = np.where(n >= 2, corr, 0.0)
        result = last_v - first_v + corr
        sampled = (last_t - first_t) / 1000.0
        with np.errstate(divide="ignore", invalid="ignore"):
            avg_step = sampled / (n - 1)
            threshold = avg_step * 1.1
            dur_start = (first_t - (times[None, :] - window_ms)) / 1000.0
            dur_end = (times[None, :] - last_t) / 1000.0
            dur_start = np.where(dur_start >= threshold, avg_step / 2, dur_start)
            to_zero = sampled * (first_v / result)
            use_zero = (result > 0) & (first_v >= 0) & (to_zero < dur_start)
            dur_start = np.where(use_zero, to_zero, dur_start)
            dur_end = np.where(dur_end >= threshold, avg_step / 2, dur_end)
            factor = (sampled + dur_start + dur_end) / sampled
            if fn is SeriesFn.RATE:
                factor = factor / (window_ms / 1000.0)
            res = result * factor
        out[has] = res[has]
    nsamp[has] = n[has]
    return out, nsamp
