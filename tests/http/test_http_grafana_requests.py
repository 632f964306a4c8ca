"""The Prometheus API calls Grafana's Prometheus data source makes, in the exact shape it makes them
(POST application/x-www-form-urlencoded for query, query_range, series and labels; `match[]`
repeated; start/end as unix seconds with decimals), over a real store, answers checked field by
field."""

from __future__ import annotations

from typing import Any

from http_fixtures import Env, pod_labels

FORM = "application/x-www-form-urlencoded"


async def _load(env: Env) -> None:
    ts = list(range(0, 600_001, 10_000))
    data = {}
    for p in range(4):
        data[pod_labels("cpu_seconds_total", f"p{p}", workload=f"w{p % 2}")] = (ts, [t / 1000 * (p + 1) for t in ts])
        data[pod_labels("requests", f"p{p}", workload=f"w{p % 2}", resource="cpu")] = (ts, [2.0] * len(ts))
    await env.write(data)


async def _post(env: Env, path: str, form: list[tuple[str, str]]) -> tuple[int, str, dict[str, Any]]:
    """POST a form whose keys may repeat (match[]), encoded as Grafana's fetch does."""
    from urllib.parse import urlencode

    async with env.session.post(env.url + path, data=urlencode(form), headers={"Content-Type": FORM}) as r:
        return r.status, r.content_type, await r.json()


async def _get(env: Env, path: str, params: list[tuple[str, str]]) -> tuple[int, str, dict[str, Any]]:
    async with env.session.get(env.url + path, params=params) as r:
        return r.status, r.content_type, await r.json()


async def test_grafana_query_range_post_form(env: Env) -> None:
    await _load(env)
    status, ctype, body = await _post(env, "/api/v1/query_range", [
        ("query", 'sum by (workload) (rate(cpu_seconds_total[1m])) / sum by (workload) (requests{resource="cpu"})'),
        ("start", "300.000"), ("end", "600.000"), ("step", "150")])
    assert (status, ctype) == (200, "application/json")
    assert set(body) == {"status", "data"} and body["status"] == "success"
    assert set(body["data"]) == {"resultType", "result"} and body["data"]["resultType"] == "matrix"
    result = sorted(body["data"]["result"], key=lambda s: s["metric"]["workload"])
    assert [set(s) for s in result] == [{"metric", "values"}] * 2
    assert [s["metric"] for s in result] == [{"workload": "w0"}, {"workload": "w1"}]
    for series, ratio in zip(result, ("1", "1.5"), strict=True):
        for t, v in series["values"]:
            assert isinstance(t, int | float) and isinstance(v, str)  # [unix seconds, "value"], as Prometheus
        assert series["values"] == [[300, ratio], [450, ratio], [600, ratio]]


async def test_grafana_instant_query_post_form_keeps_fractional_time(env: Env) -> None:
    await _load(env)
    status, _, body = await _post(env, "/api/v1/query", [("query", "sum(requests)"), ("time", "599.5")])
    assert status == 200
    assert body == {"status": "success", "data": {"resultType": "vector",
                                                  "result": [{"metric": {}, "value": [599.5, "8"]}]}}


async def test_grafana_series_post_form_with_repeated_match(env: Env) -> None:
    await _load(env)
    status, _, body = await _post(env, "/api/v1/series", [
        ("match[]", 'requests{workload="w1"}'), ("match[]", 'cpu_seconds_total{pod="p0"}'),
        ("start", "1.234"), ("end", "600.567")])
    assert status == 200 and body["status"] == "success"
    assert body["data"] == [
        {"__name__": "cpu_seconds_total", "namespace": "default", "pod": "p0", "workload": "w0"},
        {"__name__": "requests", "namespace": "default", "pod": "p1", "resource": "cpu", "workload": "w1"},
        {"__name__": "requests", "namespace": "default", "pod": "p3", "resource": "cpu", "workload": "w1"},
    ]


async def test_grafana_labels_post_form_with_match(env: Env) -> None:
    await _load(env)
    status, _, body = await _post(env, "/api/v1/labels", [("match[]", "requests"), ("start", "0.5"),
                                                          ("end", "600.5")])
    assert (status, body) == (200, {"status": "success",
                                    "data": ["__name__", "namespace", "pod", "resource", "workload"]})
    status, _, body = await _post(env, "/api/v1/labels", [("start", "0.5"), ("end", "600.5")])
    assert body["data"] == ["__name__", "namespace", "pod", "resource", "workload"]


async def test_grafana_label_values_with_match_as_label_values_variables_ask(env: Env) -> None:
    """`label_values(requests{workload="w0"}, pod)` in a dashboard variable becomes this GET."""
    await _load(env)
    status, _, body = await _get(env, "/api/v1/label/pod/values", [
        ("match[]", 'requests{workload="w0"}'), ("start", "0.123"), ("end", "600.456")])
    assert (status, body) == (200, {"status": "success", "data": ["p0", "p2"]})
    status, _, body = await _get(env, "/api/v1/label/workload/values", [
        ("match[]", 'requests{pod="p0"}'), ("match[]", 'cpu_seconds_total{pod="p1"}'), ("start", "0.1"),
        ("end", "600.9")])
    assert body["data"] == ["w0", "w1"]
    status, _, body = await _get(env, "/api/v1/label/__name__/values", [("start", "0.1"), ("end", "600.9")])
    assert body["data"] == ["cpu_seconds_total", "requests"]
    status, _, body = await _get(env, "/api/v1/label/pod/values", [("match[]", "requests"), ("start", "600.9"),
                                                                    ("end", "0.1")])
    assert status == 400 and body["errorType"] == "bad_data" and "end" in body["error"]


async def test_grafana_exemplars_post_form_is_an_empty_list(env: Env) -> None:
    await _load(env)
    status, _, body = await _post(env, "/api/v1/query_exemplars", [
        ("query", "rate(cpu_seconds_total[1m])"), ("start", "300.25"), ("end", "600.75")])
    assert (status, body) == (200, {"status": "success", "data": []})


async def test_grafana_buildinfo_and_metadata_field_by_field(env: Env) -> None:
    status, _, body = await _get(env, "/api/v1/status/buildinfo", [])
    assert status == 200 and body["status"] == "success"
    info = body["data"]
    assert set(info) >= {"version", "revision", "branch", "buildUser", "buildDate", "goVersion"}
    assert all(isinstance(info[k], str) for k in ("version", "revision", "branch", "buildUser", "buildDate",
                                                   "goVersion"))
    assert info["version"][0].isdigit()  # Grafana parses it as a semantic version to pick its API calls
    for params in ([], [("limit", "10000")], [("metric", "requests")]):
        status, _, body = await _get(env, "/api/v1/metadata", params)
        assert (status, body) == (200, {"status": "success", "data": {}})


async def test_grafana_format_query_post_form(env: Env) -> None:
    status, _, body = await _post(env, "/api/v1/format_query", [("query", "sum by(pod)(requests)")])
    assert (status, body) == (200, {"status": "success", "data": "sum by (pod) (requests)"})
