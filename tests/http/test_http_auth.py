"""The HTTP API with TLS and bearer tokens on a real server on 127.0.0.1: 401 and 403 in
Prometheus' error shape, the open routes, the role each route needs, and client certificates on a
listener given a client CA (required without tokens; with tokens asked for, checked when presented,
not required, so a browser reaches the dashboard)."""

from __future__ import annotations

import argparse
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from metricsd.clock import SystemClock
from metricsd.cmd.security import server_from_args
from metricsd.http.server import serve_http, stop_http
from metricsd.security.auth import Authenticator
from metricsd.security.certs import LocalPKI, create_local_pki
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


async def _serve(security: ServerSecurity) -> tuple[web.AppRunner, str]:
    runner, port = await serve_http(LocalBackend(StoreAPI(Store())), "127.0.0.1", 0, CollectorRegistry(),
                                    SystemClock(), security=security)
    return runner, f"https://127.0.0.1:{port}"


async def _get(url: str, ca: Path, cert: LocalPKI | None = None, token: str | None = None) -> int:
    """The status of a GET over TLS trusting ``ca``, presenting ``cert``'s certificate when given."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(cert.cert, cert.key)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s, \
            s.get(url, headers=headers) as resp:
        await resp.read()
        return resp.status


async def test_with_a_client_ca_and_tokens_a_browser_without_a_certificate_is_admitted_by_its_token(
        pki: LocalPKI, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"graf read {hash_token('r')}\n")
    other = create_local_pki(tmp_path / "other")  # a certificate of another CA
    runner, url = await _serve(ServerSecurity(ServerTLS(pki.cert, pki.key, pki.ca, require_http_client_cert=False),
                                              Authenticator(TokenFile(tokens))))
    try:
        assert await _get(f"{url}/", pki.ca) == 200  # the page, without certificate or token
        assert await _get(f"{url}/static/app.js", pki.ca) == 200
        assert await _get(f"{url}/api/v1/query?query=1", pki.ca) == 401
        assert await _get(f"{url}/api/v1/query?query=1", pki.ca, token="r") == 200
        assert await _get(f"{url}/api/v1/query?query=1", pki.ca, cert=pki) == 401  # a certificate is no token
        assert await _get(f"{url}/api/v1/query?query=1", pki.ca, cert=pki, token="r") == 200
        with pytest.raises(aiohttp.ClientError):  # a certificate presented must chain to the client CA
            await _get(f"{url}/", pki.ca, cert=other, token="r")
    finally:
        await stop_http(runner)


async def test_with_a_client_ca_and_no_tokens_every_client_needs_a_certificate(pki: LocalPKI) -> None:
    runner, url = await _serve(ServerSecurity(ServerTLS(pki.cert, pki.key, pki.ca)))
    try:
        with pytest.raises(aiohttp.ClientError):
            await _get(f"{url}/", pki.ca)
        assert await _get(f"{url}/api/v1/query?query=1", pki.ca, cert=pki) == 200
    finally:
        await stop_http(runner)


def test_the_flags_require_http_client_certificates_only_where_no_token_is_checked(pki: LocalPKI,
                                                                                  tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("")
    flags = {"tls_cert": pki.cert, "tls_key": pki.key, "tls_client_ca": pki.ca}
    with_tokens = server_from_args(argparse.Namespace(**flags, tokens_file=tokens))
    without = server_from_args(argparse.Namespace(**flags, tokens_file=None))
    assert with_tokens.tls is not None and with_tokens.tls.require_http_client_cert is False
    assert with_tokens.tls.mutual  # gRPC still requires the certificate
    assert without.tls is not None and without.tls.require_http_client_cert is True
