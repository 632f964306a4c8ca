"""The hot path (metricsd/http/hotpath.py) on a real server on 127.0.0.1: the same answers as
aiohttp's route, requests in order on one connection, a connection handed to aiohttp for anything
else, and hostile clients (a huge head, a trickled head, a pipelined flood that does not read) meet
aiohttp's limits while other clients are answered."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from http_fixtures import Env, pod_labels, running_env, start_env
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from metricsd.clock import SystemClock
from metricsd.http import HttpSettings, serve_http, stop_http
from metricsd.http.hotpath import GZIP_ON_LOOP, MAX_BODY, MAX_HEAD, MAX_PENDING, HotSite, parse_request
from metricsd.security.auth import Authenticator
from metricsd.security.certs import LocalPKI
from metricsd.security.settings import ServerSecurity
from metricsd.security.tls import ServerTLS
from metricsd.security.tokens import TokenFile, hash_token
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

GET = b"GET /api/v1/query?query=up HTTP/1.1\r\nHost: x\r\n\r\n"


# --- parse_request: which requests the hot path answers (pure) -----------------------------------

def test_a_simple_get_and_a_form_post_are_taken() -> None:
    req = parse_request(GET + b"rest")
    assert req is not None and req.name == "/api/v1/query" and req.size == len(GET)
    params, chosen = req.params()
    assert params.get("query") == "up" and chosen is None
    body = b"query=rate(x%5B5m%5D)&start=1&end=2&step=1"
    post = (b"POST /api/v1/query_range?consistency=quorum HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: " + str(len(body)).encode()
            + b"\r\n\r\n" + body)
    req = parse_request(post)
    assert req is not None and req.name == "/api/v1/query_range" and req.size == len(post)
    params, chosen = req.params()
    assert params.get("query") == "rate(x[5m])" and params.get("step") == "1" and chosen == "quorum"


@pytest.mark.parametrize("raw", [
    b"GET /api/v1/series?match[]=up HTTP/1.1\r\n\r\n",  # another route
    b"GET /api/v1/query?query=up HTTP/1.0\r\n\r\n",  # another version
    b"HEAD /api/v1/query?query=up HTTP/1.1\r\n\r\n",
    b"GET /api/v1/query?query=up HTTP/1.1\r\nAccept: x\r\n",  # the head not whole yet
    b"GET /api/v1/query?query=up HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"GET /api/v1/query?query=up HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
    b"GET /api/v1/query?query=up HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
    b"GET /api/v1/query?query=up HTTP/1.1\r\nAuthorization: Bearer a\r\nauthorization: Bearer b\r\n\r\n",
    b"GET /api/v1/query?query=up HTTP/1.1\r\nX-A: 1\r\n folded\r\n\r\n",
    b"GET /api/v1/query?query=up HTTP/1.1\r\nX-A : 1\r\n\r\n",
    b"GET /api/v1/query?query=up HTTP/1.1\r\nX-A: 1\nX-B: 2\r\n\r\n",  # a bare LF
    b"GET /api/v1/query?query=\xc3\xa9 HTTP/1.1\r\n\r\n",  # not ASCII
    b"GET /api/v1/query?query=up HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",  # a GET with a body
    b"POST /api/v1/query HTTP/1.1\r\nContent-Length: 10\r\n\r\nquery=",  # the body not whole yet
    b"POST /api/v1/query HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    b"GET /api/v1/query?query=up HTTP/1.1\r\nX-Big: " + b"a" * MAX_HEAD + b"\r\n\r\n",
    b"POST /api/v1/query HTTP/1.1\r\nContent-Length: " + str(MAX_BODY + 1).encode() + b"\r\n\r\n"
    + b"q" * (MAX_BODY + 1),
])
def test_anything_else_goes_to_aiohttp(raw: bytes) -> None:
    with_host = raw.replace(b"\r\n", b"\r\nHost: x\r\n", 1)  # each case's own defect refuses it
    assert parse_request(with_host) is None


def test_a_request_without_host_goes_to_aiohttp_which_answers_400() -> None:
    assert parse_request(b"GET /api/v1/query?query=up HTTP/1.1\r\n\r\n") is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from([b"", GET, b"POST /api/v1/query HTTP/1.1\r\nContent-Length: 5"]))
def test_any_bytes_are_taken_whole_or_handed_over(tail: bytes, prefix: bytes) -> None:
    req = parse_request(prefix + tail)
    assert req is None or 0 < req.size <= len(prefix + tail)


# --- a real server -------------------------------------------------------------------------------

@pytest.fixture
async def hot() -> AsyncIterator[Env]:
    async with running_env(HttpSettings(access_log=False, client_max_size=1 << 20)) as e:
        await e.write({pod_labels("up", "p1"): ([590_000], [1.0]), pod_labels("up", "p2"): ([590_000], [2.0])})
        yield e


def _port(env: Env) -> int:
    return int(env.url.rsplit(":", 1)[1])


async def _response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(lines[0].split()[1]), headers, body


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


async def test_the_hot_path_answers_as_aiohttp_does() -> None:
    envs = [await start_env(HttpSettings(access_log=False, hot_path=on)) for on in (True, False)]
    try:
        for e in envs:
            await e.write({pod_labels("up", "p1"): ([590_000], [1.0]), pod_labels("up", "p2"): ([590_000], [2.5])})
        asks = [("get", "/api/v1/query", {"query": "sum(up)"}), ("get", "/api/v1/query", {"query": "up"}),
                ("post", "/api/v1/query", {"query": "up", "time": "595"}),
                ("get", "/api/v1/query_range", {"query": "rate(up[5m])", "start": "500", "end": "600", "step": "10"}),
                ("post", "/api/v1/query_range", {"query": "up", "start": "500", "end": "600", "step": "10"}),
                ("get", "/api/v1/query", {}), ("get", "/api/v1/query", {"query": "up{"}),
                ("get", "/api/v1/query", {"query": "up", "time": "yesterday"}),
                ("get", "/api/v1/query", {"query": "up", "consistency": "bogus"}),
                ("get", "/api/v1/query_range", {"query": "up", "start": "600", "end": "500", "step": "10"})]
        for method, path, params in asks:
            got = []
            for e in envs:
                kw = {"params": params} if method == "get" else {"data": params}
                async with e.session.request(method, e.url + path, **kw) as r:  # type: ignore[arg-type]
                    got.append((r.status, r.content_type, json.loads(await r.read())))
            assert got[0] == got[1], (method, path, params)
        text = generate_latest(envs[0].registry).decode()
        hot_counts = [ln for ln in text.splitlines() if "requests_total" in ln and "/api/v1/query" in ln]
        assert any('code="400"' in ln for ln in hot_counts) and any('code="200"' in ln for ln in hot_counts)
    finally:
        for e in envs:
            await e.close()


async def test_pipelined_requests_are_answered_in_order_and_other_routes_hand_the_connection_over(hot: Env) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(hot))
    try:
        writer.write(_get("/api/v1/query?query=sum(up)") + _get("/api/v1/query?query=count(up)")
                     + _get("/api/v1/query?query=max(up)"))
        values = []
        for _ in range(3):
            status, _, body = await _response(reader)
            assert status == 200
            values.append(json.loads(body)["data"]["result"][0]["value"][1])
        assert values == ["3", "2", "2"]
        # another route: aiohttp answers it, and then the rest of this connection
        writer.write(_get("/api/v1/status/buildinfo") + _get("/api/v1/query?query=min(up)"))
        status, _, body = await _response(reader)
        assert status == 200 and json.loads(body)["data"]["application"] == "metricsd"
        status, _, body = await _response(reader)
        assert status == 200 and json.loads(body)["data"]["result"][0]["value"][1] == "1"
    finally:
        writer.close()


async def test_a_head_sent_in_pieces_is_answered(hot: Env) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(hot))
    try:
        raw = _get("/api/v1/query?query=sum(up)")
        writer.write(raw[:10])
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(raw[10:])
        status, _, body = await _response(reader)
        assert status == 200 and json.loads(body)["data"]["result"][0]["value"][1] == "3"
    finally:
        writer.close()


async def test_connection_close_is_honoured(hot: Env) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(hot))
    writer.write(b"GET /api/v1/query?query=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    status, headers, _ = await _response(reader)
    assert status == 200 and headers["connection"] == "close"
    assert await asyncio.wait_for(reader.read(), 5) == b""  # the server closed it
    writer.close()


async def _answered(env: Env) -> None:
    async with env.session.get(env.url + "/api/v1/query", params={"query": "sum(up)"}) as r:
        assert r.status == 200 and (await r.json())["data"]["result"][0]["value"][1] == "3"


async def test_a_huge_head_meets_aiohttps_limit_while_others_are_answered(hot: Env) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(hot))
    try:
        writer.write(b"GET /api/v1/query?query=up HTTP/1.1\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
        await _answered(hot)
        status, _, body = await asyncio.wait_for(_response(reader), 10)
        assert status in (400, 431) and body  # aiohttp's "Got more than 8190 bytes" answer
    finally:
        writer.close()


async def test_a_trickled_head_holds_no_one_up(hot: Env) -> None:
    """Slowloris: a head sent a byte at a time is aiohttp's to wait for; other clients are answered."""
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(hot))
    try:
        for b in b"GET /api/v1/query?query=sum(u":
            writer.write(bytes([b]))
            await writer.drain()
        await asyncio.wait_for(_answered(hot), 5)
        writer.write(b"p) HTTP/1.1\r\nHost: x\r\n\r\n")  # finished at last: still answered, by aiohttp
        status, _, body = await asyncio.wait_for(_response(reader), 10)
        assert status == 200 and json.loads(body)["data"]["result"][0]["value"][1] == "3"
    finally:
        writer.close()


async def test_a_pipelined_flood_that_is_not_read_holds_no_one_up(hot: Env) -> None:
    """A client that sends a thousand 2 KB queries of 10 KB answers without reading them: the
    answers fill the socket and the transport's write buffer, the connection stops answering, holds
    at most MAX_PENDING bytes more (plus one read) and stops reading; others are answered; every
    answer arrives in order once it reads."""
    n = 1000
    sites = [s for s in hot.runner.sites if isinstance(s, HotSite)]  # type: ignore[attr-defined]
    assert sites and sites[0].hot_server is not None
    conns = sites[0].hot_server.connections
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(hot))
    try:
        one = (b"GET /api/v1/query_range?query=vector(1)&start=0&end=1000&step=1 HTTP/1.1\r\nHost: x\r\n"
               b"X-Pad: " + b"p" * 2000 + b"\r\n\r\n")
        writer.write(one * n)
        port = writer.get_extra_info("sockname")[1]
        flood = None
        for _ in range(400):  # the server's side of this connection, once it is accepted
            mine = [c for c in conns if c.transport is not None and c.transport.get_extra_info("peername")[1] == port]
            if mine:
                (flood,) = mine
                break
            await asyncio.sleep(0.01)
        assert flood is not None
        for _ in range(400):  # until its answers fill the socket (a loaded machine: seconds)
            assert len(flood.buf) <= MAX_PENDING + 256 * 1024, len(flood.buf)  # held: MAX_PENDING and one read
            assert flood.read_paused or len(flood.buf) <= MAX_PENDING
            if flood.write_paused:
                break
            await asyncio.sleep(0.05)
        assert flood.write_paused
        await asyncio.wait_for(_answered(hot), 10)
        for _ in range(n):
            status, _, body = await asyncio.wait_for(_response(reader), 30)
            assert status == 200 and len(body) > 9_000
    finally:
        writer.close()


async def test_a_form_body_past_the_limit_is_413_and_a_small_one_answered() -> None:
    env = await start_env(HttpSettings(client_max_size=1024, access_log=False))
    try:
        async with env.session.post(env.url + "/api/v1/query", data={"query": "1+" * 600 + "1"}) as r:
            assert r.status == 413 and (await r.json())["errorType"] == "too_large"
        async with env.session.post(env.url + "/api/v1/query", data={"query": "1+1"}) as r:
            assert r.status == 200 and (await r.json())["data"]["result"][1] == "2"
    finally:
        await env.session.close()
        await stop_http(env.runner)  # type: ignore[arg-type]


async def test_stop_closes_idle_hot_connections_and_lets_one_in_flight_finish() -> None:
    hot = await start_env(HttpSettings(access_log=False))
    await hot.write({pod_labels("up", "p1"): ([590_000], [1.0])})
    idle_r, idle_w = await asyncio.open_connection("127.0.0.1", _port(hot))
    idle_w.write(_get("/api/v1/query?query=1"))
    assert (await _response(idle_r))[0] == 200
    slow_r, slow_w = await asyncio.open_connection("127.0.0.1", _port(hot))
    real = hot.backend.read_selection

    reading = asyncio.Event()

    async def slow(*args: object, **kwargs: object) -> object:
        reading.set()
        await asyncio.sleep(0.5)
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    hot.backend.read_selection = slow  # type: ignore[method-assign,assignment]
    slow_w.write(_get("/api/v1/query_range?query=rate(up[5m])&start=500&end=600&step=10"))
    await asyncio.wait_for(reading.wait(), 10)  # the query is in flight before the stop
    await stop_http(hot.runner)  # type: ignore[arg-type]
    status, _, _ = await asyncio.wait_for(_response(slow_r), 10)
    assert status == 200
    assert await asyncio.wait_for(idle_r.read(), 5) == b""
    idle_w.close()
    slow_w.close()
    await hot.session.close()


async def test_the_hot_path_writes_the_access_log(caplog: pytest.LogCaptureFixture) -> None:
    env = await start_env(HttpSettings(access_log=True))
    try:
        with caplog.at_level(logging.INFO, logger="metricsd.http.access"):
            async with env.session.get(env.url + "/api/v1/query", params={"query": "1"}) as r:
                assert r.status == 200
    finally:
        await env.session.close()
        await stop_http(env.runner)  # type: ignore[arg-type]
    lines = [r.getMessage() for r in caplog.records if r.name == "metricsd.http.access"]
    assert any('"GET /api/v1/query?query=1 HTTP/1.1" 200' in line for line in lines), lines


async def test_answers_past_the_gzip_size_are_gzipped_on_the_loop_or_a_thread() -> None:
    env = await start_env(HttpSettings(gzip_min_bytes=1024, access_log=False))
    try:
        series = {pod_labels("up", f"p{i}", extra_label="x" * 200): ([590_000], [float(i)]) for i in range(6000)}
        await env.write(series)
        for query, least in (("topk(20, up)", 1024), ("up", GZIP_ON_LOOP)):  # the loop's, then a thread's
            reader, writer = await asyncio.open_connection("127.0.0.1", _port(env))
            try:
                writer.write(f"GET /api/v1/query?query={query.replace(' ', '%20')} HTTP/1.1\r\nHost: x\r\n"
                             "Accept-Encoding: gzip\r\n\r\n".encode())
                status, headers, body = await asyncio.wait_for(_response(reader), 30)
            finally:
                writer.close()
            plain = zlib.decompress(body, wbits=31)
            assert status == 200 and headers["content-encoding"] == "gzip" and len(plain) > least
            assert len(json.loads(plain)["data"]["result"]) == (20 if query != "up" else 6000)
        async with env.session.get(env.url + "/api/v1/query", params={"query": "1"},
                                   headers={"Accept-Encoding": "gzip"}) as r:
            assert r.status == 200 and "Content-Encoding" not in r.headers  # too small to be worth it
    finally:
        await env.session.close()
        await stop_http(env.runner)  # type: ignore[arg-type]


async def test_over_tls_with_tokens_a_connection_answers_hot_then_hands_over(pki: LocalPKI, tmp_path: Path) -> None:
    """TLS and tokens on the hot path, then another route on the same TLS connection (the hand-off
    moves an encrypted transport to aiohttp), then the hot path's 401 again through aiohttp."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"graf read {hash_token('r')}\n")
    security = ServerSecurity(ServerTLS(pki.cert, pki.key), Authenticator(TokenFile(tokens)))
    runner, port = await serve_http(LocalBackend(StoreAPI(Store())), "127.0.0.1", 0, CollectorRegistry(),
                                    SystemClock(), security=security)
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")
    try:
        auth = "Authorization: Bearer r\r\n"
        writer.write(f"GET /api/v1/query?query=1%2B1 HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode()
                     + b"GET /api/v1/query?query=1 HTTP/1.1\r\nHost: x\r\n\r\n"
                     + f"GET /api/v1/status/buildinfo HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode()
                     + b"GET /api/v1/query?query=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, body = await asyncio.wait_for(_response(reader), 10)
        assert status == 200 and json.loads(body)["data"]["result"][1] == "2"
        status, headers, body = await asyncio.wait_for(_response(reader), 10)
        assert status == 401 and headers["www-authenticate"] == 'Bearer realm="metricsd"'
        assert json.loads(body)["errorType"] == "unauthorized"
        status, _, body = await asyncio.wait_for(_response(reader), 10)
        assert status == 200 and json.loads(body)["data"]["application"] == "metricsd"
        status, headers, _ = await asyncio.wait_for(_response(reader), 10)
        assert status == 401 and headers["www-authenticate"] == 'Bearer realm="metricsd"'
    finally:
        writer.close()
        await stop_http(runner)


async def test_a_query_keeps_its_connection_on_the_hot_path_and_another_route_hands_it_over(hot: Env) -> None:
    sites = [s for s in hot.runner.sites if isinstance(s, HotSite)]  # type: ignore[attr-defined]
    assert len(sites) == 1 and sites[0].hot_server is not None
    conns = sites[0].hot_server.connections
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(hot))
    try:
        writer.write(_get("/api/v1/query?query=sum(up)"))
        assert (await _response(reader))[0] == 200
        assert len(conns) == 1  # answered by the hot path, still its connection
        writer.write(_get("/api/v1/labels"))
        assert (await _response(reader))[0] == 200
        assert len(conns) == 0  # aiohttp's now
    finally:
        writer.close()
