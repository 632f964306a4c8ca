"""Compensated summation as Prometheus does it (Kahan with Neumaier's improvement).

Scalar versions for per-window loops, array versions that run one update across all steps.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["kahan_inc", "kahan_inc_arr", "kahan_mean", "kahan_sum"]


def kahan_inc(inc: float, s: float, c: float) -> tuple[float, float]:
    t = s + inc
    if math.isinf(t):
        c = 0.0
    elif abs(s) >= abs(inc):
        c += (s - t) + inc
    else:
        c += (inc - t) + s
    return t, c


def kahan_inc_arr(inc: np.ndarray, s: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(invalid="ignore", over="ignore"):
        t = s + inc
        big = np.abs(s) >= np.abs(inc)
        comp = np.where(big, (s - t) + inc, (inc - t) + s)
        c = np.where(np.isinf(t), 0.0, c + comp)
    return t, c


def kahan_sum(values: np.ndarray) -> float:
    s, c = 0.0, 0.0
    for v in values.tolist():
        s, c = kahan_inc(v, s, c)
    return s + c if not math.isinf(s) else s


def kahan_mean(values: np.ndarray) -> float:
    """Direct Kahan mean while the sum stays finite, incremental mean once it would overflow."""
    vals = values.tolist()
    s, c, count = vals[0], 0.0, 1.0
    mean, incremental = 0.0, False
    for i, v in enumerate(vals[1:]):
        count = float(i + 2)
        if not incremental:
            ns, nc = kahan_inc(v, s, c)
            if not math.isinf(ns):
                s, c = ns, nc
                continue
            incremental = True
            mean = s / (count - 1)
            c /= count - 1
        q = (count - 1) / count
        mean, c = kahan_inc(v / count, q * mean, q * c)
    if incremental:
        return mean + c
    return s / count + c / count
