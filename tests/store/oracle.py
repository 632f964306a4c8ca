"""Naive reference implementations the store is checked against (float loops, dicts of lists)."""

from __future__ import annotations

import math

import numpy as np

from metricsd.model import STALE_NAN_BITS


def is_stale(v: float) -> bool:
    return bool(np.float64(v).view(np.uint64) == np.uint64(STALE_NAN_BITS))


def window_samples(ts: list[int], vals: list[float], t: int, w: int) -> list[tuple[int, float]]:
    return [(a, b) for a, b in zip(ts, vals, strict=True) if t - w < a <= t]


def reduce_one(ts: list[int], vals: list[float], t: int, w: int, fn: str) -> tuple[float, int]:
    """(value, samples) of one series at t, as Prometheus' *_over_time / rate would give."""
    win = window_samples(ts, vals, t, w)
    if fn == "last":
        if not win or is_stale(win[-1][1]):
            return math.nan, 0
        return win[-1][1], 1
    win = [(a, b) for a, b in win if not is_stale(b)]
    n = len(win)
    if fn in ("rate", "increase"):
        if n < 2:
            return math.nan, 0
        return prom_rate(win, t, w, fn == "rate"), n
    if n == 0:
        return math.nan, 0
    vs = [b for _, b in win]
    if fn == "count":
        return float(n), n
    if fn == "sum":
        return math.fsum(vs) if not any(math.isnan(x) for x in vs) else math.nan, n
    if fn == "avg":
        return (sum(vs) / n), n
    nums = [x for x in vs if not math.isnan(x)]
    if not nums:
        return math.nan, n
    return (min(nums) if fn == "min" else max(nums)), n


def prom_rate(win: list[tuple[int, float]], t: int, w: int, is_rate: bool) -> float:
    """Prometheus' extrapolatedRate for a counter, transcribed as a plain loop."""
    first_t, first_v = win[0]
    last_t, last_v = win[-1]
    result = last_v - first_v
    prev = first_v
    for _, v in win[1:]:
        if v < prev:
            result += prev
        prev = v
    dur_start = (first_t - (t - w)) / 1000.0
    dur_end = (t - last_t) / 1000.0
    sampled = (last_t - first_t) / 1000.0
    avg = sampled / (len(win) - 1)
    thr = avg * 1.1
    if dur_start >= thr:
        dur_start = avg / 2
    if result > 0 and first_v >= 0:
        to_zero = sampled * (first_v / result)
        if to_zero < dur_start:
            dur_start = to_zero
    if dur_end >= thr:
        dur_end = avg / 2
    factor = (sampled + dur_start + dur_end) / sampled
    if is_rate:
        factor /= w / 1000.0
    return result * factor
