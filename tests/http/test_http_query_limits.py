"""Hostile PromQL over real HTTP: a query past a limit is refused at once, in Prometheus' error
shape, while other requests keep being answered; the loop-lag metric shows the loop never stalled."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator
from urllib.parse import urlencode

import pytest
from http_fixtures import Env, pod_labels, running_env, start_env

from metricsd.http import stop_http
from metricsd.http.settings import HttpSettings
from metricsd.promql.limits import QueryLimits

HOSTILE = {
    "1+1 chain of 5,000 terms": ("+".join(["1"] * 5000), "binary operators"),
    "x+ chain of 2,000 terms": ("+".join(["x"] * 2000), "binary operators"),
    "parentheses 10,000 deep": ("(" * 10_000 + "x" + ")" * 10_000, "characters long"),
    "parentheses 500 deep": ("(" * 500 + "x" + ")" * 500, "levels deep"),
    "a 1 MiB query": ("x" * (1 << 20), "characters long"),
}


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async with running_env(HttpSettings(access_log=False, query_limits=QueryLimits(max_concurrency=2,
                                                                                   max_queued=0))) as e:
        await e.write({pod_labels("x", "p0"): ([590_000], [1.0])})
        yield e


async def _post_query(env: Env, query: str) -> tuple[int, dict[str, object]]:
    body = io.BytesIO(urlencode({"query": query}).encode())
    async with env.session.post(f"{env.url}/api/v1/query", data=body,
                                headers={"Content-Type": "application/x-www-form-urlencoded"}) as resp:
        return resp.status, await resp.json()


async def _timed_get(env: Env, path: str, **params: str) -> tuple[int, dict[str, object], float]:
    t0 = time.perf_counter()
    async with env.session.get(f"{env.url}{path}", params=params) as resp:
        body = await resp.json()
        return resp.status, body, time.perf_counter() - t0


@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_a_hostile_query_is_refused_at_once_and_others_keep_being_answered(env: Env, name: str) -> None:
    query, why = HOSTILE[name]
    hostile = asyncio.create_task(_post_query(env, query))
    others = await asyncio.gather(*(_timed_get(env, "/api/v1/status/buildinfo") for _ in range(5)),
                                  _timed_get(env, "/api/v1/query", query="sum(x)", time="600"))
    status, body = await hostile
    assert status == 400 and body["errorType"] == "bad_data" and why in str(body["error"]), body
    assert all(s == 200 for s, _, _ in others)
    assert max(t for _, _, t in others) < 1.0
    assert others[-1][1]["data"]["result"][0]["value"][1] == "1"  # type: ignore[index]


async def test_the_loop_never_lagged_past_100_ms_under_the_hostile_queries(env: Env) -> None:
    for query, _ in HOSTILE.values():
        assert (await _post_query(env, query))[0] == 400
    await asyncio.sleep(0.2)  # one more turn of the lag monitor (50 ms) after the last request
    async with env.session.get(f"{env.url}/metrics") as resp:
        text = await resp.text()
    lag = next(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("metricsd_event_loop_lag_seconds "))
    assert 0.0 <= lag < 0.1, text
    assert 'metricsd_queries_refused_total{limit="max_operators"} 2.0' in text
    assert "metricsd_event_loop_stalls_total 0.0" in text


async def test_a_query_past_its_timeout_gets_503_timeout() -> None:
    env = await start_env(HttpSettings(access_log=False, request_timeout_s=1e-9))  # expired at the first await
    try:
        status, body, _ = await _timed_get(env, "/api/v1/query", query="sum(x)")
        assert status == 503 and body["errorType"] == "timeout", body
    finally:
        await env.session.close()
        await stop_http(env.runner)  # type: ignore[arg-type]


async def test_range_queries_are_capped_at_11000_points(env: Env) -> None:
    status, body, _ = await _timed_get(env, "/api/v1/query_range", query="x", start="0", end="11000", step="1")
    assert status == 400
    assert body["error"] == ("exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query "
                             "resolution (?step=XX)")
