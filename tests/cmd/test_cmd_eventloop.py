"""The event loop a metricsd process runs on (metricsd/cmd/eventloop.py)."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from metricsd.cmd import eventloop


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_asyncio_is_the_default_and_uvloop_is_one_variable_away(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eventloop.ENV, raising=False)
    assert eventloop.loop_factory() is None
    assert not issubclass(eventloop.run(_loop_type()), uvloop.Loop)
    monkeypatch.setenv(eventloop.ENV, "uvloop")
    assert issubclass(eventloop.run(_loop_type()), uvloop.Loop)
    monkeypatch.setenv(eventloop.ENV, "trio")
    with pytest.raises(ValueError, match="METRICSD_EVENT_LOOP='trio': use asyncio or uvloop"):
        eventloop.loop_factory()


def test_a_roles_own_variable_picks_that_roles_loop_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """METRICSD_EVENT_LOOP_PROXY=uvloop: the proxy on uvloop, every other process as before."""
    monkeypatch.delenv(eventloop.ENV, raising=False)
    monkeypatch.setenv(f"{eventloop.ENV}_PROXY", "uvloop")
    assert issubclass(eventloop.run(_loop_type(), "proxy"), uvloop.Loop)
    assert not issubclass(eventloop.run(_loop_type(), "store"), uvloop.Loop)
    assert not issubclass(eventloop.run(_loop_type()), uvloop.Loop)
    monkeypatch.setenv(eventloop.ENV, "uvloop")
    monkeypatch.setenv(f"{eventloop.ENV}_PROXY", "asyncio")  # the role's wins over every process's
    assert not issubclass(eventloop.run(_loop_type(), "proxy"), uvloop.Loop)
    monkeypatch.setenv(f"{eventloop.ENV}_PROXY", "trio")
    with pytest.raises(ValueError, match="METRICSD_EVENT_LOOP_PROXY='trio': use asyncio or uvloop"):
        eventloop.loop_factory("proxy")


async def _serve_and_ask() -> tuple[int, bytes, int]:
    """A store's HTTP API (its hot path) and read port on this loop, on 127.0.0.1, each asked once."""
    import aiohttp
    from prometheus_client import CollectorRegistry

    from metricsd.clock import SystemClock
    from metricsd.http.server import build_app, start_http, stop_http
    from metricsd.http.settings import HttpSettings
    from metricsd.proto import metricsd_pb2 as pb
    from metricsd.rpc.frames import Method
    from metricsd.rpc.readport import ReadPortServer
    from metricsd.rpc.readport_client import ReadPortClient
    from metricsd.store.api import LocalBackend, StoreAPI
    from metricsd.store.engine import Store

    backend = LocalBackend(StoreAPI(Store()))
    app = build_app(backend, settings=HttpSettings(), registry=CollectorRegistry(), clock=SystemClock())
    runner, port = await start_http(app, "127.0.0.1", 0)
    server = ReadPortServer(backend)
    client = ReadPortClient("127.0.0.1", await server.start("127.0.0.1", 0))
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http, http.get(f"http://127.0.0.1:{port}/api/v1/query",
                                                             params={"query": "1", "time": "1000"}) as r:
            status, body = r.status, await r.read()
        health = await client.call(Method.READ, pb.ReadRequest(start_ms=0, end_ms=1))
        return status, body, len(health.series)
    finally:
        await client.close()
        await server.stop()
        await stop_http(runner)


def test_the_http_hot_path_and_the_read_port_serve_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop's transports are not asyncio's classes: the hot path once refused every connection
    there (an isinstance check in connection_made)."""
    monkeypatch.setenv(eventloop.ENV, "uvloop")
    status, body, series = eventloop.run(_serve_and_ask())
    assert (status, series) == (200, 0)
    assert body == b'{"status":"success","data":{"resultType":"scalar","result":[1000,"1"]}}'
