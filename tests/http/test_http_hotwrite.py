"""Remote write on the hot path (metricsd/http/hotwrite.py) on a real server on 127.0.0.1: the same
answers as aiohttp's route (1.0, 2.0, bad bodies, bombs, refused samples, tokens), bodies arriving in
pieces, pipelined writes, and the connection kept by the hot path; bigger or stranger requests are
aiohttp's, and a client holding half a body holds no one else up. The remote-write modules' own
tests run on both paths too (tests/http/conftest.py ``write_path``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import cramjam
import pytest
from http_fixtures import Env, running_env
from prometheus_client import CollectorRegistry, generate_latest
from test_http_hotpath import _port, _response
from test_http_remote_write import HEADERS, _payload
from test_http_remote_write_v2 import HEADERS as V2_HEADERS
from test_http_remote_write_v2 import encode as encode_v2

from metricsd.clock import SystemClock
from metricsd.http import HttpSettings, build_app, start_http, stop_http
from metricsd.http.hotpath import MAX_HEAD, HotSite, parse_request
from metricsd.http.hotwrite import MAX_WRITE_BODY, WRITE_PATH
from metricsd.security.auth import Authenticator
from metricsd.security.tokens import TokenFile, hash_token
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

POD = {"__name__": "up", "namespace": "shop", "pod": "cart-1"}


def _write(body: bytes, headers: dict[str, str] | None = None, query: str = "") -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers if headers is not None else HEADERS).items())
    return (f"POST /api/v1/write{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
            .encode() + body)


# --- parse_request: which writes the hot path takes (pure) ---------------------------------------

def test_a_whole_write_is_taken_and_one_still_arriving_waits_for_its_bytes() -> None:
    raw = _write(b"x" * 1000)
    req = parse_request(raw + b"next", max_write_body=MAX_WRITE_BODY)
    assert not isinstance(req, int) and req is not None
    assert req.name == WRITE_PATH and req.size == len(raw) and req.body == b"x" * 1000
    assert parse_request(raw[:-10], max_write_body=MAX_WRITE_BODY) == len(raw)  # wait for the rest
    assert parse_request(raw[:-1000], max_write_body=MAX_WRITE_BODY) == len(raw)  # the head alone too
    assert parse_request(raw[:30], max_write_body=MAX_WRITE_BODY) == 31  # the head not whole: a byte more
    assert parse_request(raw[:30], max_write_body=0) is None
    assert parse_request(raw[:5], max_write_body=MAX_WRITE_BODY) == 6  # "POST " may be a write
    assert parse_request(b"POST /api/v1/query", max_write_body=MAX_WRITE_BODY) is None


@pytest.mark.parametrize("raw, max_write_body", [
    (_write(b"x" * 1000), 0),  # no hot writes (hot_write off)
    (_write(b""), 0),  # not even an empty one
    (_write(b"x" * 1000), 999),  # a body past the hot path's bound: aiohttp's
    (_write(b"x" * 1000).replace(b"POST", b"GET", 1), MAX_WRITE_BODY),
    (_write(b"x" * 10).replace(b"HTTP/1.1", b"HTTP/1.0", 1), MAX_WRITE_BODY),
    (_write(b"x" * 10).replace(b"Content-Length", b"Transfer-Encoding: chunked\r\nContent-Length", 1),
     MAX_WRITE_BODY),
    (_write(b"x" * 10).replace(b"Content-Length: 10", b"Content-Length: -1", 1), MAX_WRITE_BODY),
    (_write(b"x" * 10).replace(b"/api/v1/write", b"/api/v1/writes", 1), MAX_WRITE_BODY),
    (_write(b"", {"X-Big": "a" * MAX_HEAD}), MAX_WRITE_BODY),
])
def test_other_writes_go_to_aiohttp(raw: bytes, max_write_body: int) -> None:
    assert parse_request(raw, max_write_body=max_write_body) is None


# --- a real server -------------------------------------------------------------------------------

@pytest.fixture
async def hot() -> AsyncIterator[Env]:
    async with running_env(HttpSettings(access_log=False, client_max_size=2 * MAX_WRITE_BODY)) as e:
        yield e


def _connections(env: Env) -> set[Any]:
    sites = [s for s in env.runner.sites if isinstance(s, HotSite)]  # type: ignore[attr-defined]
    assert len(sites) == 1 and sites[0].hot_server is not None
    return sites[0].hot_server.connections


def _body(pod: str, t_ms: int, v: float) -> bytes:
    return _payload([({**POD, "pod": pod}, [(t_ms, v)])])


async def _values(env: Env) -> list[tuple[str, str]]:
    async with env.session.get(env.url + "/api/v1/query", params={"query": "up", "time": "599"}) as r:
        assert r.status == 200
        return sorted((x["metric"]["pod"], x["value"][1]) for x in (await r.json())["data"]["result"])


async def test_the_hot_path_answers_writes_as_aiohttp_does(tmp_path: Path) -> None:
    """Every answer of the route, byte for byte but the date, through both paths: stored, refused in
    part, bad snappy, a bomb's header, bad protobuf, a series without pod, 415, a bad encoding, a bad
    consistency, no token, a read token, a write token; and the same samples stored."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"graf read {hash_token('r')}\nprom write {hash_token('w')}\n")
    envs = []
    for hot_write in (True, False):
        store, registry = Store(), CollectorRegistry()
        app = build_app(LocalBackend(StoreAPI(store)), settings=HttpSettings(access_log=False, hot_write=hot_write),
                        registry=registry, clock=SystemClock(), auth=Authenticator(TokenFile(tokens)))
        runner, port = await start_http(app, "127.0.0.1", 0)
        envs.append((store, runner, port, registry))
    w = {"Authorization": "Bearer w"}
    bomb = b"\x80\x80\x80\x80\x04" + b"\x00" * 64  # a block declaring 1 GiB
    now = int(SystemClock().now_ms())
    asks: list[tuple[bytes, dict[str, str], str]] = [
        (_body("a", now - 60_000, 1.0), HEADERS | w, ""),
        (_payload([(POD, [(now - 50_000, 2.0), (now + 86_400_000, 3.0)])]), HEADERS | w, ""),  # a day ahead
        (b"not snappy", HEADERS | w, ""), (bomb, HEADERS | w, ""),
        (bytes(cramjam.snappy.compress_raw(b"\x0a\x05\x0a\x03")), HEADERS | w, ""),
        (_payload([({"__name__": "up"}, [(now, 1.0)])]), HEADERS | w, ""),
        (_body("a", now, 1.0), {**HEADERS, **w, "Content-Type": "application/x-protobuf;proto=io.x.Other"}, ""),
        (_body("a", now, 1.0), {**HEADERS, **w, "Content-Encoding": "gzip"}, ""),
        (_body("a", now, 1.0), HEADERS | w, "?consistency=bogus"),
        (bytes(cramjam.snappy.compress_raw(encode_v2([({**POD, "pod": "v2"}, [(now - 40_000, 4.0)])]))),
         V2_HEADERS | w, ""),
        (_body("b", now - 30_000, 5.0), HEADERS, ""), (_body("b", now - 30_000, 5.0), HEADERS | {"Authorization":
                                                                                             "Bearer r"}, ""),
    ]
    try:
        for body, headers, query in asks:
            got = []
            for _, _, port, _ in envs:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                try:
                    writer.write(_write(body, headers, query))
                    status, head, answer = await _response(reader)
                finally:
                    writer.close()
                head.pop("date")
                got.append((status, head, answer))
            assert got[0] == got[1], (headers, query, got)
        stored = [s.stats()["samples"] for s, *_ in envs]
        assert stored[0] == stored[1] and stored[0] > 0
        text = generate_latest(envs[0][3]).decode()
        counted = [ln for ln in text.splitlines() if ln.startswith("metricsd_http_requests_total")
                   and WRITE_PATH in ln]
        assert any('code="204"' in ln for ln in counted) and any('code="401"' in ln for ln in counted)
    finally:
        for _, runner, _, _ in envs:
            await stop_http(runner)


async def test_a_write_in_pieces_and_pipelined_writes_are_answered_on_the_hot_path(hot: Env) -> None:
    conns = _connections(hot)
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(hot))
    try:
        raw = _write(_body("a", 590_000, 1.0))
        for cut in (10, len(raw) - 20, len(raw) - 1):  # the head in pieces, then the body in pieces
            writer.write(raw[:cut])
            await writer.drain()
            await asyncio.sleep(0.02)
            raw = raw[cut:]
        writer.write(raw)
        status, headers, body = await _response(reader)
        assert status == 204 and body == b"" and "content-length" not in headers
        assert len(conns) == 1  # still the hot path's
        writer.write(_write(_body("b", 590_000, 2.0)) + _write(b"junk") + _write(_body("c", 590_000, 3.0)))
        assert (await _response(reader))[0] == 204
        status, _, body = await _response(reader)
        assert status == 400 and json.loads(body)["errorType"] == "bad_data"
        assert (await _response(reader))[0] == 204
        assert len(conns) == 1
        assert await _values(hot) == [("a", "1"), ("b", "2"), ("c", "3")]
    finally:
        writer.close()


async def test_a_write_past_the_hot_bound_is_aiohttps(hot: Env) -> None:
    """A body over MAX_WRITE_BODY is read by aiohttp, which then has the connection; past
    client_max_size it answers 413, as before."""
    conns = _connections(hot)
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(hot))
    try:
        writer.write(_write(_body("a", 590_000, 1.0)))
        assert (await _response(reader))[0] == 204 and len(conns) == 1
        writer.write(_write(b"\x00" * (MAX_WRITE_BODY + 1)))  # past the hot bound: aiohttp's (and bad snappy)
        status, _, body = await _response(reader)
        assert status == 400 and json.loads(body)["errorType"] == "bad_data"
        assert len(conns) == 0
        writer.write(_write(b"\x00" * (2 * MAX_WRITE_BODY + 1)))  # past client_max_size
        assert (await _response(reader))[0] == 413
    finally:
        writer.close()


async def test_a_client_holding_half_a_body_holds_no_one_up(hot: Env) -> None:
    slow_reader, slow = await asyncio.open_connection("127.0.0.1", _port(hot))
    try:
        raw = _write(_body("slow", 590_000, 9.0))
        slow.write(raw[: len(raw) // 2])
        await slow.drain()
        for i in range(5):  # others write and read meanwhile
            async with hot.session.post(hot.url + "/api/v1/write", data=_body(f"p{i}", 590_000, float(i)),
                                        headers=HEADERS) as r:
                assert r.status == 204
        assert len(await _values(hot)) == 5
        slow.write(raw[len(raw) // 2:])
        assert (await _response(slow_reader))[0] == 204
        assert ("slow", "9") in await _values(hot)
    finally:
        slow.close()


async def test_a_big_write_pipelined_behind_another_is_read_in_full(hot: Env) -> None:
    """Bytes past MAX_PENDING arriving while an answer is due pause reading; a write still incomplete
    after that answer must resume it, or the connection would wait for ever."""
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(hot))
    try:
        big = _write(b"\x01" * (MAX_WRITE_BODY - 1000))  # bad snappy: a 400 once the whole body is read
        query = b"GET /api/v1/query?query=count_over_time(up%5B10m%5D) HTTP/1.1\r\nHost: x\r\n\r\n"
        for _ in range(3):  # a query first: its answer takes a few loop turns, while the write's bytes pile up
            writer.write(query + big)
            assert (await _response(reader))[0] == 200
            status, _, body = await asyncio.wait_for(_response(reader), 30)
            assert status == 400 and "snappy" in json.loads(body)["error"]
        assert len(_connections(hot)) == 1
    finally:
        writer.close()
