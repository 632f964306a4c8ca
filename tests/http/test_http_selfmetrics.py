"""/metrics: metricsd's own metrics in the Prometheus text format, from the registry passed in."""

from __future__ import annotations

import cramjam
from http_fixtures import Env, pod_labels
from prometheus_client.parser import text_string_to_metric_families

from metricsd.http.server import METRICS_KEY
from metricsd.proto import prometheus_remote_pb2 as prom


def _remote(samples: list[tuple[int, float]], pod: str = "a") -> bytes:
    req = prom.WriteRequest()
    ts = req.timeseries.add()
    for k, v in sorted(pod_labels("mem", pod)):
        ts.labels.add(name=k, value=v)
    for t, x in samples:
        ts.samples.add(timestamp=t, value=x)
    return bytes(cramjam.snappy.compress_raw(req.SerializeToString()))


async def _scrape(env: Env) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with env.session.get(env.url + "/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


async def test_ingest_rejections_series_and_latency_are_exported(env: Env) -> None:
    headers = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"}
    for body in (_remote([(1000, 1.0), (2000, 2.0)]), _remote([(2000, 2.0), (3000, 3.0)])):
        async with env.session.post(env.url + "/api/v1/write", data=body, headers=headers) as r:
            assert r.status == 204
    async with env.session.post(env.url + "/api/v1/write", data=b"junk", headers=headers) as r:
        assert r.status == 400
    for q in ("sum(mem)", "mem * 2"):
        async with env.session.get(env.url + "/api/v1/query", params={"query": q, "time": "3"}) as r:
            assert r.status == 200
    m = await _scrape(env)
    assert m[("metricsd_samples_ingested_total", (("path", "remote_write"),))] == 3
    assert m[("metricsd_samples_rejected_total", (("reason", "duplicate"),))] == 1
    assert m[("metricsd_series", ())] == env.stats()["series"] == 1
    assert m[("metricsd_samples", ())] == 3
    assert m[("metricsd_store_rejected_samples", (("reason", "duplicate"),))] == 1
    assert m[("metricsd_query_duration_seconds_count", (("path", "pushdown"),))] == 1
    assert m[("metricsd_query_duration_seconds_count", (("path", "engine"),))] == 1
    assert m[("metricsd_http_requests_total", (("code", "400"), ("handler", "/api/v1/write")))] == 1
    assert m[("metricsd_http_request_duration_seconds_count", (("handler", "/api/v1/query"),))] == 2


async def test_hooks_for_other_components_are_served(env: Env) -> None:
    app = env.runner.app  # type: ignore[attr-defined]
    metrics = app[METRICS_KEY]
    metrics.quorum_failures.labels(op="write").inc(2)
    metrics.hinted_handoff_queue.set(150)
    metrics.wal_lag.set(0.25)
    m = await _scrape(env)
    assert m[("metricsd_quorum_failures_total", (("op", "write"),))] == 2
    assert m[("metricsd_hinted_handoff_queue_samples", ())] == 150
    assert m[("metricsd_wal_lag_seconds", ())] == 0.25


def _pods_body(tick: int, pods: int = 30, first: int = 0) -> bytes:
    req = prom.WriteRequest()
    for i in range(first, first + pods):
        ts = req.timeseries.add()
        for k, v in sorted(pod_labels("mem", f"p{i}")):
            ts.labels.add(name=k, value=v)
        ts.samples.add(timestamp=1000 * (tick + 1), value=float(tick * 100 + i))
    return bytes(cramjam.snappy.compress_raw(req.SerializeToString()))


async def test_remote_write_layout_memo_is_exported(env: Env) -> None:
    """The layout memo's hits, misses, layouts and bytes (http/remote_write_layout.py) in /metrics:
    a sender repeating one request's series hits from its fourth request on; another set misses."""
    headers = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"}
    m = await _scrape(env)
    assert m[("metricsd_remote_write_layout_hits_total", ())] == 0
    assert m[("metricsd_remote_write_layouts", ())] == 0
    # tick 0 learns the series (cold cache: not looked up); 1 and 2 miss (1 notes the layout, 2 records it); 3-5 hit
    for tick in range(6):
        async with env.session.post(env.url + "/api/v1/write", data=_pods_body(tick), headers=headers) as r:
            assert r.status == 204
    m = await _scrape(env)
    assert m[("metricsd_remote_write_layout_hits_total", ())] == 3
    assert m[("metricsd_remote_write_layout_misses_total", ())] == 2
    assert m[("metricsd_remote_write_layouts", ())] == 1
    assert 30 * 20 < m[("metricsd_remote_write_layout_bytes", ())] < 1 << 20
    async with env.session.post(env.url + "/api/v1/write", data=_pods_body(6, 10, 100), headers=headers) as r:
        assert r.status == 204  # other series: looked up, not recognised
    m = await _scrape(env)
    assert m[("metricsd_remote_write_layout_hits_total", ())] == 3
    assert m[("metricsd_remote_write_layout_misses_total", ())] == 3
    assert m[("metricsd_samples_ingested_total", (("path", "remote_write"),))] == 6 * 30 + 10
