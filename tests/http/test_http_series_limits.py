"""--query.max-series and --query.max-samples over real HTTP, on every path: the engine's reads,
an aggregate pushed down and /api/v1/series, with the store in the process (LocalBackend) and
behind a real gRPC server (the store refuses with RESOURCE_EXHAUSTED; the API answers 422 naming
the limit). A query within the limits is answered, and nothing stored changes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from http_fixtures import pod_labels, write_request
from prometheus_client import CollectorRegistry

from metricsd.clock import ManualClock
from metricsd.http import HttpSettings, build_app, start_http, stop_http
from metricsd.promql.limits import QueryLimits
from metricsd.rpc.client import GrpcBackend
from metricsd.rpc.server import start_grpc_server
from metricsd.store.api import LocalBackend, StoreAPI, StoreServicer
from metricsd.store.engine import Store

SERIES = 20
LIMITS = HttpSettings(access_log=False, max_samples=1000, query_limits=QueryLimits(max_series=10))


@pytest.fixture(params=["local", "grpc"])
async def api(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, aiohttp.ClientSession, Store]]:
    store = Store()
    store_api = StoreAPI(store)
    store_api.write(write_request({pod_labels("x", f"p{i}", workload="big" if i < 5 else "small"):
                                   (list(range(0, 600_000, 10_000)), [float(i)] * 60) for i in range(SERIES)}))
    server = None
    if request.param == "grpc":
        server, port = await start_grpc_server(StoreServicer(store), "127.0.0.1", 0)
        import grpc

        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        from metricsd.proto import metricsd_pb2_grpc as pb_grpc

        backend: object = GrpcBackend(pb_grpc.MetricsStub(channel))
    else:
        backend = LocalBackend(store_api)
    app = build_app(backend, settings=LIMITS, registry=CollectorRegistry(), clock=ManualClock(600_000))  # type: ignore[arg-type]
    runner, http_port = await start_http(app, "127.0.0.1", 0)
    session = aiohttp.ClientSession()
    try:
        yield f"http://127.0.0.1:{http_port}", session, store
    finally:
        await session.close()
        await stop_http(runner)
        if server is not None:
            await channel.close()
            await server.stop(None)


async def _get(session: aiohttp.ClientSession, url: str, **params: str) -> tuple[int, dict[str, object]]:
    async with session.get(url, params=params) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize("query", ["x", "count(x)", "count(x) > 0", "rate(x[5m])", "sum by (pod) (rate(x[5m]))"])
async def test_a_selection_past_max_series_is_422_naming_the_limit(
        api: tuple[str, aiohttp.ClientSession, Store], query: str) -> None:
    url, session, store = api
    before = store.stats()
    status, body = await _get(session, url + "/api/v1/query", query=query, time="590")
    assert status == 422, body
    assert body["errorType"] == "execution"
    assert "--query.max-series" in str(body["error"]) and "20 series" in str(body["error"])
    assert store.stats() == before


async def test_within_max_series_is_answered(api: tuple[str, aiohttp.ClientSession, Store]) -> None:
    url, session, _ = api
    status, body = await _get(session, url + "/api/v1/query", query='count(x{workload="big"})', time="590")
    assert status == 200 and body["data"]["result"][0]["value"][1] == "5"  # type: ignore[index]
    status, body = await _get(session, url + "/api/v1/query", query='sum(x{workload="big"}) * 2', time="590")
    assert status == 200 and body["data"]["result"][0]["value"][1] == "20"  # type: ignore[index]


async def test_past_max_samples_is_422_naming_the_limit(api: tuple[str, aiohttp.ClientSession, Store]) -> None:
    url, session, _ = api
    # 5 series x 60 samples = 300 <= 1000; 20 series would be 1,200 but are past max_series first
    status, _ = await _get(session, url + "/api/v1/query", query='x{workload="big"}[10m]', time="590")
    assert status == 200
    status, body = await _get(session, url + "/api/v1/query_range", query='x{workload="big"}', start="0",
                              end="590", step="0.1")  # 5,901 steps x 5 series in the lookback: over 1,000
    assert status == 422
    assert "samples" in str(body["error"])


async def test_series_lookup_past_max_series_is_422_and_a_limit_bounds_it(
        api: tuple[str, aiohttp.ClientSession, Store]) -> None:
    url, session, _ = api
    status, body = await _get(session, url + "/api/v1/series", **{"match[]": "x"})
    assert status == 422 and "--query.max-series" in str(body["error"])
    status, body = await _get(session, url + "/api/v1/series", **{"match[]": "x", "limit": "3"})
    assert status == 200 and len(body["data"]) == 3  # type: ignore[arg-type]
    status, body = await _get(session, url + "/api/v1/series", **{"match[]": 'x{workload="big"}'})
    assert status == 200
    assert sorted(s["pod"] for s in body["data"]) == [f"p{i}" for i in range(5)]  # type: ignore[union-attr,index]
    status, body = await _get(session, url + "/api/v1/labels", **{"match[]": "x"})  # names: answered from codes
    assert status == 200 and body["data"] == ["__name__", "namespace", "pod", "workload"]
