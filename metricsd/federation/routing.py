"""Which clusters a request goes to, what each is asked, and the ``cluster`` label on the way back.

Pure. Every series a federating proxy returns carries ``cluster="NAME"``, the name it was given
for the cluster, replacing any ``cluster`` label the series had inside its cluster (the name the
operator gave wins: otherwise two clusters that both label their series ``cluster="prod"`` would
merge). So a matcher on ``cluster`` is answered here, against the names, and never sent down: a
cluster is asked only when its name satisfies every ``cluster`` matcher, and it is asked with the
other matchers. Likewise ``by (cluster)`` is not sent down; the clusters' groups get the label
here, which keeps each cluster's groups apart when the partials are merged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from metricsd.model import Labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest
from metricsd.rpc.wire import labels_from_pb, labels_to_pb, matchers_from_pb
from metricsd.selector import InvalidSelector

__all__ = ["CLUSTER_LABEL", "aggregate_for_clusters", "cluster_mix", "relabel", "relabel_pb", "route", "split"]

CLUSTER_LABEL = "cluster"


def split(matchers: Iterable[pb.Matcher]) -> tuple[list[pb.Matcher], list[pb.Matcher]]:
    """(the matchers on ``cluster``, the rest)."""
    on: list[pb.Matcher] = []
    rest: list[pb.Matcher] = []
    for m in matchers:
        (on if m.name == CLUSTER_LABEL else rest).append(m)
    return on, rest


def _matching(names: Sequence[str], cluster_matchers: Sequence[pb.Matcher]) -> list[str]:
    try:
        compiled = matchers_from_pb(cluster_matchers)
    except InvalidSelector as e:
        raise BadRequest(str(e)) from None
    return [n for n in names if all(m.matches(n) for m in compiled)]


def route(names: Sequence[str], matchers: Iterable[pb.Matcher]) -> tuple[list[str], list[pb.Matcher]]:
    """The clusters (in ``names``' order) whose name satisfies the ``cluster`` matchers, and the
    matchers to send them. Raises BadRequest for a ``cluster`` regex that does not compile."""
    on, rest = split(matchers)
    return _matching(names, on), rest


def aggregate_for_clusters(names: Sequence[str], request: pb.AggregateRequest
                           ) -> tuple[list[str], pb.AggregateRequest, bool]:
    """(clusters to ask, the request to send each, whether the answer is grouped by cluster).

    A ratio whose two sides select different clusters has no per-cluster push-down (a cluster
    would divide its numerator by another's denominator): BadRequest, which sends a PromQL query
    to the engine instead."""
    clusters, num = route(names, request.query.matchers)
    sub = pb.AggregateRequest()
    sub.CopyFrom(request)
    del sub.query.matchers[:]
    sub.query.matchers.extend(num)
    if request.HasField("denominator"):
        den_clusters, den = route(names, request.denominator.matchers)
        if den_clusters != clusters:
            raise BadRequest("the numerator and the denominator select different clusters (cluster matchers): "
                             "a federated ratio needs the same clusters on both sides")
        del sub.denominator.matchers[:]
        sub.denominator.matchers.extend(den)
    by_cluster = CLUSTER_LABEL in request.group_by
    if by_cluster:
        kept = [g for g in request.group_by if g != CLUSTER_LABEL]
        del sub.group_by[:]
        sub.group_by.extend(kept)
    else:  # a group sums several clusters' partials: top_k / bottom_k after the merge
        sub.top_k = sub.bottom_k = 0
    return clusters, sub, by_cluster


def relabel(labels: Labels, cluster: str) -> Labels:
    """``labels`` (sorted by name) with ``cluster`` set to the cluster's name."""
    out = [(k, v) for k, v in labels if k != CLUSTER_LABEL]
    out.append((CLUSTER_LABEL, cluster))
    out.sort()
    return tuple(out)


def relabel_pb(labels: Iterable[pb.Label], cluster: str) -> tuple[int, list[pb.Label]]:
    """(the series id of the relabelled series, its labels as messages)."""
    new = relabel(labels_from_pb(labels), cluster)
    return series_id(new), labels_to_pb(new)


def cluster_mix(cluster: str) -> int:
    """A 64-bit value to XOR into the series ids of a cluster's per-series partials, which carry
    ids but no labels: the same pod in two clusters has the same id in both, and must not be taken
    for one series replicated (merge_aggregates keeps one row per id)."""
    return int.from_bytes(hashlib.blake2b(f"cluster\xfe{cluster}".encode(), digest_size=8).digest(), "little")
