"""FederatedBackend over real gRPC servers on loopback: two stores stand for two clusters' proxies
(a store serves the same API), a third address has nothing listening (a cluster down)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from metricsd.clock import SystemClock
from metricsd.federation.backend import FederatedBackend
from metricsd.federation.calls import FederationMetrics, FederationSettings
from metricsd.federation.spec import ClusterTarget
from metricsd.http.server import serve_http, stop_http
from metricsd.model import make_labels, series_id
from metricsd.ports import free_port
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.members import grpc_connect
from metricsd.rpc.backend import BadRequest, Unavailable
from metricsd.rpc.client import MetricsClient
from metricsd.rpc.server import start_grpc_server
from metricsd.rpc.wire import labels_from_pb, labels_to_pb, matchers_to_pb, values_matrix
from metricsd.selector import parse_selector
from metricsd.store.api import StoreServicer
from metricsd.store.engine import Store

T_END = 290_000


def _closed_port() -> int:
    return free_port()


def _batch(cluster: int, pods: int) -> tuple[pb.WriteRequest, dict[str, list[float]]]:
    """Counters rising at a per-pod rate, in workload ``web``; returns the batch and the rates."""
    req = pb.WriteRequest()
    rates: dict[str, list[float]] = {"web": []}
    for i in range(pods):
        labels = make_labels("cpu", {"namespace": "ns", "pod": f"p{i}", "workload": "web"})
        sid = series_id(labels)
        rate = 0.1 * (cluster + 1) + 0.01 * i
        rates["web"].append(rate)
        req.ids.append(sid)
        req.counts.append(30)
        req.timestamps.extend(range(0, 300_000, 10_000))
        req.values.extend(rate * t / 1000 for t in range(0, 300_000, 10_000))
        req.series.add(id=sid).labels.extend(labels_to_pb(labels))
    return req, rates


@dataclass
class Fed:
    backend: FederatedBackend
    rates: dict[str, list[float]]
    registry: CollectorRegistry
    dead: str


@pytest.fixture
async def fed() -> AsyncIterator[Fed]:
    servers, targets, rates = [], [], {}
    for i, name in enumerate(("east", "west")):
        server, port = await start_grpc_server(StoreServicer(Store()), "127.0.0.1", 0)
        servers.append(server)
        req, r = _batch(i, 3 + i)
        async with MetricsClient(f"127.0.0.1:{port}") as c:
            await c.write(req)
        rates[name] = r["web"]
        targets.append(ClusterTarget(name, f"127.0.0.1:{port}"))
    dead = f"127.0.0.1:{_closed_port()}"
    targets.append(ClusterTarget("north", dead))
    registry = CollectorRegistry()
    backend = FederatedBackend(targets, FederationSettings(timeout_s=2.0, retries=1, backoff_s=0.01),
                               grpc_connect(2.0), FederationMetrics(registry))
    yield Fed(backend, rates, registry, dead)
    await backend.close()
    for s in servers:
        await s.stop(None)


def _agg(selector: str, across: int = pb.ACROSS_SUM, by: tuple[str, ...] = ()) -> pb.AggregateRequest:
    req = pb.AggregateRequest(across=across, group_by=list(by), start_ms=T_END, end_ms=T_END)
    req.query.matchers.extend(matchers_to_pb(parse_selector(selector, "cpu")))
    req.query.series_fn = pb.SERIES_RATE
    req.query.window_ms = 60_000
    return req


async def test_series_carry_their_cluster_and_the_dead_cluster_is_named(fed: Fed) -> None:
    resp = await fed.backend.read(pb.ReadRequest(matchers=matchers_to_pb(parse_selector("", "cpu")), start_ms=0,
                                                 end_ms=T_END))
    clusters = [dict(labels_from_pb(s.labels))["cluster"] for s in resp.series]
    assert clusters == ["east"] * 3 + ["west"] * 4
    for s in resp.series:
        assert s.id == series_id(labels_from_pb(s.labels))
    assert [m.cluster for m in resp.missing_clusters] == ["north"]
    assert resp.missing_clusters[0].reason.startswith("did not answer within 2 s (2 attempts): ")


async def test_a_cluster_selector_asks_only_the_clusters_it_names(fed: Fed) -> None:
    resp = await fed.backend.read(pb.ReadRequest(matchers=matchers_to_pb(parse_selector('cluster="west"', "cpu")),
                                                 start_ms=0, end_ms=T_END))
    assert {dict(labels_from_pb(s.labels))["cluster"] for s in resp.series} == {"west"}
    assert len(resp.series) == 4 and not resp.missing_clusters  # north was not asked
    text = generate_latest(fed.registry).decode()
    assert 'metricsd_federation_requests_total{cluster="north",method="Read"}' not in text


@pytest.mark.parametrize(("across", "oracle"), [
    (pb.ACROSS_SUM, np.sum), (pb.ACROSS_AVG, np.mean), (pb.ACROSS_MIN, np.min), (pb.ACROSS_MAX, np.max),
    (pb.ACROSS_COUNT, len), (pb.ACROSS_QUANTILE, lambda v: np.quantile(v, 0.9)),
])
async def test_an_aggregate_across_clusters_equals_the_one_over_all_their_series(fed: Fed, across: int,
                                                                                 oracle: object) -> None:
    req = _agg('cluster=~"east|west"', across)
    req.quantile = 0.9
    resp = await fed.backend.aggregate(req)
    allrates = fed.rates["east"] + fed.rates["west"]
    assert len(resp.groups) == 1
    np.testing.assert_allclose(values_matrix(resp)[0, 0], oracle(np.array(allrates)), rtol=1e-9)  # type: ignore[operator]


async def test_by_cluster_keeps_each_cluster_apart_and_names_the_missing_one(fed: Fed) -> None:
    resp = await fed.backend.aggregate(_agg("", pb.ACROSS_AVG, ("cluster", "workload")))
    groups = [dict(labels_from_pb(g.labels)) for g in resp.groups]
    assert groups == [{"cluster": "east", "workload": "web"}, {"cluster": "west", "workload": "web"}]
    np.testing.assert_allclose(values_matrix(resp)[:, 0], [np.mean(fed.rates["east"]), np.mean(fed.rates["west"])])
    assert [m.cluster for m in resp.missing_clusters] == ["north"]


async def test_label_values_of_cluster_and_list_series(fed: Fed) -> None:
    lv = await fed.backend.label_values(pb.LabelValuesRequest(name="cluster"))
    assert list(lv.values) == ["east", "west"]
    ls = await fed.backend.list_series(pb.ListSeriesRequest(
        matchers=matchers_to_pb(parse_selector('cluster!="west",pod="p0"', "cpu"))))
    assert [dict(labels_from_pb(s.labels))["cluster"] for s in ls.series] == ["east"]


async def test_every_cluster_down_is_unavailable_not_an_empty_answer(fed: Fed) -> None:
    with pytest.raises(Unavailable, match="no cluster answered: cluster north did not answer within 2 s"):
        await fed.backend.aggregate(_agg('cluster="north"'))


async def test_bad_input_is_refused_and_writes_are_refused(fed: Fed) -> None:
    with pytest.raises(BadRequest, match="regular expression"):
        await fed.backend.read(pb.ReadRequest(matchers=[pb.Matcher(type=pb.Matcher.RE, name="cluster", value="(")]))
    with pytest.raises(BadRequest, match="read-only"):
        await fed.backend.write(pb.WriteRequest())
    req = _agg('cluster="east"')
    req.denominator.matchers.extend(matchers_to_pb(parse_selector('cluster="west"', "cpu")))
    with pytest.raises(BadRequest, match="different clusters"):
        await fed.backend.aggregate(req)


async def test_metrics_count_failures_retries_and_health(fed: Fed) -> None:
    await fed.backend.aggregate(_agg(""))
    text = generate_latest(fed.registry).decode()
    assert 'metricsd_federation_cluster_up{cluster="east"} 1.0' in text
    assert 'metricsd_federation_cluster_up{cluster="north"} 0.0' in text
    assert 'metricsd_federation_failures_total{cluster="north",method="Aggregate"} 1.0' in text
    assert 'metricsd_federation_retries_total{cluster="north"} 1.0' in text
    assert 'metricsd_federation_request_duration_seconds_count{cluster="west"} 1.0' in text
    health = await fed.backend.health()
    assert health.status == pb.HealthResponse.SERVING
    assert "north=DOWN" in health.member and "east=SERVING" in health.member


async def test_the_http_api_warns_of_missing_clusters(fed: Fed) -> None:
    runner, port = await serve_http(fed.backend, "127.0.0.1", 0, CollectorRegistry(), SystemClock())
    try:
        async with aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{port}/api/v1/query"
            q = {"query": "sum by (cluster) (rate(cpu[1m]))", "time": str(T_END / 1000)}
            async with s.get(url, params=q) as r:
                body = await r.json()
            assert r.status == 200, body
            assert [x["metric"] for x in body["data"]["result"]] == [{"cluster": "east"}, {"cluster": "west"}]
            assert len(body["warnings"]) == 1
            assert body["warnings"][0].startswith("cluster north did not answer within 2 s (2 attempts): ")
            q = {"query": 'sum(rate(cpu{cluster="east"}[1m]))', "time": str(T_END / 1000)}
            async with s.get(url, params=q) as r:
                body = await r.json()
            assert "warnings" not in body
            np.testing.assert_allclose(float(body["data"]["result"][0]["value"][1]), sum(fed.rates["east"]))
            native = f"http://127.0.0.1:{port}/api/v1/metricsd/aggregate"
            async with s.get(native, params={"metric": "cpu", "across": "sum", "time": str(T_END)}) as r:
                body = await r.json()
            assert [m["cluster"] for m in body["missingClusters"]] == ["north"]
            async with s.get(url, params={"query": 'sum(rate(cpu{cluster="north"}[1m]))'}) as r:
                assert r.status == 503
                assert "cluster north" in (await r.json())["error"]
    finally:
        await stop_http(runner)
