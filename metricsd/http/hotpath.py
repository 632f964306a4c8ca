"""The hot path: ``/api/v1/query`` and ``/api/v1/query_range`` answered below aiohttp's web layer.

Grafana asks these two routes again and again, and aiohttp's per-request machinery (a task and two
futures a request, the request and response objects, the router, the middleware chain, the
response's header building) cost more CPU than a small query's evaluation (perf/RESULTS.md, issue 23
session 36). Every connection starts on :class:`HotProtocol`, an ``asyncio.Protocol`` that answers a
request itself only when it is plainly simple and already whole in the bytes received:

- an HTTP/1.1 GET, or a POST with a ``Content-Length`` body of at most :data:`MAX_BODY` bytes,
  of exactly one of the two paths, its request line and headers printable ASCII within
  :data:`MAX_HEAD` bytes, no ``Transfer-Encoding``, ``Expect``, ``Upgrade``, repeated header
  or header folding, and a ``Host`` (HTTP/1.1's, which aiohttp requires).

Remote write (``POST /api/v1/write``, a body of at most 1 MiB) is answered here too, by
metricsd/http/hotwrite.py: for it the connection waits until the head and body are whole.

Anything else (another route, a head or body not yet whole, a bigger or stranger request) hands the
connection over to aiohttp's own protocol for good, with the bytes received so far: aiohttp then
parses and answers it, and applies its limits (8,190-byte lines, 128 headers, the body limit
``client_max_size`` with 413) exactly as before. So a slow, huge or malformed request meets the same
stated limits and errors as on aiohttp, and only well-formed small queries take the short path.

A request answered here goes through the same steps as aiohttp's route: the read consistency
(``consistency`` parameter or header), bearer tokens (metricsd/http/auth.py ``refusal``), the
request timeout, the whole-query path on a proxy (metricsd/http/wholehttp.py), the Prometheus
API's handler body (metricsd/http/promapi.py), the error mapping and the request metrics of
metricsd/http/server.py, gzip past ``gzip_min_bytes``, and the access log. Requests on one
connection are answered in order (pipelining); while one is evaluated, further bytes are held, up
to :data:`MAX_PENDING` before reading pauses, and a client that does not read its answers pauses
the connection (the transport's write buffer limits).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
import zlib
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import parse_qsl

from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE
from multidict import MultiDict
from yarl import URL

from metricsd.clock import Clock
from metricsd.http.hotnow import Continued, NowQueries, NowRequest
from metricsd.http.hotroute import Answer, HotRoute
from metricsd.http.hotwrite import MAX_WRITE_BODY, WRITE_PATH, HotWrites
from metricsd.http.params import Params
from metricsd.http.settings import HttpSettings
from metricsd.http.wholehttp import WholeHttp, timed_out
from metricsd.rpc import consistency
from metricsd.rpc.consistency import CONSISTENCY_PARAM, Consistency
from metricsd.security.auth import Authenticator

__all__ = ["GZIP_ON_LOOP", "MAX_BODY", "MAX_HEAD", "MAX_PENDING", "HotQueries", "HotServer", "HotSite", "parse_request",
           "response_bytes"]

log = logging.getLogger("metricsd.http")
ACCESS_LOG = logging.getLogger("metricsd.http.access")

MAX_HEAD = 8190  # aiohttp's line limit: a longer request line and headers go to aiohttp
MAX_BODY = 64 * 1024  # a query's form body; larger ones go to aiohttp (413 past client_max_size)
MAX_PENDING = 256 * 1024  # bytes held while a request is answered, before reading pauses
IDLE_TIMEOUT_S = 75.0  # a connection with no request for this long is closed
GZIP_ON_LOOP = 1 << 20  # a larger answer is compressed on a worker thread, as aiohttp does

_PATHS = {b"/api/v1/query": "/api/v1/query", b"/api/v1/query_range": "/api/v1/query_range",
          b"/api/v1/write": WRITE_PATH}
_INSTANT = {"/api/v1/query": True, "/api/v1/query_range": False}
_WRITE_LINE = b"POST /api/v1/write "
_UNSAFE = frozenset({b"transfer-encoding", b"expect", b"upgrade"})
_UNPRINTABLE = re.compile(rb"[^\t\x20-\x7e]")
_FORM = "application/x-www-form-urlencoded"
_GZIP_HEADERS = "Content-Encoding: gzip\r\nVary: Accept-Encoding\r\n"


async def _ready(answer: Answer) -> Answer:
    return answer


class HotRequest:
    """One parsed request of the hot path: its route, parameters and the headers it reads."""

    __slots__ = ("body", "close", "headers", "line", "method", "name", "query", "size")

    def __init__(self, method: str, name: str, query: str, headers: dict[bytes, str], body: bytes, line: str,
                 size: int) -> None:
        self.method = method
        self.name = name
        self.query = query
        self.headers = headers
        self.body = body
        self.line = line
        self.size = size  # bytes of the buffer the request took
        self.close = "close" in headers.get(b"connection", "").lower()

    def params(self) -> tuple[Params, str | None]:
        """The query string's parameters, then a form body's (as metricsd/http/params.py reads
        them), and the query string's read consistency (server.py reads it there alone). The query
        string is decoded by yarl, as aiohttp's ``request.query``; a form body by parse_qsl, as
        aiohttp's ``request.post()``."""
        query = URL.build(query_string=self.query, encoded=True).query
        chosen = query.get(CONSISTENCY_PARAM)
        if self.body and self.headers.get(b"content-type", "").partition(";")[0].strip().lower() == _FORM:
            merged = MultiDict(query)
            merged.extend(parse_qsl(self.body.decode("utf-8", "replace"), keep_blank_values=True))
            return Params(merged), chosen
        return Params(query), chosen


def parse_request(buf: bytes, max_body: int = MAX_BODY, max_write_body: int = 0) -> HotRequest | int | None:
    """The first request in ``buf`` if the hot path answers it (whole, simple, one of the two routes,
    a body of at most ``max_body`` bytes, or a remote write's POST of at most ``max_write_body``, 0:
    none); None hands the connection to aiohttp. A remote write whose body is not all here yet gives
    the bytes the request takes: the connection waits for them (metricsd/http/hotwrite.py). Pure: no
    I/O, so it is tested on bytes alone."""
    end = buf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
    if end < 0:
        if max_write_body and len(buf) < MAX_HEAD and buf[:len(_WRITE_LINE)] == _WRITE_LINE[:len(buf)]:
            return len(buf) + 1  # a remote write's head still coming
        return None
    head = buf[:end]
    if _UNPRINTABLE.search(head.replace(b"\r\n", b"")) is not None:
        return None  # a bare CR or LF, a control or non-ASCII byte
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] != b"HTTP/1.1" or parts[0] not in (b"GET", b"POST"):
        return None
    path, _, query = parts[1].partition(b"?")
    name = _PATHS.get(path)
    if name is None:
        return None
    headers: dict[bytes, str] = {}
    for line in lines[1:]:
        key, sep, value = line.partition(b":")
        if not sep or not key or key != key.strip() or b" " in key or b"\t" in key:
            return None  # folding, a space before the colon, no name
        key = key.lower()
        if key in _UNSAFE or key in headers:  # a repeated header: aiohttp reads it as it does
            return None
        text = value.strip().decode("ascii")
        headers[key] = text
    if b"host" not in headers:
        return None  # aiohttp answers 400: HTTP/1.1 requires it
    length_text = headers.get(b"content-length", "0")
    if not length_text.isdigit() or len(length_text) > 9:
        return None
    length = int(length_text)
    write = name == WRITE_PATH
    if write and (not max_write_body or parts[0] != b"POST" or length > max_write_body):
        return None
    if (length > max_body and not write) or (length and parts[0] == b"GET"):
        return None
    size = end + 4 + length
    if len(buf) < size:
        return size if write else None  # a query's body not all here: aiohttp reads it
    return HotRequest(parts[0].decode(), name, query.decode("ascii"), headers, buf[end + 4:size],
                      lines[0].decode("ascii"), size)


class HotQueries(HotRoute[tuple[Params, Continued | None]]):
    """The two routes' answers from a parsed request: the steps of server.py's middleware, the auth
    middleware, the whole-query middleware and promapi.py's handlers, without aiohttp's objects.
    ``now``: a proxy's whole queries begun without a task (metricsd/http/hotnow.py), when ``whole``'s
    path can."""

    def __init__(self, bodies: dict[str, Callable[[Params], Awaitable[bytes]]], whole: WholeHttp | None,
                 settings: HttpSettings, counter: Any, auth: Authenticator | None, clock: Clock) -> None:
        super().__init__(settings, counter, auth, clock)
        self.bodies = bodies  # path -> the Prometheus API's body for its parameters
        self.whole = whole
        self.writes: HotWrites | None = None  # remote write on the hot path (build_app sets it)
        start_now = getattr(whole.path, "start_now", None) if whole is not None else None
        self.now = NowQueries(self, whole, start_now) if whole is not None and start_now is not None else None

    async def answer(self, req: HotRequest, peer: str, prepared: tuple[str | None, tuple[Params, Continued | None]]
                     | None = None, started: float | None = None, began: float | None = None) -> Answer:
        if req.name == WRITE_PATH and self.writes is not None:
            return await self.writes.answer(req, peer)
        return await super().answer(req, peer, prepared, started, began)

    def prepare(self, req: HotRequest) -> tuple[str | None, tuple[Params, Continued | None]]:
        params, text = req.params()
        return text, (params, None)

    async def run(self, req: HotRequest, state: tuple[Params, Continued | None], peer: str) -> Answer:
        params, continued = state
        if continued is not None and self.whole is not None:  # begun without a task (hotnow.py): no tokens
            try:
                got = await continued.resume()
            except TimeoutError:
                raise timed_out() from None
            return await self._whole_or_engine(req, params, self.whole.body(got, continued.started))
        refused = await self.identity(req, peer)
        if isinstance(refused, tuple):
            return refused
        body = None
        if self.whole is not None and consistency.current() is Consistency.ONE:
            body = await self.whole.answer(params, _INSTANT[req.name])
        return await self._whole_or_engine(req, params, body)

    async def _whole_or_engine(self, req: HotRequest, params: Params, body: bytes | None) -> Answer:
        """The whole query's body, or the engine's when the whole path gave none (a query it does
        not take, or stores that could not answer whole)."""
        return 200, body if body is not None else await self.bodies[req.name](params), ""


_REASONS = {s.value: s.phrase for s in HTTPStatus}
_SERVER = SERVER_SOFTWARE  # what aiohttp's answers say
_date_cache: list[Any] = [0, ""]


def _content(body: bytes) -> str:
    return f"Content-Type: application/json; charset=utf-8\r\nContent-Length: {len(body)}\r\n"


def _date() -> str:
    now = int(time.time())
    if now != _date_cache[0]:
        _date_cache[0], _date_cache[1] = now, formatdate(now, usegmt=True)
    return str(_date_cache[1])


def response_bytes(status: int, body: bytes, extra: str, close: bool) -> bytes:
    """The whole HTTP/1.1 answer, head and ``body``, for one ``transport.write``; ``extra``: header
    lines of its own (each ending in CRLF)."""
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
            f"{_content(body) if status != 204 else ''}"
            f"Date: {_date()}\r\nServer: {_SERVER}\r\n{extra}"
            f"{'Connection: close' + chr(13) + chr(10) if close else ''}\r\n")
    return head.encode("latin-1") + body


class HotServer:
    """The hot path's connections of one site, for the protocol factory and a graceful stop."""

    def __init__(self, queries: HotQueries, fallback: Callable[[], asyncio.Protocol], settings: HttpSettings
                 ) -> None:
        self.queries = queries
        self.fallback = fallback  # aiohttp's protocol factory (its web.Server)
        self.settings = settings
        self.connections: set[HotProtocol] = set()
        self.max_body = min(MAX_BODY, settings.client_max_size)  # past it: aiohttp's 413
        self.max_write_body = min(MAX_WRITE_BODY, settings.client_max_size) if queries.writes is not None else 0
        self.closing = False

    def __call__(self) -> HotProtocol:
        return HotProtocol(self)

    async def shutdown(self, timeout: float) -> None:
        """Close idle connections now; let requests in flight finish, up to ``timeout``."""
        self.closing = True
        for conn in list(self.connections):
            if conn.task is None:
                conn.close()
        busy = [c.task if isinstance(c.task, asyncio.Task) else c.task.wait()
                for c in self.connections if c.task is not None]
        if busy:
            await asyncio.wait(busy, timeout=timeout)
        for conn in list(self.connections):
            conn.close()


class HotProtocol(asyncio.Protocol):
    """One connection: the two hot routes answered here, the connection handed to aiohttp otherwise."""

    def __init__(self, server: HotServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.task: asyncio.Task[None] | NowRequest | None = None  # the request being answered, if any
        self.at = 0.0  # when it was read (time.monotonic(), the access log's)
        self.peer = "?"
        self.read_paused = False
        self.write_paused = False
        self.last = 0.0
        self.idle: asyncio.TimerHandle | None = None
        self.need = 0  # a remote write's bytes awaited, held in ``parts`` meanwhile (no copy a chunk)
        self.parts: list[bytes] = []
        self.have = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses (METRICSD_EVENT_LOOP=uvloop): no
        # isinstance check, which refused every connection there
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        self.server.connections.add(self)
        loop = asyncio.get_running_loop()
        self.last = loop.time()
        self.idle = loop.call_at(self.last + IDLE_TIMEOUT_S, self._check_idle)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        if self.idle is not None:
            self.idle.cancel()
        if self.task is not None:
            self.task.cancel()
        self.transport = None

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._next()

    def data_received(self, data: bytes) -> None:
        if self.need:
            self.parts.append(data)
            self.have += len(data)
            if self.have < self.need:
                return
            self.buf, self.parts, self.need = b"".join(self.parts), [], 0
            self._next()
            return
        self.buf = self.buf + data if self.buf else data
        if self.task is not None or self.write_paused:
            if len(self.buf) > MAX_PENDING and self.transport is not None and not self.read_paused:
                self.transport.pause_reading()
                self.read_paused = True
            return
        self._next()

    def _next(self) -> None:
        """Answer the next request held, or hand the connection to aiohttp."""
        if self.transport is None or self.task is not None or self.write_paused or not self.buf:
            return
        req = parse_request(self.buf, self.server.max_body, self.server.max_write_body)
        if req is None or self.server.closing:
            self._hand_off()
            return
        if isinstance(req, int):  # a remote write's body still coming
            self.need, self.parts, self.have, self.buf = req, [self.buf], len(self.buf), b""
            if self.read_paused:  # paused while the last answer was due: the rest must come in (1 MiB at most)
                self.transport.resume_reading()
                self.read_paused = False
            return
        self.buf = self.buf[req.size:]
        if self.read_paused and len(self.buf) <= MAX_PENDING:  # not after every answer: once drained
            self.transport.resume_reading()
            self.read_paused = False
        self.at = time.monotonic()
        now = self.server.queries.now
        if now is not None and req.name in _INSTANT:
            now.take(self, req)
        else:
            self.run_task(req, functools.partial(self.server.queries.answer, req, self.peer))

    def run_task(self, req: HotRequest, answering: Callable[[], Awaitable[Answer]]) -> asyncio.Task[None]:
        """``req`` answered in a task of its own (the connection's ``task``) with what ``answering()``
        gives: made in the task, so a task cancelled before its first step leaves no coroutine unawaited."""
        task = self.task = asyncio.get_running_loop().create_task(self._answer(req, answering))
        return task

    async def _answer(self, req: HotRequest, answering: Callable[[], Awaitable[Answer]]) -> None:
        try:
            status, body, extra = await answering()
        except asyncio.CancelledError:
            self.task = None
            return
        ready = self._gzip_now(req, body, extra)
        if ready is None:  # zlib lets the GIL go
            ready = await asyncio.to_thread(zlib.compress, body, 6, wbits=31), extra + _GZIP_HEADERS
        self.task = None
        self._write(req, status, *ready)

    def reply(self, req: HotRequest, answer: Answer) -> None:
        """``answer`` written now, from the turn of the loop that has it (hotnow.py): no task, unless
        its gzip is a worker thread's."""
        status, body, extra = answer
        ready = self._gzip_now(req, body, extra)
        if ready is None:
            self.run_task(req, functools.partial(_ready, answer))
            return
        self.task = None
        self._write(req, status, *ready)

    def _gzip_now(self, req: HotRequest, body: bytes, extra: str) -> tuple[bytes, str] | None:
        """The body and extra headers to write, gzipped here when asked for and small enough to
        compress on the loop; None when its gzip is a worker thread's (past ``GZIP_ON_LOOP``)."""
        if (len(body) < self.server.settings.gzip_min_bytes
                or "gzip" not in req.headers.get(b"accept-encoding", "").lower()):
            return body, extra
        if len(body) > GZIP_ON_LOOP:
            return None
        return zlib.compress(body, 6, wbits=31), extra + _GZIP_HEADERS

    def _write(self, req: HotRequest, status: int, body: bytes, extra: str) -> None:
        close = req.close or self.server.closing
        transport = self.transport
        if transport is None:
            return
        transport.write(response_bytes(status, body, extra, close))
        if ACCESS_LOG.isEnabledFor(logging.INFO) and self.server.settings.access_log:
            ACCESS_LOG.info('%s "%s" %d %d %f "%s"', self.peer, req.line, status, len(body),
                            time.monotonic() - self.at, req.headers.get(b"user-agent", "-"))
        self.last = asyncio.get_running_loop().time()
        if close:
            self.close()
            return
        self._next()

    def _check_idle(self) -> None:
        loop = asyncio.get_running_loop()
        due = self.last + IDLE_TIMEOUT_S
        if self.task is None and loop.time() >= due:
            self.close()
            return
        self.idle = loop.call_at(max(due, loop.time() + 1.0), self._check_idle)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _hand_off(self) -> None:
        """aiohttp's protocol takes the connection over, with every byte not yet answered."""
        transport = self.transport
        assert transport is not None
        self.server.connections.discard(self)
        if self.idle is not None:
            self.idle.cancel()
        self.transport = None
        handler = self.server.fallback()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if self.read_paused:  # aiohttp pauses and resumes reading on its own
            transport.resume_reading()
            self.read_paused = False
        buf, self.buf = self.buf, b""
        if buf:
            handler.data_received(buf)


class HotSite(web.TCPSite):
    """aiohttp's TCP site with :class:`HotProtocol` as every connection's first protocol."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, *, hot: HotQueries, settings: HttpSettings,
                 ssl_context: Any = None) -> None:
        super().__init__(runner, host, port, ssl_context=ssl_context)
        self.hot_host, self.hot_port = host, port
        self.hot = hot
        self.hot_settings = settings
        self.hot_server: HotServer | None = None

    async def start(self) -> None:
        self._runner._reg_site(self)
        server = self._runner.server
        assert server is not None
        self.hot_server = HotServer(self.hot, server, self.hot_settings)
        self._server = await asyncio.get_running_loop().create_server(
            self.hot_server, self.hot_host, self.hot_port, ssl=self._ssl_context, backlog=self._backlog,
            reuse_address=self._reuse_address, reuse_port=self._reuse_port)

    async def stop(self) -> None:
        await super().stop()
        if self.hot_server is not None:
            await self.hot_server.shutdown(self.hot_settings.shutdown_timeout_s)
