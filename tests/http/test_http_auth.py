"""The HTTP API with TLS and bearer tokens on a real server on 127.0.0.1: 401 and 403 in
Prometheus' error shape, the open routes, and the role each route needs."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from metricsd.clock import SystemClock
from metricsd.http.server import serve_http, stop_http
from metricsd.security.auth import Authenticator
from metricsd.security.certs import LocalPKI
from metricsd.security.settings import ServerSecurity
from metricsd.security.tls import ServerTLS
from metricsd.security.tokens import TokenFile, hash_token
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store


@pytest.fixture
async def url(pki: LocalPKI, tmp_path: Path) -> AsyncIterator[str]:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"graf read {hash_token('r')}\nagent write {hash_token('w')}\n")
    security = ServerSecurity(ServerTLS(pki.cert, pki.key), Authenticator(TokenFile(tokens)))
    runner, port = await serve_http(LocalBackend(StoreAPI(Store())), "127.0.0.1", 0, CollectorRegistry(),
                                    SystemClock(), security=security)
    yield f"https://127.0.0.1:{port}"
    await stop_http(runner)


@pytest.fixture
async def session(pki: LocalPKI) -> AsyncIterator[aiohttp.ClientSession]:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
        yield s


async def test_no_token_is_401_with_a_bearer_challenge(url: str, session: aiohttp.ClientSession) -> None:
    async with session.get(f"{url}/api/v1/query", params={"query": "up"}) as resp:
        assert resp.status == 401 and resp.headers["WWW-Authenticate"] == 'Bearer realm="metricsd"'
        assert await resp.json() == {"status": "error", "errorType": "unauthorized",
                                     "error": "no bearer token: send 'Authorization: Bearer <token>'"}
    async with session.get(f"{url}/metrics", headers={"Authorization": "Bearer wrong"}) as resp:
        assert resp.status == 401 and (await resp.json())["error"] == "unknown or expired token"


async def test_a_role_opens_its_routes_only(url: str, session: aiohttp.ClientSession) -> None:
    read, write = {"Authorization": "Bearer r"}, {"Authorization": "Bearer w"}
    async with session.get(f"{url}/api/v1/query", params={"query": "1"}, headers=read) as resp:
        assert resp.status == 200 and (await resp.json())["status"] == "success"
    async with session.post(f"{url}/api/v1/write", data=b"", headers=read) as resp:
        assert resp.status == 403
        assert await resp.json() == {"status": "error", "errorType": "forbidden",
                                     "error": "graf (roles: read) may not call POST /api/v1/write: it needs role write"}
    async with session.get(f"{url}/api/v1/query", params={"query": "1"}, headers=write) as resp:
        assert resp.status == 403
    async with session.post(f"{url}/api/v1/write", data=b"not snappy", headers=write) as resp:
        assert resp.status == 400  # past authentication, refused for what it is


async def test_the_dashboard_page_is_open(url: str, session: aiohttp.ClientSession) -> None:
    async with session.get(f"{url}/") as resp:
        assert resp.status == 200


async def test_plain_http_to_the_tls_port_gets_no_answer(url: str) -> None:
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ClientError):
            async with s.get(url.replace("https://", "http://") + "/api/v1/query?query=1") as resp:
                await resp.read()
