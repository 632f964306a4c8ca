"""Aggregation operators (sum, avg, min, max, count, group, stddev, stdvar, quantile, topk,
bottomk, count_values) with ``by`` / ``without``.

Groups are formed once from label sets (they do not change between steps); the arithmetic then
runs across all steps at once with NumPy, following Prometheus' float rules: Kahan sums, an
average that switches to incremental means before overflowing, NaN ignored by min/max unless
every value is NaN.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from metricsd.model import METRIC_NAME, Labels
from metricsd.promql.kahan import kahan_inc_arr
from metricsd.promql.rangefuncs import quantile
from metricsd.promql.values import NAME_LABELS, PromQLError, StepSeries, format_float

__all__ = ["FAST_OPS", "aggregate", "count_values", "reduce_groups", "top_bottom_k"]


def group_key(labels: Labels, by: bool, names: Sequence[str]) -> Labels:
    if by:
        keep = set(names)
        return tuple(kv for kv in labels if kv[0] in keep)
    drop = set(names) | set(NAME_LABELS)
    return tuple(kv for kv in labels if kv[0] not in drop)


def _groups(vec: list[StepSeries], by: bool, names: Sequence[str]) -> dict[Labels, list[StepSeries]]:
    groups: dict[Labels, list[StepSeries]] = {}
    for s in vec:
        groups.setdefault(group_key(s.labels, by, names), []).append(s)
    return groups


def _group_drop_name(key: Labels, members: list[StepSeries]) -> bool:
    """A kept ``__name__`` is still dropped at the end if any member was marked for dropping."""
    return any(k == METRIC_NAME for k, _ in key) and any(m.drop_name for m in members)


def _aggregate_group(op: str, members: list[StepSeries], n: int, param: np.ndarray | None) -> np.ndarray:
    zeros = np.zeros(n)
    count = np.zeros(n)
    if op in ("sum", "avg"):
        s, c = zeros.copy(), zeros.copy()
        mean, incremental = zeros.copy(), np.zeros(n, dtype=bool)
        for m in members:
            p = m.present
            v = np.where(p, m.values, 0.0)
            first = p & (count == 0)
            count = count + p
            if op == "sum":
                t, nc = kahan_inc_arr(v, s, c)
                s, c = np.where(p, t, s), np.where(p, nc, c)
                continue
            # avg: direct Kahan mean until the running sum would overflow, then incremental.
            t, nc = kahan_inc_arr(v, s, c)
            direct = p & ~first & ~incremental & ~np.isinf(t)
            switch = p & ~first & ~incremental & np.isinf(t)
            with np.errstate(all="ignore"):
                mean = np.where(switch, s / (count - 1), mean)
                c = np.where(switch, c / (count - 1), c)
                incremental = incremental | switch
                q = (count - 1) / np.maximum(count, 1)
                im, ic = kahan_inc_arr(v / np.maximum(count, 1), q * mean, q * c)
            upd_inc = p & incremental
            s = np.where(first, v, np.where(direct, t, s))
            c = np.where(first, 0.0, np.where(direct, nc, c))
            mean = np.where(upd_inc, im, mean)
            c = np.where(upd_inc, ic, c)
        with np.errstate(all="ignore"):
            if op == "sum":
                return np.where(np.isinf(s), s, s + c)
            return np.where(incremental, mean + c, s / np.maximum(count, 1) + c / np.maximum(count, 1))
    if op in ("min", "max"):
        cur = np.full(n, np.nan)
        for m in members:
            p = m.present
            v = m.values
            better = (v > cur) if op == "max" else (v < cur)
            take = p & ((count == 0) | better | np.isnan(cur))
            cur = np.where(take, v, cur)
            count = count + p
        return cur
    if op == "count":
        for m in members:
            count = count + m.present
        return count
    if op == "group":
        return np.ones(n)
    if op in ("stddev", "stdvar"):
        mean, acc = zeros.copy(), zeros.copy()
        for m in members:
            p = m.present
            v = m.values
            with np.errstate(all="ignore"):
                first = p & (count == 0)
                count = count + p
                delta = v - mean
                new_mean = mean + delta / np.maximum(count, 1)
                new_acc = acc + delta * (v - new_mean)
                init = np.where(np.isfinite(v), 0.0, np.nan)
                mean = np.where(first, v, np.where(p, new_mean, mean))
                acc = np.where(first, init, np.where(p, new_acc, acc))
        with np.errstate(all="ignore"):
            var = acc / np.maximum(count, 1)
            return var if op == "stdvar" else np.sqrt(var)
    if op == "quantile":
        assert param is not None
        out = np.full(n, np.nan)
        for i in range(n):
            vals = [float(m.values[i]) for m in members if m.present[i]]
            if vals:
                out[i] = quantile(float(param[i]), vals)
        return out
    raise PromQLError("execution", f"aggregation {op!r} is not supported")


def aggregate(
    op: str, vec: list[StepSeries], by: bool, names: Sequence[str], n: int, param: np.ndarray | None = None
) -> list[StepSeries]:
    groups = _groups(vec, by, names)
    fast = _aggregate_fast(op, groups)
    if fast is not None:
        return fast
    out = []
    for key, members in groups.items():
        present = np.zeros(n, dtype=bool)
        for m in members:
            present |= m.present
        values = _aggregate_group(op, members, n, param)
        out.append(StepSeries(key, values, present, drop_name=_group_drop_name(key, members)))
    return out


FAST_OPS = ("sum", "avg", "count", "min", "max", "group")
# Below this magnitude a plain sum of a few thousand values is as exact as Kahan's.
_FAST_SUM_LIMIT = 2.0**40


def _aggregate_fast(op: str, groups: dict[Labels, list[StepSeries]]) -> list[StepSeries] | None:
    """All groups at once with ``reduceat`` over a (series x steps) matrix.

    Fast path: the per-member loop costs a few NumPy calls per series. Sums fall back to the
    Kahan loop when a value could make a plain sum inexact (huge magnitudes, Inf, NaN).
    """
    if op not in FAST_OPS or not groups:
        return None
    members = [m for ms in groups.values() for m in ms]
    sizes = np.array([len(ms) for ms in groups.values()], dtype=np.int64)
    starts = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(sizes)[:-1]])
    reduced = reduce_groups(op, np.stack([m.values for m in members]), np.stack([m.present for m in members]), starts)
    if reduced is None:
        return None
    res, present = reduced
    return [
        StepSeries(key, res[i], present[i], drop_name=_group_drop_name(key, ms))
        for i, (key, ms) in enumerate(groups.items())
    ]


def reduce_groups(op: str, values: np.ndarray, present: np.ndarray, starts: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray] | None:
    """sum, avg, count, group, min or max of each group of rows (rows ``starts[g]`` to the next
    start, series x steps): (values, where the group has one), or None for a sum that a plain
    addition could make inexact (the caller takes the Kahan path)."""
    if op in ("sum", "avg"):
        used = values[present]
        if used.size and not (np.isfinite(used).all() and np.abs(used).max() < _FAST_SUM_LIMIT):
            return None
    count = np.add.reduceat(present.astype(np.float64), starts, axis=0)
    if op == "count":
        res = count
    elif op == "group":
        res = np.ones_like(count)
    elif op in ("sum", "avg"):
        res = np.add.reduceat(np.where(present, values, 0.0), starts, axis=0)
        if op == "avg":
            res = res / np.maximum(count, 1)
    else:
        ufunc = np.fmax if op == "max" else np.fmin
        res = ufunc.reduceat(np.where(present, values, np.nan), starts, axis=0)
    return res, count > 0


def _k_values(param: np.ndarray) -> np.ndarray:
    if np.isnan(param).any():
        raise PromQLError("execution", "Parameter value is NaN")
    if (np.abs(param) >= 2.0**63).any():
        bad = float(param[np.abs(param) >= 2.0**63][0])
        raise PromQLError("execution", f"Scalar value {format_float(bad)} overflows int64")
    return np.trunc(param).astype(np.int64)


def top_bottom_k(
    op: str, vec: list[StepSeries], by: bool, names: Sequence[str], n: int, param: np.ndarray
) -> list[StepSeries]:
    """topk/bottomk keep the selected input series (labels, name-dropping and all) per step.

    NaN ranks below every number for both. Within a group the output is ordered by value
    (descending for topk), which is what an instant query shows.
    """
    ks = _k_values(param)
    out: list[tuple[int, int, StepSeries]] = []  # (group number, rank at the only step, series)
    for g, members in enumerate(_groups(vec, by, names).values()):
        values = np.stack([m.values for m in members])
        present = np.stack([m.present for m in members])
        nan = np.isnan(values)
        key = np.where(nan, 0.0, -values if op == "topk" else values)
        # Per step: present before absent, numbers before NaN, then by value; ties keep input order.
        order = np.lexsort((key, nan, ~present), axis=0)
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(len(members))[:, None].repeat(n, axis=1), axis=0)
        selected = present & (rank < ks[None, :])
        for i, m in enumerate(members):
            if selected[i].any():
                out.append((g, int(rank[i, 0]), StepSeries(m.labels, m.values, selected[i], drop_name=m.drop_name)))
    if n == 1:  # an instant query shows each group's selection in rank order
        out.sort(key=lambda x: (x[0], x[1]))
    return [s for _, _, s in out]


def count_values(label: str, vec: list[StepSeries], by: bool, names: Sequence[str], n: int) -> list[StepSeries]:
    counts: dict[Labels, np.ndarray] = {}
    for s in vec:
        key = group_key(s.labels, by, names)
        for i in np.flatnonzero(s.present).tolist():
            out_key = tuple(sorted({**dict(key), label: format_float(float(s.values[i]))}.items()))
            counts.setdefault(out_key, np.zeros(n))[i] += 1
    return [StepSeries(k, v, v > 0) for k, v in counts.items()]
