"""One answer from several clusters' answers. Pure: no I/O.

Clusters hold disjoint series (a series is in one cluster, and leaves it with that cluster's
``cluster`` label), so their aggregates merge as shards do: each cluster's proxy answers with
per-group partials (sum, count, min, max), and the partials are folded with the proxy's own merge
(metricsd/proxy/merge.py over metricsd/maths/partials.py), never by pulling raw series. A
quantile across series, or a ``per_series`` request, needs per-series values: those are merged by
series after the ids are made distinct per cluster (routing.cluster_mix).

Each function takes ``(cluster name, reply)`` pairs of the clusters that answered; the caller
adds the missing ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from metricsd.federation.routing import CLUSTER_LABEL, cluster_mix, relabel_pb
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.merge import MergeError, merge_aggregates, merge_group_partials
from metricsd.rpc.wire import labels_from_pb

__all__ = ["MergeError", "eval_times", "merge_aggregate", "merge_label_values", "merge_list_series", "merge_reads",
           "merge_rollups"]

Answers = Sequence[tuple[str, object]]


def eval_times(request: pb.AggregateRequest) -> list[int]:
    """The evaluation times a store gives an aggregate (for an answer no cluster contributed to)."""
    if request.end_ms <= request.start_ms or request.step_ms <= 0:
        return [request.start_ms]
    return list(range(request.start_ms, request.end_ms + 1, request.step_ms))


def _with_cluster(resp: pb.AggregateResponse, cluster: str, by_cluster: bool) -> pb.AggregateResponse:
    """A cluster's reply with ``cluster`` added to its groups (``by_cluster``) and its per-series
    ids mixed with the cluster's name."""
    out = pb.AggregateResponse()
    out.CopyFrom(resp)
    if by_cluster:
        for g in out.groups:
            kept = [(lab.name, lab.value) for lab in g.labels if lab.name != CLUSTER_LABEL]
            kept.append((CLUSTER_LABEL, cluster))
            kept.sort()
            del g.labels[:]
            g.labels.extend(pb.Label(name=k, value=v) for k, v in kept)
    mix = np.uint64(cluster_mix(cluster))
    for side in (out.numerator_series, out.denominator_series):
        if side.ids:
            ids = np.array(side.ids, dtype=np.uint64) ^ mix
            del side.ids[:]
            side.ids.extend(ids.tolist())
    return out


def merge_aggregate(request: pb.AggregateRequest, answers: Sequence[tuple[str, pb.AggregateResponse]],
                    by_cluster: bool) -> pb.AggregateResponse:
    """The clusters' aggregates as one; ``request`` is what the federation was asked (its
    ``group_by`` may name ``cluster``). Raises MergeError for replies with different times."""
    replies = [_with_cluster(r, name, by_cluster) for name, r in answers]
    if not replies:
        resp = pb.AggregateResponse()
        resp.timestamps.extend(eval_times(request))
        return resp
    if request.per_series or request.across == pb.ACROSS_QUANTILE:
        return merge_aggregates(request, replies).response
    return merge_group_partials(request, replies)


def _label_key(labels: Sequence[pb.Label]) -> tuple[tuple[str, str], ...]:
    return tuple((lab.name, lab.value) for lab in labels)


def _relabelled(answers: Answers) -> list[tuple[int, list[pb.Label], Any]]:
    """Every answer's series with its cluster label and cluster-mixed id, sorted by labels."""
    rows = []
    for name, r in answers:
        for s in r.series:  # type: ignore[attr-defined]
            sid, labels = relabel_pb(s.labels, name)
            rows.append((_label_key(labels), sid, labels, s))
    rows.sort(key=lambda row: row[0])
    return [(sid, labels, s) for _, sid, labels, s in rows]


def merge_reads(answers: Sequence[tuple[str, pb.ReadResponse]]) -> pb.ReadResponse:
    out = pb.ReadResponse()
    for sid, labels, s in _relabelled(answers):
        d = out.series.add(id=sid)
        d.labels.extend(labels)
        d.timestamps.extend(s.timestamps)
        d.values.extend(s.values)
    return out


def merge_rollups(answers: Sequence[tuple[str, pb.RollupsResponse]]) -> pb.RollupsResponse:
    out = pb.RollupsResponse()
    for sid, labels, s in _relabelled(answers):
        d = out.series.add()
        d.CopyFrom(s)
        d.id = sid
        del d.labels[:]
        d.labels.extend(labels)
    return out


def merge_list_series(answers: Sequence[tuple[str, pb.ListSeriesResponse]], limit: int) -> pb.ListSeriesResponse:
    rows = _relabelled(answers)
    if limit:
        rows = rows[:limit]
    return pb.ListSeriesResponse(series=[pb.SeriesLabels(id=sid, labels=labels) for sid, labels, _ in rows])


def merge_label_values(name: str, answers: Sequence[tuple[str, pb.LabelValuesResponse]]) -> pb.LabelValuesResponse:
    """The union; for ``cluster`` the names of the clusters that hold a matching series (each was
    asked for its metric names, so a cluster with none is left out)."""
    if name == CLUSTER_LABEL:
        return pb.LabelValuesResponse(values=sorted(c for c, r in answers if r.values))
    return pb.LabelValuesResponse(values=sorted({v for _, r in answers for v in r.values}))


def groups_labels(resp: pb.AggregateResponse) -> list[dict[str, str]]:
    """Each group's labels, for tests and logs."""
    return [dict(labels_from_pb(g.labels)) for g in resp.groups]
