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

:class:`HotWrites` goes through the steps aiohttp's route takes, in the envelope it shares with the
queries (metricsd/http/hotroute.py): the read consistency (``consistency`` parameter or header, a
bad value a 400), bearer tokens (metricsd/http/auth.py ``refusal``, the write role), the request
timeout, the receiver's own checks and decode (metricsd/http/remote_write.py ``respond``: snappy and
its bomb limit, the request limits, 1.0 and 2.0, the 400 naming refused samples), the error mapping
and request metrics of metricsd/http/server.py. tests/http/test_http_hotpath_guard.py lists the
middlewares this mirrors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from yarl import URL

from metricsd.clock import Clock
from metricsd.http.hotroute import Answer, HotRoute
from metricsd.http.settings import HttpSettings
from metricsd.rpc.consistency import CONSISTENCY_PARAM
from metricsd.security.auth import Authenticator

if TYPE_CHECKING:
    from metricsd.http.hotpath import HotRequest
    from metricsd.http.remote_write import RemoteWriteReceiver

__all__ = ["MAX_WRITE_BODY", "WRITE_PATH", "HotWrites"]

WRITE_PATH = "/api/v1/write"
# A remote-write body the hot path waits for and answers: Prometheus' 500 (or 2,000) samples a
# request are 10-100 KiB of snappy. Larger ones (backfills) are aiohttp's, which reads them as they come.
MAX_WRITE_BODY = 1 << 20


class HotWrites(HotRoute[None]):
    """``POST /api/v1/write`` from a parsed request: server.py's middleware, the auth middleware and
    the receiver's route, without aiohttp's objects."""

    missing_on_any = True  # a 400 naming refused samples also names the clusters it missed

    def __init__(self, receiver: RemoteWriteReceiver, settings: HttpSettings, counter: Any,
                 auth: Authenticator | None, clock: Clock) -> None:
        super().__init__(settings, counter, auth, clock)
        self.receiver = receiver

    def prepare(self, req: HotRequest) -> tuple[str | None, None]:
        return _param(req.query), None

    async def run(self, req: HotRequest, state: None, peer: str) -> Answer:
        identity = await self.identity(req, peer)
        if isinstance(identity, tuple):
            return identity
        version = self.receiver.version(req.headers.get(b"content-encoding"), req.headers.get(b"content-type"))
        status, body, headers = await self.receiver.respond(version, req.body, lambda: identity or peer)
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()) if headers else ""
        return status, body or b"", extra


def _param(query: str) -> str | None:
    """The ``consistency`` parameter of a query string (a write's is nearly always empty)."""
    if not query:
        return None
    return URL.build(query_string=query, encoded=True).query.get(CONSISTENCY_PARAM)  # as aiohttp reads it
