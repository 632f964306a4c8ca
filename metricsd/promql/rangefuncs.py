"""Functions of a range vector: rate, irate, increase, delta, deriv and the ``*_over_time`` family.

Each takes a :class:`RangeArg` (windows for all steps) and returns a :class:`VectorBlock` of the
input series present at some step (a step is present when its window had enough samples): one
NumPy pass over every series' flat samples, no object per series. rate/increase/delta follow
Prometheus' extrapolation exactly (``extrapolatedRate`` in promql/functions.go).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from metricsd.promql.kahan import kahan_inc, kahan_mean, kahan_sum
from metricsd.promql.selectors import RangeArg
from metricsd.promql.values import VectorBlock

__all__ = ["EXTRAPOLATED", "RANGE_FUNCTIONS", "eval_range_function", "extrapolate", "quantile"]

# Below this magnitude a plain NumPy sum is as exact as Kahan's for any realistic window.
_FAST_SUM_LIMIT = 2.0**40


def _take(arr: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``arr[clip(idx, 0, arr.size - 1)]`` in one call (np.clip's Python wrapper cost more than the take)."""
    return arr.take(idx, mode="clip")


def _rows(arg: RangeArg, values: np.ndarray, ok: np.ndarray, *, drop_name: bool = True) -> VectorBlock:
    if ok.size and bool(ok.any(axis=1).all()):  # every series present at some step (a pod's panel): none to drop
        return VectorBlock(arg.data.labels, np.where(ok, values, np.nan), ok, drop_name=drop_name)
    keep = np.flatnonzero(ok.any(axis=1)) if ok.size else np.zeros(0, dtype=np.int64)
    ok = ok[keep]
    return VectorBlock(arg.data.labels.take(keep), np.where(ok, values[keep], np.nan), ok, drop_name=drop_name)


def _empty(arg: RangeArg) -> VectorBlock:
    n = len(arg.ends)
    return _rows(arg, np.zeros((0, n)), np.zeros((0, n), dtype=bool))


def extrapolated_rate(arg: RangeArg, *, is_counter: bool, is_rate: bool) -> VectorBlock:
    fw = arg.flat()
    if fw.ts.size == 0:
        return _empty(arg)
    starts = fw.offsets[:-1]
    result = extrapolate(fw.ts, fw.vals, starts[starts < fw.vals.size], fw.lo, fw.hi, arg.ends[None, :], arg.range_ms,
                         is_counter=is_counter, is_rate=is_rate)
    return _rows(arg, result, (fw.hi - fw.lo) >= 2)


def extrapolate(ts: np.ndarray, vals: np.ndarray, starts: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                ends: np.ndarray, range_ms: int, *, is_counter: bool, is_rate: bool) -> np.ndarray:
    """Prometheus' extrapolatedRate of every window: the samples ``ts``/``vals`` (series after
    series, each beginning at one of ``starts``, non-empty), window ``[lo, hi)`` of them ending at
    ``ends`` (lo, hi and ends broadcast: series x steps, or the steps of one series). A window of
    fewer than two samples gives a meaningless value, for the caller to mask. Element by element,
    so one series' answer is bit for bit its row of many series' (narrow.py's one-series path)."""
    n = hi - lo
    end = hi - 1
    first, last = _take(vals, lo), _take(vals, end)
    t_first, t_last = _take(ts, lo), _take(ts, end)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        result = last - first
        if is_counter:
            dropped = vals[1:] < vals[:-1]
            if dropped.any():  # a reset adds the value before it (not across series)
                resets = np.zeros(vals.size)
                resets[1:] = np.where(dropped, vals[:-1], 0.0)
                resets[starts] = 0.0
                if resets.any():
                    cum = np.cumsum(resets)
                    result = result + (_take(cum, end) - _take(cum, lo))
        sampled = (t_last - t_first) / 1000.0
        avg = sampled / np.maximum(n - 1, 1)
        threshold = avg * 1.1
        half = avg / 2
        d_start = (t_first - (ends - range_ms)) / 1000.0
        d_end = (ends - t_last) / 1000.0
        d_start = np.where(d_start >= threshold, half, d_start)
        if is_counter:
            d_zero = np.where((result > 0) & (first >= 0), sampled * (first / result), d_start)
            d_start = np.where(d_zero < d_start, d_zero, d_start)
        d_end = np.where(d_end >= threshold, half, d_end)
        factor = (sampled + d_start + d_end) / sampled
        if is_rate:
            factor = factor / (range_ms / 1000.0)
        return result * factor


def instant_rate(arg: RangeArg, *, is_rate: bool) -> VectorBlock:
    fw = arg.flat()
    ts, vals, lo, hi = fw.ts, fw.vals, fw.lo, fw.hi
    if ts.size == 0:
        return _empty(arg)
    ok = (hi - lo) >= 2
    last, prev = _take(vals, hi - 1), _take(vals, hi - 2)
    dt_ms = _take(ts, hi - 1) - _take(ts, hi - 2)
    ok &= dt_ms != 0
    with np.errstate(invalid="ignore", divide="ignore"):
        step = np.where(last < prev, last, last - prev) if is_rate else last - prev
        res = step / (np.where(ok, dt_ms, 1) / 1000.0) if is_rate else step
    return _rows(arg, res, ok)


def _windowed(
    arg: RangeArg, fn: Callable[[np.ndarray, np.ndarray, int], float], *, drop_name: bool = True, min_n: int = 1
) -> VectorBlock:
    """Apply ``fn(timestamps, values, step)`` to each step's window: the general, per-window path."""
    fw = arg.flat()
    ok = (fw.hi - fw.lo) >= min_n
    res = np.full(ok.shape, np.nan)
    for r, i in zip(*np.nonzero(ok), strict=True):
        lo, hi = int(fw.lo[r, i]), int(fw.hi[r, i])
        res[r, i] = fn(fw.ts[lo:hi], fw.vals[lo:hi], int(i))
    return _rows(arg, res, ok, drop_name=drop_name)


def _reduce(arg: RangeArg, ufunc: np.ufunc) -> VectorBlock | None:
    """Vectorised window reduction with ``ufunc.reduceat``; None when a sum could lose precision."""
    fw = arg.flat()
    if fw.ts.size == 0:
        return _empty(arg)
    if ufunc is np.add and not (np.isfinite(fw.vals).all() and np.abs(fw.vals).max() < _FAST_SUM_LIMIT):
        return None
    lo, hi = fw.lo.ravel(), fw.hi.ravel()
    padded = np.append(fw.vals, 0.0)
    idx = np.empty(2 * lo.size, dtype=np.int64)
    idx[0::2], idx[1::2] = lo, hi
    res = ufunc.reduceat(padded, np.minimum(idx, fw.vals.size))[0::2].reshape(fw.lo.shape)
    return _rows(arg, res, fw.hi > fw.lo)


def _count_over_time(arg: RangeArg) -> VectorBlock:
    fw = arg.flat()
    return _rows(arg, (fw.hi - fw.lo).astype(np.float64), fw.hi > fw.lo)


def _last_over_time(arg: RangeArg) -> VectorBlock:
    fw = arg.flat()
    if fw.ts.size == 0:
        return _empty(arg)
    return _rows(arg, _take(fw.vals, fw.hi - 1), fw.hi > fw.lo, drop_name=False)


def _sum_over_time(arg: RangeArg) -> VectorBlock:
    fast = _reduce(arg, np.add)
    return fast if fast is not None else _windowed(arg, lambda _t, v, _i: kahan_sum(v))


def _avg_over_time(arg: RangeArg) -> VectorBlock:
    fast = _reduce(arg, np.add)
    if fast is None:
        return _windowed(arg, lambda _t, v, _i: kahan_mean(v))
    count = _count_over_time(arg)  # the same rows, in the same order
    fast.values = fast.values / np.maximum(count.values, 1)
    return fast


def _stdvar(values: np.ndarray) -> float:
    count, mean, c_mean, aux, c_aux = 0.0, 0.0, 0.0, 0.0, 0.0
    for v in values.tolist():
        count += 1
        delta = v - (mean + c_mean)
        mean, c_mean = kahan_inc(delta / count, mean, c_mean)
        aux, c_aux = kahan_inc(delta * (v - (mean + c_mean)), aux, c_aux)
    return (aux + c_aux) / count


def quantile(q: float, values: list[float]) -> float:
    """Prometheus' ``quantile``: linear interpolation between the closest ranks; NaN sorts first."""
    if not values or math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    vals = sorted(values, key=lambda v: (not math.isnan(v), v if not math.isnan(v) else 0.0))
    n = len(vals)
    rank = q * (n - 1)
    lower = max(0, math.floor(rank))
    upper = min(n - 1, lower + 1)
    weight = rank - math.floor(rank)
    return vals[lower] * (1 - weight) + vals[upper] * weight


def linear_regression(ts: np.ndarray, vals: np.ndarray, intercept_ms: int) -> tuple[float, float]:
    n = 0.0
    sx = cx = sy = cy = sxy = cxy = sx2 = cx2 = 0.0
    v0 = float(vals[0])
    const_y = True
    for t, v in zip(ts.tolist(), vals.tolist(), strict=True):
        if const_y and n > 0 and v != v0:
            const_y = False
        n += 1.0
        x = (t - intercept_ms) / 1e3
        sx, cx = kahan_inc(x, sx, cx)
        sy, cy = kahan_inc(v, sy, cy)
        sxy, cxy = kahan_inc(x * v, sxy, cxy)
        sx2, cx2 = kahan_inc(x * x, sx2, cx2)
    if const_y:
        if math.isinf(v0):
            return math.nan, math.nan
        return 0.0, v0
    sx, sy, sxy, sx2 = sx + cx, sy + cy, sxy + cxy, sx2 + cx2
    cov = sxy - sx * sy / n
    var = sx2 - sx * sx / n
    slope = cov / var if var != 0 else (math.copysign(math.inf, cov) if cov != 0 else math.nan)
    return slope, sy / n - slope * sx / n


def _min_max(arg: RangeArg, is_max: bool) -> VectorBlock:
    fast = _reduce(arg, np.fmax if is_max else np.fmin)
    assert fast is not None
    return fast


def eval_range_function(name: str, arg: RangeArg, scalar_args: list[np.ndarray]) -> VectorBlock:
    """Evaluate ``name`` over ``arg``; ``scalar_args`` are the per-step values of other arguments."""
    if name in RANGE_FUNCTIONS:
        return RANGE_FUNCTIONS[name](arg)
    if name == "quantile_over_time":
        qs = scalar_args[0]
        return _windowed(arg, lambda _t, v, i: quantile(float(qs[i]), v.tolist()))
    raise KeyError(name)


# rate, increase and delta: (is_counter, is_rate) of extrapolate
EXTRAPOLATED = {"rate": (True, True), "increase": (True, False), "delta": (False, False)}

RANGE_FUNCTIONS: dict[str, Callable[[RangeArg], VectorBlock]] = {
    "rate": lambda a: extrapolated_rate(a, is_counter=True, is_rate=True),
    "increase": lambda a: extrapolated_rate(a, is_counter=True, is_rate=False),
    "delta": lambda a: extrapolated_rate(a, is_counter=False, is_rate=False),
    "irate": lambda a: instant_rate(a, is_rate=True),
    "idelta": lambda a: instant_rate(a, is_rate=False),
    "deriv": lambda a: _windowed(a, lambda t, v, _i: linear_regression(t, v, int(t[0]))[0], min_n=2),
    "count_over_time": _count_over_time,
    "last_over_time": _last_over_time,
    "sum_over_time": _sum_over_time,
    "avg_over_time": _avg_over_time,
    "min_over_time": lambda a: _min_max(a, False),
    "max_over_time": lambda a: _min_max(a, True),
    "stdvar_over_time": lambda a: _windowed(a, lambda _t, v, _i: _stdvar(v)),
    "stddev_over_time": lambda a: _windowed(a, lambda _t, v, _i: math.sqrt(_stdvar(v))),
}
