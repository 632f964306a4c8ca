"""PromQL's topk / bottomk over an aggregate's groups, as masks. Pure: no I/O.

The selection is pushed down to where the groups' final values are known (a store, a proxy, the
federating proxy; see AggregateRequest.top_k in proto/metricsd.proto): each of them keeps only
the groups that rank among the k best at one evaluation time or more (:func:`kept_groups`), so
an answer of thousands of groups (``topk(10, sum by (pod) (...))`` over a namespace) crosses the
wire as a few. The client then selects per time (:func:`selected_cells`) as PromQL does. Because
the order is total (value, then the groups' sorted position) and the kept set holds every time's
k best, selecting over the kept groups gives what selecting over all of them gives; the same
holds for the union of several stores' kept groups when no group spans two stores.
"""

from __future__ import annotations

import numpy as np

from metricsd.maths.partials import Partials
from metricsd.maths.spec import AggregateResult, SideResult

__all__ = ["kept_groups", "present_cells", "requested", "select_groups", "selected_cells"]


def selected_cells(values: np.ndarray, present: np.ndarray, k: int, largest: bool) -> np.ndarray:
    """Per evaluation time (column), the k present groups (rows) with the largest (``largest``)
    or smallest values; NaN ranks below every number either way, and ties go to the lower row
    (groups are sorted by labels), as in metricsd/promql/aggregations.py."""
    if k < 1:
        return np.zeros_like(present)
    if len(values) <= k:
        return present.copy()
    nan = np.isnan(values)
    key = np.where(nan, 0.0, -values if largest else values)
    order = np.lexsort((key, nan, ~present), axis=0)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(len(values))[:, None], values.shape), axis=0)
    return present & (rank < k)


def kept_groups(values: np.ndarray, present: np.ndarray, k: int, largest: bool) -> np.ndarray:
    """The groups (rows) selected at one time or more: a bool mask over the rows."""
    return np.asarray(selected_cells(values, present, k, largest).any(axis=1))


def requested(top_k: int, bottom_k: int) -> tuple[int, bool] | None:
    """(k, largest) of an aggregate request's top_k / bottom_k; None when neither is set."""
    if top_k:
        return top_k, True
    return (bottom_k, False) if bottom_k else None


def present_cells(num_count: np.ndarray, den_count: np.ndarray | None) -> np.ndarray:
    """Where a group has a value (groups x times, or flat alike): a series counted there, on both
    sides of a ratio."""
    present = num_count > 0
    if den_count is not None:
        present &= den_count > 0
    return np.asarray(present)


def _kept_side(side: SideResult, keep: np.ndarray, renumber: np.ndarray) -> SideResult:
    p = side.partials
    rows = keep[side.group] if len(side.group) else np.zeros(0, dtype=bool)
    return SideResult(Partials(p.sum[keep], p.count[keep], p.min[keep], p.max[keep]), side.ids[rows],
                      renumber[side.group[rows]], side.values[rows], side.samples[rows])


def select_groups(res: AggregateResult, k: int, largest: bool) -> AggregateResult:
    """``res`` with only its :func:`kept_groups` (their partials, values and per-series rows, the
    series' group indices renumbered); the scanned counts stay what was scanned."""
    den_count = res.denominator.partials.count if res.denominator is not None else None
    keep = kept_groups(res.values, present_cells(res.numerator.partials.count, den_count), k, largest)
    if bool(keep.all()):
        return res
    renumber = np.cumsum(keep) - 1
    den = _kept_side(res.denominator, keep, renumber) if res.denominator is not None else None
    return AggregateResult(res.times, [g for g, kept in zip(res.groups, keep.tolist(), strict=True) if kept],
                           res.values[keep], _kept_side(res.numerator, keep, renumber), den,
                           res.series_scanned, res.samples_scanned, res.notes, res.digests)
