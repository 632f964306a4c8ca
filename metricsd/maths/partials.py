"""Across-series aggregation into mergeable partials, and their merge. Pure: no I/O.

A store reduces each series over its window (metricsd/maths/window.py), then folds the series
of each group into partials: sum, count, min, max per group and evaluation time. Partials from
different shards merge exactly (sums add, mins take the min), which averages cannot; the final
value is computed only after the last merge. A quantile across series cannot be folded, so for
it the per-series values travel instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

__all__ = ["AcrossFn", "Partials", "finalize", "group_partials", "merge_partials", "quantile_across"]


class AcrossFn(IntEnum):
    """Values equal the proto's AcrossFn enum."""

    AVG = 1
    SUM = 2
    MIN = 3
    MAX = 4
    COUNT = 5
    QUANTILE = 6


@dataclass
class Partials:
    """Per group (rows) and evaluation time (columns). count 0 means no value there."""

    sum: np.ndarray
    count: np.ndarray
    min: np.ndarray
    max: np.ndarray

    @classmethod
    def empty(cls, n_groups: int, n_times: int) -> Partials:
        shape = (n_groups, n_times)
        return cls(np.zeros(shape), np.zeros(shape), np.full(shape, np.inf), np.full(shape, -np.inf))

    @property
    def shape(self) -> tuple[int, int]:
        return self.sum.shape


def group_partials(values: np.ndarray, samples: np.ndarray, group: np.ndarray, n_groups: int) -> Partials:
    """Fold per-series values (series x times) into per-group partials.

    A series counts at time t when ``samples`` > 0 there; a NaN value then propagates into the
    group's sum as it does in PromQL, while min/max skip NaN unless it is the only value. All
    times at once: each (series, time) cell goes to the flat bin group * T + t.
    """
    n_times = values.shape[1]
    p = Partials.empty(n_groups, n_times)
    if values.size == 0:
        return p
    has = samples > 0
    bins = (np.asarray(group, dtype=np.int64)[:, None] * n_times + np.arange(n_times)[None, :])[has]
    vals = values[has]
    size = n_groups * n_times
    p.sum = np.bincount(bins, weights=vals, minlength=size).astype(np.float64).reshape(n_groups, n_times)
    p.count = np.bincount(bins, minlength=size).astype(np.float64).reshape(n_groups, n_times)
    num = ~np.isnan(vals)
    mn = np.full(size, np.inf)
    mx = np.full(size, -np.inf)
    np.minimum.at(mn, bins[num], vals[num])
    np.maximum.at(mx, bins[num], vals[num])
    p.min, p.max = mn.reshape(n_groups, n_times), mx.reshape(n_groups, n_times)
    nan_only = (p.count > 0) & np.isposinf(p.min)
    if bool(nan_only.any()):
        p.min[nan_only] = np.nan
        p.max[nan_only] = np.nan
    return p


def merge_partials(a: Partials, b: Partials) -> Partials:
    """Combine partials of disjoint series sets (two shards) for the same groups and times."""
    return Partials(
        a.sum + b.sum,
        a.count + b.count,
        np.fmin(a.min, b.min),
        np.fmax(a.max, b.max),
    )


def finalize(across: AcrossFn, p: Partials) -> np.ndarray:
    """The answer per group and time; NaN where no series had a value."""
    with np.errstate(invalid="ignore", divide="ignore"):
        if across is AcrossFn.SUM:
            out = p.sum.copy()
        elif across is AcrossFn.AVG:
            out = p.sum / p.count
        elif across is AcrossFn.MIN:
            out = p.min.copy()
        elif across is AcrossFn.MAX:
            out = p.max.copy()
        elif across is AcrossFn.COUNT:
            out = p.count.copy()
        else:
            raise ValueError("quantile across series needs per-series values: use quantile_across")
    out[p.count == 0] = np.nan
    return out


def quantile_across(
    q: float, values: np.ndarray, samples: np.ndarray, group: np.ndarray, n_groups: int
) -> np.ndarray:
    """PromQL's quantile aggregation: linear interpolation at rank q * (n - 1) per group and time.

    q < 0 gives -Inf and q > 1 gives +Inf, as in Prometheus.
    """
    n_times = values.shape[1] if values.ndim == 2 else 0
    out = np.full((n_groups, n_times), np.nan)
    for gi in range(n_groups):
        sel = group == gi
        for j in range(n_times):
            col = values[sel, j][samples[sel, j] > 0]
            if len(col) == 0:
                continue
            if q < 0:
                out[gi, j] = -np.inf
            elif q > 1:
                out[gi, j] = np.inf
            elif np.isnan(q):
                out[gi, j] = np.nan
            else:
                s = np.sort(col)
                rank = q * (len(s) - 1)
                lo = int(np.floor(rank))
                hi = min(lo + 1, len(s) - 1)
                w = rank - lo
                out[gi, j] = s[lo] * (1 - w) + s[hi] * w
    return out
