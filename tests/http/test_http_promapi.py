"""The Prometheus HTTP API over a real store: shapes, parameters and errors as Prometheus has them."""

from __future__ import annotations

from typing import Any

import pytest
from http_fixtures import Env, pod_labels


async def _load(env: Env) -> None:
    ts = list(range(0, 600_001, 10_000))
    data = {}
    for p in range(4):
        labels = pod_labels("cpu_seconds_total", f"p{p}", workload=f"w{p % 2}")
        data[labels] = (ts, [t / 1000 * (p + 1) for t in ts])
        data[pod_labels("requests", f"p{p}", workload=f"w{p % 2}")] = (ts, [2.0] * len(ts))
    await env.write(data)


async def _get(env: Env, path: str, method: str = "GET", **params: Any) -> tuple[int, dict[str, Any]]:
    if method == "GET":
        async with env.session.get(env.url + path, params=params) as r:
            return r.status, await r.json()
    async with env.session.post(env.url + path, data=params) as r:
        return r.status, await r.json()


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_instant_query_returns_a_prometheus_vector(env: Env, method: str) -> None:
    await _load(env)
    status, body = await _get(env, "/api/v1/query", method, query="avg by (workload) (rate(cpu_seconds_total[1m]))",
                              time="600")
    assert status == 200
    assert body["status"] == "success"
    assert body["data"]["resultType"] == "vector"
    got = {r["metric"]["workload"]: r["value"] for r in body["data"]["result"]}
    assert got == {"w0": [600, "2"], "w1": [600, "3"]}


async def test_query_time_defaults_to_the_clock(env: Env) -> None:
    await _load(env)
    assert env.clock.now_ms() == 600_000
    _, body = await _get(env, "/api/v1/query", query="sum(requests)")
    assert body["data"]["result"] == [{"metric": {}, "value": [600, "8"]}]
    env.clock.advance(300_000)  # past the lookback: nothing
    _, body = await _get(env, "/api/v1/query", query="sum(requests)")
    assert body["data"]["result"] == []


async def test_range_query_returns_a_matrix_with_rfc3339_times(env: Env) -> None:
    await _load(env)
    status, body = await _get(env, "/api/v1/query_range", query="sum by (workload) (rate(cpu_seconds_total[1m])) "
                              "/ sum by (workload) (requests)", start="1970-01-01T00:05:00Z", end="600",
                              step="2m30s")
    assert status == 200
    assert body["data"]["resultType"] == "matrix"
    got = {r["metric"]["workload"]: r["values"] for r in body["data"]["result"]}
    assert got == {"w0": [[300, "1"], [450, "1"], [600, "1"]], "w1": [[300, "1.5"], [450, "1.5"], [600, "1.5"]]}


async def test_engine_path_answers_other_queries(env: Env) -> None:
    await _load(env)
    _, body = await _get(env, "/api/v1/query", query='rate(cpu_seconds_total{pod="p3"}[1m]) * 2 > bool 1',
                         time="600")
    assert body["data"]["result"] == [{"metric": {"namespace": "default", "pod": "p3", "workload": "w1"},
                                       "value": [600, "1"]}]
    _, body = await _get(env, "/api/v1/query", query="scalar(sum(requests)) + time()", time="600")
    assert body["data"] == {"resultType": "scalar", "result": [600, "608"]}


@pytest.mark.parametrize(
    ("path", "params", "status", "error_type", "message"),
    [
        ("/api/v1/query", {"query": "sum(rate(x[1m])"}, 400, "bad_data", 'invalid parameter "query"'),
        ("/api/v1/query", {}, 400, "bad_data", 'invalid parameter "query": parameter is missing'),
        ("/api/v1/query", {"query": "up", "time": "yesterday"}, 400, "bad_data",
         'invalid parameter "time": cannot parse "yesterday" to a valid timestamp'),
        ("/api/v1/query_range", {"query": "up", "start": "10", "end": "0", "step": "1"}, 400, "bad_data",
         "end timestamp must not be before start time"),
        ("/api/v1/query_range", {"query": "up", "start": "0", "end": "10", "step": "0"}, 400, "bad_data",
         "zero or negative query resolution step widths are not accepted"),
        ("/api/v1/query_range", {"query": "up", "start": "0", "end": "100000", "step": "1"}, 400, "bad_data",
         "exceeded maximum resolution of 11,000 points"),
        ("/api/v1/query_range", {"query": "up", "start": "0", "end": "10"}, 400, "bad_data",
         'invalid parameter "step"'),
        ("/api/v1/query", {"query": "rate(cpu_seconds_total[1m])[5m:1m]"}, 422, "execution", "unsupported"),
        ("/api/v1/query", {"query": "label_replace(requests, 'a', 'b', 'c', 'd')"}, 422, "execution",
         "not supported"),
        ("/api/v1/series", {}, 400, "bad_data", "no match[] parameter provided"),
        ("/api/v1/series", {"match[]": "{a=~\".*\"}"}, 400, "bad_data", "at least one non-empty matcher"),
    ],
)
async def test_errors_have_prometheus_shape(env: Env, path: str, params: dict[str, str], status: int,
                                            error_type: str, message: str) -> None:
    await _load(env)
    got_status, body = await _get(env, path, **params)
    assert got_status == status, body
    assert body["status"] == "error"
    assert body["errorType"] == error_type
    assert message in body["error"]


async def test_series_labels_and_label_values(env: Env) -> None:
    await _load(env)
    _, body = await _get(env, "/api/v1/series", **{"match[]": 'requests{workload="w1"}'})
    assert body["data"] == [
        {"__name__": "requests", "namespace": "default", "pod": "p1", "workload": "w1"},
        {"__name__": "requests", "namespace": "default", "pod": "p3", "workload": "w1"},
    ]
    _, body = await _get(env, "/api/v1/labels")
    assert body["data"] == ["__name__", "namespace", "pod", "workload"]
    _, body = await _get(env, "/api/v1/label/__name__/values")
    assert body["data"] == ["cpu_seconds_total", "requests"]
    _, body = await _get(env, "/api/v1/label/pod/values", **{"match[]": '{workload="w0"}'})
    assert body["data"] == ["p0", "p2"]


async def test_buildinfo_and_metadata(env: Env) -> None:
    status, body = await _get(env, "/api/v1/status/buildinfo")
    assert status == 200 and body["data"]["version"]
    _, body = await _get(env, "/api/v1/metadata")
    assert body == {"status": "success", "data": {}}


async def test_unavailable_backend_is_503(env: Env) -> None:
    from metricsd.rpc.backend import Unavailable

    async def down(*args: object) -> object:
        raise Unavailable("no quorum for slot 3")

    env.backend.read = down  # type: ignore[method-assign,assignment]
    env.backend.read_columns = None  # type: ignore[attr-defined]  # no in-process shortcut: reads go through read()
    env.backend.read_selection = None  # type: ignore[attr-defined]
    env.backend.aggregate = down  # type: ignore[method-assign,assignment]
    for query in ("sum(requests)", "requests"):
        status, body = await _get(env, "/api/v1/query", query=query)
        assert status == 503
        assert body == {"status": "error", "errorType": "unavailable", "error": "no quorum for slot 3"}


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_format_query_prettifies_as_prometheus_and_refuses_bad_or_hostile_queries(env: Env, method: str) -> None:
    """Grafana's "Format query" calls /api/v1/format_query (Prometheus 2.42+)."""
    status, body = await _get(env, "/api/v1/format_query", method,
                              query='sum  by(pod)(rate(cpu_seconds_total{namespace = "a"}[5m] ))')
    assert (status, body) == (200, {"status": "success",
                                    "data": 'sum by (pod) (rate(cpu_seconds_total{namespace="a"}[5m]))'})
    status, body = await _get(env, "/api/v1/format_query", method, query="sum(")
    assert status == 400 and body["errorType"] == "bad_data" and "invalid parameter" in body["error"]
    status, body = await _get(env, "/api/v1/format_query", method, query="1" + "+1" * 300)  # 300 > 256 operators
    assert status == 400 and "--query.max-operators" in body["error"], body  # as /api/v1/query refuses it
    status, body = await _get(env, "/api/v1/format_query", method)
    assert status == 400 and "query" in body["error"]
