"""Functions of instant vectors and scalars: math, clamp, round, time(), vector(), scalar(),
histogram_quantile on classic ``le`` buckets.

Every function here that changes a value marks its output for delayed ``__name__`` removal.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from metricsd.model import Labels
from metricsd.promql.values import StepSeries

__all__ = ["MATH_FUNCTIONS", "bucket_quantile", "clamp", "histogram_quantile", "round_to", "scalar_of"]


def _sgn(v: np.ndarray) -> np.ndarray:
    return np.sign(v)


MATH_FUNCTIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "abs": np.abs,
    "ceil": np.ceil,
    "floor": np.floor,
    "exp": np.exp,
    "sqrt": np.sqrt,
    "ln": np.log,
    "log2": np.log2,
    "log10": np.log10,
    "sgn": _sgn,
}


def apply_math(name: str, vec: list[StepSeries]) -> list[StepSeries]:
    fn = MATH_FUNCTIONS[name]
    with np.errstate(all="ignore"):
        return [StepSeries(s.labels, fn(s.values), s.present, drop_name=True) for s in vec]


def round_to(vec: list[StepSeries], to_nearest: np.ndarray) -> list[StepSeries]:
    """Prometheus rounds half up: floor(v / to_nearest + 0.5) * to_nearest, via the inverse."""
    with np.errstate(all="ignore"):
        inv = 1.0 / to_nearest
        return [StepSeries(s.labels, np.floor(s.values * inv + 0.5) / inv, s.present, drop_name=True) for s in vec]


def clamp(vec: list[StepSeries], lo: np.ndarray | None, hi: np.ndarray | None) -> list[StepSeries]:
    """clamp/clamp_min/clamp_max; a step where max < min has no output at all (as in Prometheus)."""
    out = []
    valid = np.ones(0 if not vec else vec[0].values.size, dtype=bool)
    if lo is not None and hi is not None:
        valid = ~(hi < lo)
    for s in vec:
        v = s.values
        if lo is not None:
            v = np.where(np.isnan(lo) | np.isnan(v), np.nan, np.maximum(lo, v))
        if hi is not None:
            v = np.where(np.isnan(hi) | np.isnan(v), np.nan, np.minimum(hi, v))
        present = s.present & valid if valid.size else s.present
        if present.any():
            out.append(StepSeries(s.labels, v, present, drop_name=True))
    return out


def scalar_of(vec: list[StepSeries], n: int) -> np.ndarray:
    """scalar(v): the single element's value where exactly one series is present, else NaN."""
    count = np.zeros(n, dtype=np.int64)
    value = np.full(n, np.nan)
    for s in vec:
        count += s.present
        value = np.where(s.present, s.values, value)
    return np.where(count == 1, value, np.nan)


def _almost_equal(a: float, b: float, eps: float) -> bool:
    if a == b:
        return True
    min_normal = 2.2250738585072014e-308
    diff = abs(a - b)
    if a == 0 or b == 0 or abs(a) + abs(b) < min_normal:
        return diff < eps * min_normal
    return diff / min(abs(a) + abs(b), 1.7976931348623157e308) < eps


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' ``BucketQuantile`` for classic buckets given as (upper bound, cumulative count)."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    bs = sorted(buckets, key=lambda b: b[0])
    if not bs or not math.isinf(bs[-1][0]) or bs[-1][0] < 0:
        return math.nan
    merged: list[list[float]] = []  # [upper bound, cumulative count]
    for ub, cnt in bs:  # coalesce equal bounds
        if merged and merged[-1][0] == ub:
            merged[-1][1] += cnt
        else:
            merged.append([ub, cnt])
    prev = merged[0][1]
    for bucket in merged[1:]:  # force monotonic, ignore tiny deltas
        curr = bucket[1]
        if curr == prev:
            continue
        if _almost_equal(prev, curr, 1e-12) or curr < prev:
            bucket[1] = prev
            continue
        prev = curr
    if len(merged) < 2:
        return math.nan
    observations = merged[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b: int = next((i for i in range(len(merged) - 1) if merged[i][1] >= rank), len(merged) - 1)
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, end, count = 0.0, merged[b][0], merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    return start + (end - start) * (rank / count)


def _parse_le(v: str) -> float | None:
    s = v.strip()
    if "_" in s:
        return None
    try:
        return float(s)
    except ValueError:
        return None


def histogram_quantile(q: np.ndarray, vec: list[StepSeries]) -> list[StepSeries]:
    """Group classic bucket series by their labels without ``le`` and interpolate per step.

    The metric name stays in the grouping key until the end of the query (delayed name removal),
    so buckets of two different histograms never mix.
    """
    groups: dict[Labels, list[tuple[float, StepSeries]]] = {}
    for s in vec:
        le = next((v for k, v in s.labels if k == "le"), None)
        ub = _parse_le(le) if le is not None else None
        if ub is None:
            continue
        key = tuple(kv for kv in s.labels if kv[0] != "le")
        groups.setdefault(key, []).append((ub, s))
    out = []
    n = q.size
    for key, members in groups.items():
        res = np.full(n, np.nan)
        present = np.zeros(n, dtype=bool)
        for i in range(n):
            buckets = [(ub, float(s.values[i])) for ub, s in members if s.present[i]]
            if not buckets:
                continue
            present[i] = True
            res[i] = bucket_quantile(float(q[i]), buckets)
        if present.any():
            out.append(StepSeries(key, res, present, drop_name=True))
    return out
