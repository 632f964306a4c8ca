"""A whole PromQL query sent to one store, on real processes: 3 stores (RF 3), a config server and a
proxy (W 2, R 2) on a real etcd, with mutual TLS and tokens as ``metricsd cluster up`` runs them
(the fixture of test_cluster_read_consistency.py), the proxy with ``--whole-queries``. Every store
holds every slot, so each dashboard query goes whole to one store; ``consistency=quorum`` keeps the proxy's own path."""

from __future__ import annotations

import signal
import time
from typing import Any

import numpy as np
import pytest
from test_cluster_proxies import T0, tick, workload_series
from test_cluster_read_consistency import CALL_TIMEOUT_S, Cluster, cluster  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow

AT = str(T0 / 1000 + 50)
# pushed-down aggregations, the engine, topk across pods, one pod, data of every slot
QUERIES = ["sum(load)", "sum by (workload) (load)", "topk(5, load)", 'load{namespace="ns", pod="pod-7"}',
           "avg_over_time(load[1m])", "count(load) by (workload)", "max(rate(load[1m]))"]


async def _get(c: Cluster, path: str, **params: str) -> tuple[int, Any, float]:
    t0 = time.monotonic()
    async with c.http.get(c.url + path, params=params) as r:
        return r.status, await r.json(), time.monotonic() - t0


async def _write(c: Cluster) -> None:
    series = workload_series()
    rng = np.random.default_rng(7)
    for i in range(6):
        resp = await c.grpc.write(tick(series, T0 + i * 10_000, np.cumsum(rng.random(len(series))) + i))
        assert resp.samples_written == len(series)
    await c.wait_level(6 * len(series))


def _alike(a: Any, b: Any) -> bool:
    """Equal answers, a value up to its float's last bits (one store's sum and the proxy's merge of
    per-store partials add in different orders)."""
    if a.get("status") != "success":
        return bool(a == b)
    ra, rb = a["data"]["result"], b["data"]["result"]
    if len(ra) != len(rb) or a["data"]["resultType"] != b["data"]["resultType"]:
        return False
    for x, y in zip(ra, rb, strict=True):
        px, py = x.get("values", [x.get("value")]), y.get("values", [y.get("value")])
        if x["metric"] != y["metric"] or len(px) != len(py):
            return False
        for p, q in zip(px, py, strict=True):
            if p[0] != q[0] or abs(float(p[1]) - float(q[1])) > 1e-12 * max(1.0, abs(float(q[1]))):
                return False
    return True


@pytest.mark.parametrize("cluster", [["--whole-queries"]], indirect=True)
async def test_whole_queries_answer_as_the_quorum_path_and_quorum_reads_never_take_them(
        cluster: Cluster) -> None:  # noqa: F811  (the imported fixture)
    await _write(cluster)
    whole = await cluster.counter("whole_queries")
    for q in QUERIES:
        for path, params in (("/api/v1/query", {"time": AT}),
                             ("/api/v1/query_range", {"start": str(T0 / 1000), "end": AT, "step": "10"})):
            s1, one, _ = await _get(cluster, path, query=q, **params)
            s2, quorum, _ = await _get(cluster, path, query=q, consistency="quorum", **params)
            s3, header, _ = await _get(cluster, path, query=q, **params)
            assert s1 == s2 == s3 == 200 and one["data"]["result"], (q, one, quorum)
            assert _alike(one, quorum) and one == header, (q, one, quorum)
    # two default reads of each (query, path) went whole; the quorum reads did not
    assert await cluster.counter("whole_queries") == whole + 2 * 2 * len(QUERIES)

    # the same errors as the proxy's path: a parse error, an unsupported function
    for q, status in (("sum(", 400), ('label_replace(load, "a", "$1", "b", "(")', 422)):
        s1, one, _ = await _get(cluster, "/api/v1/query", query=q, time=AT)
        s2, quorum, _ = await _get(cluster, "/api/v1/query", query=q, time=AT, consistency="quorum")
        assert s1 == s2 == status and one == quorum and one["status"] == "error", (one, quorum)


@pytest.mark.parametrize("cluster", [["--whole-queries"]], indirect=True)
async def test_a_frozen_then_killed_store_is_hedged_and_failed_over(cluster: Cluster) -> None:  # noqa: F811
    await _write(cluster)
    _, want, _ = await _get(cluster, "/api/v1/query", query=QUERIES[1], time=AT, consistency="quorum")
    # counted before the freeze: the proxy's Stats asks every store, and a frozen one's timeout marks it down
    hedges = await cluster.counter("whole_query_hedges")
    whole = await cluster.counter("whole_queries")
    frozen = [cluster.stores["store-1"], cluster.stores["store-2"]]
    for p in frozen:
        p.popen.send_signal(signal.SIGSTOP)
    try:
        took = []
        for _ in range(6):  # store-1, the proxy's first store (member-id order), and store-2 are hedged past
            status, body, secs = await _get(cluster, "/api/v1/query", query=QUERIES[1], time=AT)
            assert status == 200 and _alike(body, want), body
            took.append(secs)
        assert max(took) < CALL_TIMEOUT_S / 2, took
        assert await cluster.counter("whole_query_hedges") > hedges
        assert await cluster.counter("whole_queries") == whole + 6
        # store-1 killed with queries in flight on its connection; store-2 thawed
        frozen[0].popen.send_signal(signal.SIGKILL)
        frozen[1].popen.send_signal(signal.SIGCONT)
        for _ in range(6):
            status, body, secs = await _get(cluster, "/api/v1/query", query=QUERIES[1], time=AT)
            assert status == 200 and _alike(body, want) and secs < CALL_TIMEOUT_S / 2, (body, secs)
    finally:
        for p in frozen:
            if p.alive:
                p.popen.send_signal(signal.SIGCONT)
