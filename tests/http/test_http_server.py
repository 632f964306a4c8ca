"""The server's behaviour around the handlers: limits, timeouts, gzip, access logs, shutdown."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from http_fixtures import Env, start_env

from metricsd.http import HttpSettings, stop_http
from metricsd.proto import metricsd_pb2 as pb


async def _stop(env: Env) -> None:
    await env.session.close()
    await stop_http(env.runner)  # type: ignore[arg-type]


async def test_large_responses_are_gzipped_when_accepted() -> None:
    assert HttpSettings().gzip_min_bytes == 32 * 1024  # a dashboard panel's few KiB go as they are
    env = await start_env(HttpSettings(gzip_min_bytes=1024, access_log=False))
    try:
        async with env.session.get(env.url + "/api/v1/metricsd/openapi.json",
                                   headers={"Accept-Encoding": "gzip"}) as r:
            assert r.status == 200
            assert r.headers["Content-Encoding"] == "gzip"
            assert (await r.json())["openapi"].startswith("3.")
        async with env.session.get(env.url + "/api/v1/metricsd/openapi.json",
                                   headers={"Accept-Encoding": "identity"}) as r:
            assert "Content-Encoding" not in r.headers
        async with env.session.get(env.url + "/api/v1/metadata", headers={"Accept-Encoding": "gzip"}) as r:
            assert "Content-Encoding" not in r.headers  # too small to be worth it
    finally:
        await _stop(env)


async def test_request_bodies_over_the_limit_are_413() -> None:
    env = await start_env(HttpSettings(client_max_size=1024, access_log=False))
    try:
        async with env.session.post(env.url + "/api/v1/query", data={"query": "x" * 2000}) as r:
            assert r.status == 413
            body = await r.json()
        assert body["errorType"] == "too_large"
        assert "1024 bytes" in body["error"]
    finally:
        await _stop(env)


async def test_a_request_past_the_timeout_is_503() -> None:
    env = await start_env(HttpSettings(request_timeout_s=0.05, access_log=False))
    never = asyncio.Event()

    async def stuck(request: pb.ReadRequest) -> pb.ReadResponse:
        await never.wait()
        raise AssertionError("unreachable")

    env.backend.read = stuck  # type: ignore[method-assign]
    env.backend.read_columns = None  # type: ignore[attr-defined]  # no in-process shortcut: reads go through read()
    env.backend.read_selection = None  # type: ignore[attr-defined]
    try:
        async with env.session.get(env.url + "/api/v1/query", params={"query": "up"}) as r:
            assert r.status == 503
            assert (await r.json())["errorType"] == "timeout"
        env_settings_timeout = {"query": "up", "timeout": "0.01"}
        async with env.session.get(env.url + "/api/v1/query", params=env_settings_timeout) as r:
            assert r.status == 503
            assert (await r.json())["error"] == "query timed out in expression evaluation"
    finally:
        await _stop(env)


async def test_shutdown_lets_requests_in_flight_finish() -> None:
    env = await start_env()
    entered, release = asyncio.Event(), asyncio.Event()
    real_read = env.backend.read

    async def slow(request: pb.ReadRequest) -> pb.ReadResponse:
        entered.set()
        await release.wait()
        return await real_read(request)

    env.backend.read = slow  # type: ignore[method-assign]
    env.backend.read_columns = None  # type: ignore[attr-defined]  # no in-process shortcut: reads go through read()
    env.backend.read_selection = None  # type: ignore[attr-defined]
    port = int(env.url.rsplit(":", 1)[1])
    in_flight = asyncio.create_task(env.session.get(env.url + "/api/v1/query", params={"query": "up"}))
    await entered.wait()
    stopping = asyncio.create_task(stop_http(env.runner))  # type: ignore[arg-type]
    for _ in range(20):  # let the listener close
        await asyncio.sleep(0)
    release.set()
    resp = await in_flight
    assert resp.status == 200
    assert (await resp.json())["status"] == "success"
    resp.release()
    await stopping
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/api/v1/metadata"):
            pass
    await env.session.close()


async def test_access_log_has_a_line_per_request(caplog: pytest.LogCaptureFixture) -> None:
    env = await start_env(HttpSettings(access_log=True))
    try:
        with caplog.at_level(logging.INFO, logger="metricsd.http.access"):
            async with env.session.get(env.url + "/api/v1/status/buildinfo") as r:
                assert r.status == 200
            await asyncio.sleep(0)
    finally:
        await _stop(env)
    lines = [r.getMessage() for r in caplog.records if r.name == "metricsd.http.access"]
    assert any('"GET /api/v1/status/buildinfo HTTP/1.1" 200' in line for line in lines), lines


async def test_root_is_the_dashboard(env: Env) -> None:
    async with env.session.get(env.url + "/") as r:
        assert r.status == 200
        assert r.content_type == "text/html"


async def test_serve_http_is_what_metricsd_up_calls() -> None:
    from prometheus_client import CollectorRegistry

    from metricsd.clock import SystemClock
    from metricsd.http import serve_http
    from metricsd.store.api import LocalBackend, StoreAPI
    from metricsd.store.engine import Store

    runner, port = await serve_http(LocalBackend(StoreAPI(Store())), "127.0.0.1", 0, CollectorRegistry(),
                                    SystemClock())
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/api/v1/query",
                                                       params={"query": "vector(1)"}) as r:
            assert (await r.json())["data"]["result"][0]["value"][1] == "1"
    finally:
        await stop_http(runner)
