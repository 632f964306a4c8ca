"""Pushed-down aggregates answer exactly what the engine answers over the same data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from http_fixtures import write_request

from metricsd.model import make_labels, stale_marker
from metricsd.promql import Matrix, Result, Vector
from metricsd.promql.queries import QueryRunner
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

QUERIES = [
    "sum(rate(cpu[1m]))",
    "avg by (workload) (rate(cpu[1m]))",
    "max by (workload, namespace) (rate(cpu[2m]))",
    "min by (workload) (increase(cpu[5m]))",
    "count by (workload) (rate(cpu[1m]))",
    "quantile by (workload) (0.9, rate(cpu[1m]))",
    "sum by (workload) (avg_over_time(mem[3m]))",
    "max(max_over_time(mem[1m]))",
    "min by (namespace) (min_over_time(mem[1m]))",
    "sum(sum_over_time(mem[90s]))",
    "sum by (workload) (count_over_time(mem[2m]))",
    "sum by (workload) (mem)",
    "avg(mem{workload=~\"w[01]\"})",
    "count(mem)",
    "sum by (workload) (rate(cpu[1m])) / sum by (workload) (req)",
    "(avg(rate(cpu{namespace!=\"b\"}[1m]))) / avg(req{namespace!=\"b\"})",
    "topk(3, sum by (pod) (rate(cpu[1m])))",
    "bottomk(2, max by (workload) (max_over_time(mem[2m])))",
    "topk(100, avg by (workload) (mem))",
]

NOT_PUSHED = [
    "topk(3, rate(cpu[1m]))",
    "topk by (workload) (2, sum by (pod, workload) (rate(cpu[1m])))",
    "topk(0, sum by (pod) (rate(cpu[1m])))",
    "sum without (pod) (rate(cpu[1m]))",
    "sum by (workload) (rate(cpu[1m] offset 1m))",
    "sum by (__name__) (mem)",
    "sum(rate(cpu[1m])) * 2",
    "sum by (workload) (rate(cpu[1m])) / on (workload) sum by (workload) (req)",
    "sum by (workload) (rate(cpu[1m])) / sum by (namespace) (req)",
    "topk(2, mem)",
]


def _data(seed: int) -> dict[tuple[tuple[str, str], ...], tuple[list[int], list[float]]]:
    """Counters with resets, gauges with gaps and a stale marker, irregular scrape times."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(12):
        lab = {"namespace": "ab"[i % 2], "pod": f"p{i}", "workload": f"w{i % 3}"}
        ts = np.cumsum(rng.integers(7_000, 13_000, 120)).astype(np.int64)
        cpu = np.cumsum(rng.uniform(0, 5, ts.size))
        if i % 4 == 0:
            cpu[60:] -= cpu[60] - 0.5  # a counter reset
        out[make_labels("cpu", lab)] = (ts.tolist(), cpu.tolist())
        mem = rng.uniform(1e8, 2e9, ts.size)
        keep = rng.random(ts.size) > 0.2
        if i == 5:
            mem[90] = stale_marker()
            keep[90:100] = [True] + [False] * 9
        out[make_labels("mem", lab)] = (ts[keep].tolist(), mem[keep].tolist())
        out[make_labels("req", lab)] = ([0, 600_000], [0.5 + i % 3, 0.5 + i % 3])
    return out


@pytest.fixture
def backend() -> LocalBackend:
    b = LocalBackend(StoreAPI(Store()))
    resp = b.api.write(write_request(_data(7)))
    assert not resp.unknown_ids
    return b


def _assert_same(a: Result, b: Result) -> None:
    assert type(a) is type(b)
    if isinstance(a, Vector):
        assert isinstance(b, Vector)
        got = {s.labels: s.value for s in a.samples}
        want = {s.labels: s.value for s in b.samples}
        assert got.keys() == want.keys()
        for k, v in want.items():
            assert math.isclose(got[k], v, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(v) and math.isnan(got[k])), k
        return
    assert isinstance(a, Matrix) and isinstance(b, Matrix)
    assert [s.labels for s in a.series] == [s.labels for s in b.series]
    for x, y in zip(a.series, b.series, strict=True):
        np.testing.assert_array_equal(x.timestamps, y.timestamps)
        np.testing.assert_allclose(x.values, y.values, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("query", QUERIES)
async def test_pushdown_equals_the_engine(backend: LocalBackend, query: str) -> None:
    pushed = QueryRunner(backend)
    engine = QueryRunner(backend, allow_pushdown=False)
    for t in (45_000, 300_000, 700_000, 1_100_000, 1_500_000):
        a, path = await pushed.instant(query, t)
        b, path_b = await engine.instant(query, t)
        assert (path, path_b) == ("pushdown", "engine")
        _assert_same(a, b)
    ra, path = await pushed.range(query, 0, 1_500_000, 45_000)
    rb, _ = await engine.range(query, 0, 1_500_000, 45_000)
    assert path == "pushdown"
    assert ra.series, "the test data should give the query an answer"
    _assert_same(ra, rb)


@pytest.mark.parametrize("query", NOT_PUSHED)
async def test_other_shapes_go_to_the_engine(backend: LocalBackend, query: str) -> None:
    _, path = await QueryRunner(backend).instant(query, 700_000)
    assert path == "engine"


async def test_cancelling_sums_fall_back_to_the_engine() -> None:
    b = LocalBackend(StoreAPI(Store()))
    vals = [2.0, 8.0, 1e100, -1e100]
    b.api.write(write_request({make_labels("g", {"namespace": "n", "pod": f"p{i}"}): ([0], [v])
                               for i, v in enumerate(vals)}))
    res, path = await QueryRunner(b).instant("sum(g)", 10_000)
    assert path == "engine"
    assert isinstance(res, Vector) and res.samples[0].value == 10.0
