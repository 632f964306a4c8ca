"""Remote write below aiohttp's web layer: ``POST /api/v1/write`` answered on the hot path's connections.

A Prometheus sends a store a request every ~500 samples (its queue's default ``max_samples_per_send``),
each new: with a few hundred microseconds of aiohttp's machinery per request (a task, the request and
response objects, the router, the middleware chain, the response's headers and two writes) the
request, not the sample, was most of one store's CPU (perf/RESULTS.md, issue 24 sessions 37 and 38).
The connections of metricsd/http/hotpath.py therefore also answer a remote write that is whole and
plain (an HTTP/1.1 POST with a ``Content-Length`` body of at most :data:`MAX_WRITE_BODY` bytes,
within the client's ``client_max_size``; hotpath.py's ``parse_request`` holds the connection's bytes
until the body is all there). Anything else is aiohttp's, as before: a bigger or chunked body (its
413 past ``client_max_size``), another route.

:class:`HotWrites` goes through the steps aiohttp's route takes, with the functions they share: the
read consistency (``consistency`` parameter or header, a bad value a 400), bearer tokens
(metricsd/http/auth.py ``refusal``, the write role), the request timeout, the receiver's own checks
and decode (metricsd/http/remote_write.py ``respond``: snappy and its bomb limit, the request limits,
1.0 and 2.0, the 400 naming refused samples), the error mapping and request metrics of
metricsd/http/server.py. tests/http/test_http_hotpath_guard.py lists the middlewares this mirrors.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from yarl import URL

from metricsd.clock import Clock
from metricsd.http.auth import refusal
from metricsd.http.params import error_body
from metricsd.http.settings import HttpSettings
from metricsd.rpc import consistency
from metricsd.rpc.consistency import CONSISTENCY_HEADER, CONSISTENCY_PARAM
from metricsd.rpc.missing import collecting
from metricsd.security.auth import Authenticator

if TYPE_CHECKING:
    from metricsd.http.hotpath import HotRequest
    from metricsd.http.remote_write import RemoteWriteReceiver

__all__ = ["MAX_WRITE_BODY", "WRITE_PATH", "HotWrites"]

WRITE_PATH = "/api/v1/write"
# A remote-write body the hot path waits for and answers: Prometheus' 500 (or 2,000) samples a
# request are 10-100 KiB of snappy. Larger ones (backfills) are aiohttp's, which reads them as they come.
MAX_WRITE_BODY = 1 << 20
_CONSISTENCY_HEADER = CONSISTENCY_HEADER.lower().encode()
_UNAUTHORIZED = 'WWW-Authenticate: Bearer realm="metricsd"\r\n'


class HotWrites:
    """``POST /api/v1/write`` from a parsed request: server.py's middleware, the auth middleware and
    the receiver's route, without aiohttp's objects."""

    def __init__(self, receiver: RemoteWriteReceiver, settings: HttpSettings, counter: Any,
                 auth: Authenticator | None, clock: Clock) -> None:
        self.receiver = receiver
        self.settings = settings
        self.counter = counter  # server.py's RequestMetrics
        self.auth = auth
        self.clock = clock
        from metricsd.http import server  # late: server.py imports this module
        self.body_with_missing = server.body_with_missing
        self.consistency_of = server.consistency_of
        self.error_of = server.error_of

    async def answer(self, req: HotRequest, peer: str) -> tuple[int, bytes, str]:
        """(status, JSON body or b"" for a 204, extra header lines) for ``req``."""
        started = self.clock.monotonic()
        extra = ""
        try:
            chosen = self.consistency_of(_param(req.query) or req.headers.get(_CONSISTENCY_HEADER), WRITE_PATH)
            with collecting() as missing, consistency.reading_with(chosen):
                async with asyncio.timeout(self.settings.request_timeout_s):
                    status, body, extra = await self._run(req, peer)
            if missing and body:
                body = self.body_with_missing(body, missing, False)
        except Exception as e:
            err = self.error_of(e, self.settings, f"{req.method} {WRITE_PATH}")
            status, body = err.status, json.dumps(error_body(err.error_type, err.message)).encode()
        self.counter.count(WRITE_PATH, status)
        self.counter.observe(WRITE_PATH, self.clock.monotonic() - started)
        return status, body, extra

    async def _run(self, req: HotRequest, peer: str) -> tuple[int, bytes, str]:
        identity: str | None = None
        if self.auth is not None:
            got = await refusal(self.auth, req.method, WRITE_PATH, req.headers.get(b"authorization"), peer)
            if isinstance(got, tuple):
                status, error_type, message = got
                return status, json.dumps(error_body(error_type, message)).encode(), _UNAUTHORIZED if status == 401 \
                    else ""
            identity = got
        version = self.receiver.version(req.headers.get(b"content-encoding"), req.headers.get(b"content-type"))
        status, body, headers = await self.receiver.respond(version, req.body, lambda: identity or peer)
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()) if headers else ""
        return status, body or b"", extra


def _param(query: str) -> str | None:
    """The ``consistency`` parameter of a query string (a write's is nearly always empty)."""
    if not query:
        return None
    return URL.build(query_string=query, encoded=True).query.get(CONSISTENCY_PARAM)  # as aiohttp reads it
