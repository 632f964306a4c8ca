"""Merging clusters' aggregates (pure), checked against a float loop over every series."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from metricsd.federation.merge import eval_times, merge_aggregate
from metricsd.maths.partials import group_partials
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import groups_field, partials_to_pb, series_partials_to_pb, values_matrix

ACROSS = {pb.ACROSS_SUM: "sum", pb.ACROSS_AVG: "avg", pb.ACROSS_MIN: "min", pb.ACROSS_MAX: "max",
          pb.ACROSS_COUNT: "count"}
WORKLOADS = ("a", "b", "c")


def _reply(rows: list[tuple[str, float]], times: int, quantile: bool) -> pb.AggregateResponse:
    """What a cluster's proxy answers for ``by (workload)``: partials per group (and, for a
    quantile, the per-series values), built with the stores' own folding."""
    names = sorted({w for w, _ in rows})
    group = np.array([names.index(w) for w, _ in rows], dtype=np.int64)
    values = np.array([[v] * times for _, v in rows], dtype=np.float64).reshape(len(rows), times)
    samples = np.ones_like(values, dtype=np.uint32)
    p = group_partials(values, samples, group, len(names))
    resp = pb.AggregateResponse()
    resp.timestamps.extend(range(0, times * 1000, 1000))
    resp.MergeFromString(groups_field(2, [(("workload", w),) for w in names]))
    partials_to_pb(p, resp.numerator)
    if quantile:  # ids 0..n-1 in every cluster: the same ids, different series
        series_partials_to_pb(np.arange(len(rows), dtype=np.uint64), group, values, samples, resp.numerator_series)
    return resp


def _oracle(across: str, vals: list[float]) -> float:
    if across == "sum":
        return math.fsum(vals)
    if across == "avg":
        return math.fsum(vals) / len(vals)
    if across == "min":
        return min(vals)
    if across == "max":
        return max(vals)
    return float(len(vals))


_rows = st.lists(st.tuples(st.sampled_from(WORKLOADS), st.floats(-1e6, 1e6, allow_nan=False)), max_size=8)


@settings(max_examples=60, deadline=None)
@given(st.lists(_rows, min_size=1, max_size=4), st.sampled_from(sorted(ACROSS)), st.booleans(),
       st.integers(1, 3))
def test_merged_partials_equal_the_aggregate_over_every_clusters_series(
        clusters: list[list[tuple[str, float]]], across: int, by_cluster: bool, times: int) -> None:
    req = pb.AggregateRequest(across=across, group_by=["cluster", "workload"] if by_cluster else ["workload"],
                              start_ms=0, end_ms=(times - 1) * 1000, step_ms=1000)
    answers = [(f"c{i}", _reply(rows, times, quantile=False)) for i, rows in enumerate(clusters)]
    resp = merge_aggregate(req, answers, by_cluster)
    want: dict[tuple[tuple[str, str], ...], list[float]] = {}
    for i, rows in enumerate(clusters):
        for w, v in rows:
            key = (("cluster", f"c{i}"), ("workload", w)) if by_cluster else (("workload", w),)
            want.setdefault(key, []).append(v)
    got_groups = [tuple((lab.name, lab.value) for lab in g.labels) for g in resp.groups]
    assert got_groups == sorted(want)
    assert list(resp.timestamps) == list(range(0, times * 1000, 1000))
    vals = values_matrix(resp)
    for gi, key in enumerate(got_groups):
        expected = _oracle(ACROSS[across], want[key])
        np.testing.assert_allclose(vals[gi], [expected] * times, rtol=1e-9, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.lists(_rows.filter(bool), min_size=2, max_size=3), st.floats(0, 1))
def test_a_quantile_counts_every_clusters_series_although_their_ids_collide(
        clusters: list[list[tuple[str, float]]], q: float) -> None:
    req = pb.AggregateRequest(across=pb.ACROSS_QUANTILE, quantile=q, group_by=["workload"], start_ms=0, end_ms=0)
    answers = [(f"c{i}", _reply(rows, 1, quantile=True)) for i, rows in enumerate(clusters)]
    resp = merge_aggregate(req, answers, by_cluster=False)
    by_w: dict[str, list[float]] = {}
    for rows in clusters:
        for w, v in rows:
            by_w.setdefault(w, []).append(v)
    vals = values_matrix(resp)
    for gi, g in enumerate(resp.groups):
        np.testing.assert_allclose(vals[gi, 0], np.quantile(by_w[g.labels[0].value], q), rtol=1e-9, atol=1e-6)


def test_no_cluster_asked_gives_the_evaluation_times_and_no_groups() -> None:
    req = pb.AggregateRequest(across=pb.ACROSS_SUM, start_ms=0, end_ms=120_000, step_ms=60_000)
    resp = merge_aggregate(req, [], by_cluster=False)
    assert list(resp.timestamps) == [0, 60_000, 120_000] and not resp.groups
    assert eval_times(pb.AggregateRequest(start_ms=5, end_ms=5)) == [5]
