"""The senders' HTTP/1.1 client (onward/post.py) against real HTTP servers on 127.0.0.1: aiohttp's
server for the usual answers, and a raw asyncio server for the ones aiohttp would not give
(chunked, a body to the end of the connection, a connection closed while idle, silence, not HTTP)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web
from onward_peers import free_port

from metricsd.onward.post import Poster, PostError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(r: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await r.readuntil(b"\r\n\r\n")
    n = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    return head, await r.readexactly(n)


async def _raw(handler: Handler) -> tuple[asyncio.Server, int]:
    port = free_port()
    return await asyncio.start_server(handler, "127.0.0.1", port), port


async def test_a_post_reaches_a_real_server_whole_and_its_connection_is_kept() -> None:
    got: list[tuple[bytes, str, str]] = []
    peers: set[object] = set()

    async def write(request: web.Request) -> web.Response:
        got.append((await request.read(), request.headers["Content-Encoding"], request.headers["Host"]))
        peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        if len(got) == 2:
            return web.Response(status=400, text="out of order sample")
        return web.Response(status=204, headers={"X-Prometheus-Remote-Write-Samples-Written": "7"})

    app = web.Application(client_max_size=8 << 20)
    app.router.add_post("/api/v1/write", write)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    poster = Poster(f"http://127.0.0.1:{port}/api/v1/write", ssl_context=None, timeout_s=10)
    try:
        body = bytes(range(256)) * 4000  # 1 MB
        a = await poster.post(body, {"Content-Encoding": "snappy"})
        b = await poster.post(b"x", {"Content-Encoding": "snappy"})
        c = await poster.post(b"", {"Content-Encoding": "snappy"})
        assert (a.status, a.headers["x-prometheus-remote-write-samples-written"]) == (204, "7")
        assert (b.status, b.body) == (400, b"out of order sample")
        assert c.status == 204
        assert got == [(body, "snappy", f"127.0.0.1:{port}"), (b"x", "snappy", f"127.0.0.1:{port}"),
                       (b"", "snappy", f"127.0.0.1:{port}")]
        assert len(peers) == 1  # one connection for the three
    finally:
        await poster.close()
        await runner.cleanup()


async def test_chunked_and_to_the_end_answers_are_read_and_a_closed_idle_connection_is_replaced() -> None:
    answers = [b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5\r\nhello\r\n6;x=y\r\n world\r\n0\r\n\r\n",
               b"HTTP/1.0 200 OK\r\nX-A: b\r\n\r\nto the end",
               b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nConnection: keep-alive\r\n\r\n"]
    bodies: list[bytes] = []
    connections = 0
    dropped = asyncio.Event()  # the server closed a connection it had answered on with nothing left to say

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while answers:
                _, body = await _read_request(r)
                bodies.append(body)
                answer = answers.pop(0)
                w.write(answer)
                await w.drain()
                if answer.startswith(b"HTTP/1.0") or len(answers) == 0:
                    break  # the end of the body, or a connection the server drops while it is idle
        finally:
            w.close()
            if not answers:
                dropped.set()

    server, port = await _raw(serve)
    poster = Poster(f"http://127.0.0.1:{port}/w?x=1", ssl_context=None, timeout_s=10)
    try:
        a = await poster.post(b"1", {})
        assert (a.status, a.body) == (500, b"hello world")
        b = await poster.post(b"2", {})
        assert (b.status, b.body, b.headers) == (200, b"to the end", {"x-a": "b"})
        c = await poster.post(b"3", {})
        assert c.status == 204
        await asyncio.wait_for(dropped.wait(), 5.0)  # the server closed the kept connection
        answers.append(b"HTTP/1.1 204 No Content\r\n\r\n")
        d = await poster.post(b"4", {})  # written to the closed one, then again on a new one
        assert d.status == 204 and bodies == [b"1", b"2", b"3", b"4"] and connections == 3
    finally:
        await poster.close()
        server.close()


@pytest.mark.parametrize("answer", [None, b"SSH-2.0-OpenSSH\r\n", b"HTTP/1.1 204 OK\r\nX" + b"x" * 70_000])
async def test_no_answer_a_wrong_one_or_none_in_time_is_a_post_error(answer: bytes | None) -> None:
    writers: list[asyncio.StreamWriter] = []

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        writers.append(w)
        await _read_request(r)
        if answer is None:
            await asyncio.sleep(30)  # never answers
        else:
            w.write(answer)
            await w.drain()
            await asyncio.sleep(30)
        w.close()

    server, port = await _raw(serve)
    poster = Poster(f"http://127.0.0.1:{port}/", ssl_context=None, timeout_s=0.5)
    try:
        with pytest.raises(PostError):
            await poster.post(b"x", {})
    finally:
        await poster.close()
        server.close()
        for w in writers:
            w.close()
        await asyncio.sleep(0)


async def test_a_refused_connection_is_a_post_error() -> None:
    poster = Poster(f"http://127.0.0.1:{free_port()}/", ssl_context=None, timeout_s=5)
    with pytest.raises(PostError):
        await poster.post(b"x", {})
