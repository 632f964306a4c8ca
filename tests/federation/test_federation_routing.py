"""Routing on the ``cluster`` label (pure): which clusters are asked, with which matchers."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metricsd.federation.routing import aggregate_for_clusters, cluster_mix, relabel, route
from metricsd.model import make_labels
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest
from metricsd.rpc.wire import matchers_to_pb
from metricsd.selector import parse_selector

NAMES = ["eu-1", "eu-2", "us-1"]


def _m(text: str) -> list[pb.Matcher]:
    return matchers_to_pb(parse_selector(text, "cpu"))


def test_cluster_matchers_pick_clusters_and_are_not_sent_down() -> None:
    names, rest = route(NAMES, _m('cluster=~"eu-.*",pod="p"'))
    assert names == ["eu-1", "eu-2"]
    assert [(m.name, m.value) for m in rest] == [("__name__", "cpu"), ("pod", "p")]
    assert route(NAMES, _m('cluster!="us-1"'))[0] == ["eu-1", "eu-2"]
    assert route(NAMES, _m('cluster=""'))[0] == []  # every series has the label
    assert route(NAMES, _m(""))[0] == NAMES


def test_a_bad_cluster_regex_is_bad_request() -> None:
    with pytest.raises(BadRequest, match="bad regular expression"):
        route(NAMES, [pb.Matcher(type=pb.Matcher.RE, name="cluster", value="[")])


def test_by_cluster_is_answered_here_and_a_ratio_needs_the_same_clusters() -> None:
    req = pb.AggregateRequest(group_by=["cluster", "workload"])
    req.query.matchers.extend(_m('cluster="eu-1"'))
    req.denominator.matchers.extend(_m('cluster=~"eu-1"'))
    names, sub, by_cluster = aggregate_for_clusters(NAMES, req)
    assert names == ["eu-1"] and by_cluster and list(sub.group_by) == ["workload"]
    assert all(m.name != "cluster" for m in [*sub.query.matchers, *sub.denominator.matchers])
    assert list(req.group_by) == ["cluster", "workload"]  # the caller's request is left alone
    # topk by cluster: a group is one cluster's, whose proxy may select; without, after the merge
    req.top_k = 5
    assert aggregate_for_clusters(NAMES, req)[1].top_k == 5
    req.group_by.remove("cluster")
    assert aggregate_for_clusters(NAMES, req)[1].top_k == 0 and req.top_k == 5
    req.group_by.insert(0, "cluster")
    del req.denominator.matchers[:]
    req.denominator.matchers.extend(_m(""))
    with pytest.raises(BadRequest, match="different clusters"):
        aggregate_for_clusters(NAMES, req)


def test_relabel_replaces_a_series_own_cluster_label() -> None:
    labels = make_labels("cpu", {"namespace": "n", "pod": "p", "cluster": "inner"})
    assert dict(relabel(labels, "eu-1"))["cluster"] == "eu-1"
    assert list(relabel(labels, "eu-1")) == sorted(relabel(labels, "eu-1"))
    assert cluster_mix("a") != cluster_mix("b")


_name = st.from_regex(r"[a-z][a-z0-9-]{0,6}", fullmatch=True)


@given(st.lists(_name, min_size=1, max_size=6, unique=True), st.sampled_from(["=", "!=", "=~", "!~"]), _name)
def test_route_asks_exactly_the_clusters_whose_name_matches(names: list[str], op: str, value: str) -> None:
    got, rest = route(names, _m(f'cluster{op}"{value}",pod="x"'))
    want = {
        "=": [n for n in names if n == value],
        "!=": [n for n in names if n != value],
        "=~": [n for n in names if re.fullmatch(value, n)],
        "!~": [n for n in names if not re.fullmatch(value, n)],
    }[op]
    assert got == want
    assert [m.name for m in rest] == ["__name__", "pod"]
