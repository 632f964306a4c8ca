"""Merging Aggregate replies from several stores and replicas into one answer. Pure: no I/O.

Two ways, by what the replies hold:

- :func:`merge_group_partials`: each slot's data came from exactly one replica (the others only
  vouched for it with slot digests, metricsd/maths/slotdigest.py), so the replies hold partials
  of disjoint series sets, merged per group as shards are (sum and count add, min and max take
  the extreme). No per-series work: this is the proxy's usual read.
- :func:`merge_aggregates`, below: the exact merge when replicas may disagree.

A proxy asks R replicas of every slot with ``per_series`` set, so each reply carries, per series,
its value at each evaluation time and how many raw samples it came from. Series are then
de-duplicated by id, keeping the reply that saw more samples (the more complete replica), and
folded into groups exactly as a store folds them (metricsd/maths/partials.py), so the answer
equals what one store holding all the data would give. Where replicas disagree on a series the
lagging replica is named, for read repair.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from metricsd.maths.partials import AcrossFn, Partials, finalize, group_partials, quantile_across
from metricsd.maths.select import kept_groups, present_cells, requested
from metricsd.model import Labels
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import float_array, groups_field, packed_fixed, partials_to_pb, series_partials_to_pb

__all__ = ["MergeError", "MergedAggregate", "merge_aggregates", "merge_group_partials"]


class MergeError(ValueError):
    """Replies that cannot be merged (different evaluation times: a bug or a mixed-version fleet)."""


@dataclass
class MergedAggregate:
    response: pb.AggregateResponse
    # reply index -> ids of series for which that reply had fewer samples than another replica
    lagging: dict[int, set[int]] = field(default_factory=dict)


@dataclass
class _Side:
    ids: np.ndarray
    group: np.ndarray
    values: np.ndarray
    samples: np.ndarray
    reply: np.ndarray


def _labels(g: pb.Group) -> Labels:
    return tuple(sorted((lab.name, lab.value) for lab in g.labels))


def _collect(replies: Sequence[pb.AggregateResponse], side: str, n_times: int, gindex: dict[Labels, int]) -> _Side:
    ids, groups, values, samples, reply = [], [], [], [], []
    for ri, r in enumerate(replies):
        sp = getattr(r, side)
        n = len(sp.ids)
        if n == 0:
            continue
        local = np.array([gindex.setdefault(_labels(g), len(gindex)) for g in r.groups], dtype=np.int64)
        ids.append(np.array(sp.ids, dtype=np.uint64))
        groups.append(local[np.array(sp.group, dtype=np.int64)])
        values.append(np.array(sp.values, dtype=np.float64).reshape(n, n_times))
        samples.append(np.array(sp.samples, dtype=np.uint32).reshape(n, n_times))
        reply.append(np.full(n, ri, dtype=np.int64))
    if not ids:
        return _Side(np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros((0, n_times)),
                     np.zeros((0, n_times), np.uint32), np.zeros(0, np.int64))
    return _Side(np.concatenate(ids), np.concatenate(groups), np.concatenate(values), np.concatenate(samples),
                 np.concatenate(reply))


def _dedupe(s: _Side, lagging: dict[int, set[int]]) -> _Side:
    """Keep one row per series id: the one with the most samples in total (ties: the first reply)."""
    if len(s.ids) == 0:
        return s
    total = s.samples.sum(axis=1).astype(np.int64)
    order = np.lexsort((s.reply, -total, s.ids))
    sorted_ids = s.ids[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = sorted_ids[1:] != sorted_ids[:-1]
    keep = order[first]
    # a duplicate row with fewer samples than the kept one comes from a lagging replica
    best_total = np.repeat(total[keep], np.diff(np.append(np.flatnonzero(first), len(order))))
    behind = order[~first][total[order[~first]] < best_total[~first]]
    for i in behind.tolist():
        lagging.setdefault(int(s.reply[i]), set()).add(int(s.ids[i]))
    return _Side(s.ids[keep], s.group[keep], s.values[keep], s.samples[keep], s.reply[keep])


def _partials_to_pb(p: Partials, out: pb.Partials, order: np.ndarray) -> None:
    partials_to_pb(Partials(p.sum[order], p.count[order], p.min[order], p.max[order]), out)


def _common_times(replies: Sequence[pb.AggregateResponse]) -> list[int]:
    if not replies:
        raise MergeError("no replies to merge")
    times = list(replies[0].timestamps)
    for r in replies[1:]:
        if list(r.timestamps) != times:
            raise MergeError("replies have different evaluation times")
    return times


def _selected(request: pb.AggregateRequest, order: np.ndarray, values: np.ndarray, num_p: Partials,
              den_p: Partials | None) -> np.ndarray:
    """``order`` (groups by labels) without the groups the request's top_k / bottom_k leaves out."""
    selection = requested(request.top_k, request.bottom_k)
    if selection is None:
        return order
    present = present_cells(num_p.count[order], den_p.count[order] if den_p is not None else None)
    return order[kept_groups(values[order], present, *selection)]


def _response(times: list[int], group_labels: list[Labels], order: np.ndarray, num_p: Partials,
              den_p: Partials | None, values: np.ndarray, series_scanned: int, samples_scanned: int
              ) -> pb.AggregateResponse:
    """The merged answer: the groups of ``order`` (sorted by labels, the unselected left out)."""
    resp = pb.AggregateResponse(series_scanned=series_scanned, samples_scanned=samples_scanned)
    resp.timestamps.extend(times)
    resp.MergeFromString(groups_field(2, [group_labels[gi] for gi in order.tolist()]))  # AggregateResponse.groups
    _partials_to_pb(num_p, resp.numerator, order)
    if den_p is not None:
        _partials_to_pb(den_p, resp.denominator, order)
    resp.MergeFromString(packed_fixed(5, values[order], "<f8"))
    return resp


def merge_aggregates(request: pb.AggregateRequest, replies: Sequence[pb.AggregateResponse]) -> MergedAggregate:
    """One answer from replies that together cover every slot at least once (per_series set)."""
    times = _common_times(replies)
    n_times = len(times)
    gindex: dict[Labels, int] = {}
    lagging: dict[int, set[int]] = {}
    num = _dedupe(_collect(replies, "numerator_series", n_times, gindex), lagging)
    has_den = request.HasField("denominator")
    den = _dedupe(_collect(replies, "denominator_series", n_times, gindex), lagging) if has_den else None
    group_labels = list(gindex)
    n_groups = len(group_labels)
    by_labels = np.array(sorted(range(n_groups), key=lambda i: group_labels[i]), dtype=np.int64)
    across = AcrossFn(request.across)
    num_p = group_partials(num.values, num.samples, num.group, n_groups)
    if across is AcrossFn.QUANTILE:
        values = quantile_across(request.quantile, num.values, num.samples, num.group, n_groups)
    else:
        values = finalize(across, num_p)
    den_p = None
    if den is not None:
        den_p = group_partials(den.values, den.samples, den.group, n_groups)
        with np.errstate(divide="ignore", invalid="ignore"):
            values = values / finalize(across, den_p)
    order = _selected(request, by_labels, values, num_p, den_p)
    resp = _response(times, group_labels, order, num_p, den_p, values,
                     len(num.ids) + (len(den.ids) if den is not None else 0),
                     int(num.samples.sum()) + (int(den.samples.sum()) if den is not None else 0))
    if request.per_series or across is AcrossFn.QUANTILE:
        rank = np.full(n_groups, -1, dtype=np.int64)  # -1: a group left out by top_k / bottom_k
        rank[order] = np.arange(len(order))
        for side, out in ((num, resp.numerator_series), (den, resp.denominator_series)):
            if side is None:
                continue
            rows = rank[side.group] >= 0
            series_partials_to_pb(side.ids[rows], rank[side.group[rows]], side.values[rows], side.samples[rows], out)
    return MergedAggregate(resp, lagging)


def _partials_from_pb(p: pb.Partials, n_groups: int, n_times: int) -> Partials:
    shape = (n_groups, n_times)
    arrays = [float_array(p.sum), float_array(p.count), float_array(p.min), float_array(p.max)]
    if any(a.size != n_groups * n_times for a in arrays):
        raise MergeError(f"partials of {arrays[0].size} cells for {n_groups} groups x {n_times} times")
    return Partials(*(a.reshape(shape) for a in arrays))


def merge_group_partials(request: pb.AggregateRequest, replies: Sequence[pb.AggregateResponse]) -> pb.AggregateResponse:
    """One answer from replies whose partials cover disjoint series (one data replica per slot)."""
    times = _common_times(replies)
    n_times = len(times)
    has_den = request.HasField("denominator")
    gindex: dict[Labels, int] = {}
    parts: list[tuple[np.ndarray | None, Partials, Partials | None]] = []
    for r in replies:
        if not r.groups:
            continue
        local = [gindex.setdefault(_labels(g), len(gindex)) for g in r.groups]
        num = _partials_from_pb(r.numerator, len(local), n_times)
        den = _partials_from_pb(r.denominator, len(local), n_times) if has_den else None
        # None: the reply's groups are the first len(local) groups in order (the usual case, all
        # replies with the same groups), folded by slices instead of ufunc.at, to the same sums
        same = local == list(range(len(local)))
        parts.append((None if same else np.array(local, dtype=np.int64), num, den))
    n_groups = len(gindex)

    def fold(which: int) -> Partials:
        out = Partials.empty(n_groups, n_times)
        for local, *sides in parts:
            p = sides[which]
            assert p is not None
            if local is None:
                n = len(p.sum)
                out.sum[:n] += p.sum
                out.count[:n] += p.count
                np.fmin(out.min[:n], p.min, out=out.min[:n])
                np.fmax(out.max[:n], p.max, out=out.max[:n])
                continue
            np.add.at(out.sum, local, p.sum)
            np.add.at(out.count, local, p.count)
            np.fmin.at(out.min, local, p.min)
            np.fmax.at(out.max, local, p.max)
        return out

    across = AcrossFn(request.across)
    if across is AcrossFn.QUANTILE:
        raise MergeError("a quantile across series cannot be merged from partials")
    num_p = fold(0)
    values = finalize(across, num_p)
    den_p = fold(1) if has_den else None
    if den_p is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            values = values / finalize(across, den_p)
    group_labels = list(gindex)
    order = np.array(sorted(range(n_groups), key=lambda i: group_labels[i]), dtype=np.int64)
    order = _selected(request, order, values, num_p, den_p)
    return _response(times, group_labels, order, num_p, den_p, values, sum(r.series_scanned for r in replies),
                     sum(r.samples_scanned for r in replies))
