"""The native JSON API on simulated pod metrics, every response checked against the OpenAPI
document the server itself publishes."""

from __future__ import annotations

from typing import Any

import pytest
from http_fixtures import Env, start_env, write_request
from http_schema import schema_errors

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.http import stop_http
from metricsd.model import make_labels

START = 1_700_000_000_000
NOW = START + 30 * 60_000


@pytest.fixture
async def sim_env() -> Any:
    env = await start_env(now_ms=NOW)
    sim = Simulator(SimConfig(pods=12, workloads=3, nodes=2, seed=3), START)
    ts, values = sim.block(181)
    for req in write_requests(sim, ts, values, max_samples=50_000):
        resp = await env.backend.write(req)
        assert not resp.unknown_ids
    try:
        yield env, sim
    finally:
        await env.session.close()
        await stop_http(env.runner)  # type: ignore[arg-type]


async def _checked(env: Env, path: str, method: str = "get", **params: str) -> tuple[int, Any]:
    """Call a documented endpoint and check the reply against its documented schema."""
    async with env.session.get(env.url + "/api/v1/metricsd/openapi.json") as r:
        doc = await r.json()
    call = env.session.get if method == "get" else env.session.post
    async with call(env.url + path, params=params) as r:
        status, body = r.status, await r.json()
    op = doc["paths"][path][method]
    assert str(status) in op["responses"], f"{path} answered {status}, which is not documented"
    schema = op["responses"][str(status)]["content"]["application/json"]["schema"]
    errors = schema_errors(body, schema, doc)
    assert not errors, errors
    return status, body


def _workload(sim: Simulator) -> tuple[str, str]:
    labels = dict(next(lab for lab in sim.series if dict(lab)["__name__"] == "container_cpu_usage_seconds_total"))
    return labels["namespace"], labels["workload"]


async def test_aggregate_instant_and_range(sim_env: Any) -> None:
    env, sim = sim_env
    ns, wl = _workload(sim)
    _, body = await _checked(env, "/api/v1/metricsd/aggregate", metric="container_cpu_usage_seconds_total",
                             selector=f'namespace="{ns}"', fn="rate", window="1m", across="sum", by="workload")
    data = body["data"]
    assert data["timestamps"] == [NOW]
    assert wl in {g["labels"]["workload"] for g in data["groups"]}
    assert all(v is not None and v > 0 for g in data["groups"] for v in g["values"])
    # The same question in PromQL gives the same numbers.
    q = f'sum by (workload) (rate(container_cpu_usage_seconds_total{{namespace="{ns}"}}[1m]))'
    async with env.session.get(env.url + "/api/v1/query", params={"query": q}) as r:
        prom = {x["metric"]["workload"]: float(x["value"][1]) for x in (await r.json())["data"]["result"]}
    assert prom == pytest.approx({g["labels"]["workload"]: g["values"][0] for g in data["groups"]}, rel=1e-12)
    _, body = await _checked(env, "/api/v1/metricsd/aggregate", "post", metric="container_cpu_usage_seconds_total",
                             fn="rate", across="avg", by="workload",
                             ratio_metric="kube_pod_container_resource_requests", ratio_selector='resource="cpu"',
                             start=str((NOW - 600_000) / 1000), end=str(NOW / 1000), step="5m")
    assert body["data"]["timestamps"] == [NOW - 600_000, NOW - 300_000, NOW]
    assert all(0 < v < 10 for g in body["data"]["groups"] for v in g["values"])


@pytest.mark.parametrize(("params", "message"), [
    ({}, 'invalid parameter "metric"'),
    ({"metric": "x", "fn": "median"}, 'invalid parameter "fn"'),
    ({"metric": "x", "selector": "a=b"}, 'invalid parameter "selector"'),
    ({"metric": "x", "window": "soon"}, 'invalid parameter "window"'),
    ({"metric": "x", "across": "quantile", "quantile": "2"}, "quantile 2.0 is outside [0, 1]"),
])
async def test_aggregate_bad_parameters_are_400(sim_env: Any, params: dict[str, str], message: str) -> None:
    env, _ = sim_env
    status, body = await _checked(env, "/api/v1/metricsd/aggregate", **params)
    assert status == 400
    assert message in body["error"]


async def test_pods_of_a_workload(sim_env: Any) -> None:
    env, sim = sim_env
    ns, wl = _workload(sim)
    _, body = await _checked(env, "/api/v1/metricsd/pods", namespace=ns, workload=wl)
    pods = body["data"]["pods"]
    expected = {p.pod: p.node for p in sim.pods() if p.namespace == ns and p.workload == wl}
    assert {p["pod"]: p["node"] for p in pods} == expected
    usages = [p["cpu"]["usage"] for p in pods]
    assert usages == sorted(usages, reverse=True)
    for p in pods:
        assert p["cpu"]["request"] > 0 and p["cpu"]["limit"] >= p["cpu"]["request"]
        assert p["memory"]["usage"] > 0 and p["memory"]["limit"] >= p["memory"]["request"] > 0
    status, body = await _checked(env, "/api/v1/metricsd/pods", namespace=ns)
    assert status == 400 and 'invalid parameter "workload"' in body["error"]


async def test_series_and_stats(sim_env: Any) -> None:
    env, sim = sim_env
    _, body = await _checked(env, "/api/v1/metricsd/series", **{"match[]": "kube_node_status_capacity"})
    assert len(body["data"]) == 2 * 2  # cpu and memory of each node
    assert {int(s["id"], 16) for s in body["data"]} <= set(sim.series_ids.tolist())
    _, body = await _checked(env, "/api/v1/metricsd/stats")
    assert body["data"]["series"] == len(sim.series)
    assert body["data"]["samples"] == len(sim.series) * 181
    assert body["data"]["health"]["status"] == "SERVING"


async def test_nan_and_missing_values_are_null() -> None:
    env = await start_env(now_ms=120_000)
    try:
        labels = make_labels("g", {"namespace": "n", "pod": "p", "workload": "w"})
        await env.backend.write(write_request({labels: ([0, 60_000], [float("nan"), 1.0])}))
        _, body = await _checked(env, "/api/v1/metricsd/aggregate", metric="g", fn="last", window="5m",
                                 across="sum", start="0", end="120", step="60")
        assert body["data"]["groups"][0]["values"] == [None, 1.0, 1.0]
    finally:
        await env.session.close()
        await stop_http(env.runner)  # type: ignore[arg-type]


async def test_every_documented_path_is_served(env: Env) -> None:
    async with env.session.get(env.url + "/api/v1/metricsd/openapi.json") as r:
        doc = await r.json()
    for path, ops in doc["paths"].items():
        for method in ops:
            async with env.session.request(method.upper(), env.url + path) as r:
                assert r.status not in (404, 405), f"{method.upper()} {path} is documented but not served"
