"""The request envelope every route of the HTTP hot path shares (metricsd/http/hotpath.py's queries,
metricsd/http/hotwrite.py's remote write).

On aiohttp these steps are build_app's middlewares (metricsd/http/server.py): the read consistency
(``consistency`` parameter or header, a bad value a 400), the clusters a fan-out could not reach
(``missing``), the request timeout, the error mapping to a JSON error body, the request metrics, and
the auth middleware's bearer tokens with its 401 header. The hot path answers without aiohttp's
objects, so it repeats them; doing it once here keeps the two routes from drifting apart (a step
added to one and forgotten in the other would change an answer depending on the request's size).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from metricsd.clock import Clock
from metricsd.http.auth import refusal
from metricsd.http.deadlines import Deadlines
from metricsd.http.params import error_body
from metricsd.http.settings import HttpSettings
from metricsd.rpc import consistency
from metricsd.rpc.consistency import CONSISTENCY_HEADER
from metricsd.rpc.missing import collecting
from metricsd.security.auth import Authenticator

if TYPE_CHECKING:
    from metricsd.http.hotpath import HotRequest

__all__ = ["CONSISTENCY_HEADER_KEY", "Answer", "HotRoute", "refused_answer"]

Answer = tuple[int, bytes, str]  # (status, JSON body or b"" for a 204, extra header lines ending in CRLF)
S = TypeVar("S")  # what a route's ``prepare`` hands its ``run``

CONSISTENCY_HEADER_KEY = CONSISTENCY_HEADER.lower().encode()  # as HotRequest.headers keys it
_UNAUTHORIZED = 'WWW-Authenticate: Bearer realm="metricsd"\r\n'


def refused_answer(status: int, error_type: str, message: str) -> Answer:
    """The auth middleware's refusal: a JSON error body, and the bearer challenge on a 401."""
    return status, json.dumps(error_body(error_type, message)).encode(), _UNAUTHORIZED if status == 401 else ""


class HotRoute(ABC, Generic[S]):
    """A hot route's answer inside server.py's envelope. A subclass says how to read the request
    (:meth:`prepare`: the consistency text and what :meth:`run` needs, raising for a bad request) and
    how to answer it (:meth:`run`, inside the consistency, the missing-cluster collection and the
    timeout). ``missing_on_any``: whether the missing-clusters note goes on any non-empty body (a
    write's 400 names its refused samples and the clusters it missed) or on a 200's only (a query's
    error says why it failed, not what it lacked)."""

    missing_on_any = False

    def __init__(self, settings: HttpSettings, counter: Any, auth: Authenticator | None, clock: Clock) -> None:
        self.settings = settings
        self.counter = counter  # server.py's RequestMetrics
        self.auth = auth
        self.clock = clock
        self.deadlines = Deadlines(settings.request_timeout_s)  # one loop timer, not one a request
        from metricsd.http import server  # late: server.py imports the hot path
        self.body_with_missing = server.body_with_missing
        self.consistency_of = server.consistency_of
        self.error_of = server.error_of

    @abstractmethod
    def prepare(self, req: HotRequest) -> tuple[str | None, S]:
        """(the ``consistency`` parameter's text, or None; what :meth:`run` needs)."""

    @abstractmethod
    async def run(self, req: HotRequest, state: S, peer: str) -> Answer:
        """The route's answer, inside the envelope's consistency, missing-cluster collection and timeout."""

    async def answer(self, req: HotRequest, peer: str, prepared: tuple[str | None, S] | None = None,
                     started: float | None = None, began: float | None = None) -> Answer:
        """(status, JSON body or b"" for a 204, extra header lines) for ``req``. ``prepared``: what
        :meth:`prepare` gave already; ``started`` (the clock's) and ``began`` (the loop's time): when a
        request begun without a task began (metricsd/http/hotnow.py), for its metrics and timeout."""
        if started is None:
            started = self.clock.monotonic()
        extra = ""
        try:
            text, state = self.prepare(req) if prepared is None else prepared
            chosen = self.consistency_of(text or req.headers.get(CONSISTENCY_HEADER_KEY), req.name)
            with collecting() as missing, consistency.reading_with(chosen):
                async with self.deadlines.deadline(began):
                    status, body, extra = await self.run(req, state, peer)
            if missing and body and (status == 200 or self.missing_on_any):
                body = self.body_with_missing(body, missing, False)
        except Exception as e:
            status, body = self.failed(req, e)
        self.counted(req, status, started)
        return status, body, extra

    def failed(self, req: HotRequest, e: Exception) -> tuple[int, bytes]:
        """The status and JSON error body ``e`` is answered with (server.py's error_of)."""
        err = self.error_of(e, self.settings, f"{req.method} {req.name}")
        return err.status, json.dumps(error_body(err.error_type, err.message)).encode()

    def counted(self, req: HotRequest, status: int, started: float) -> None:
        """The request metrics of an answered request (server.py's RequestMetrics)."""
        self.counter.count(req.name, status)
        self.counter.observe(req.name, self.clock.monotonic() - started)

    async def identity(self, req: HotRequest, peer: str) -> str | Answer | None:
        """The caller's identity (None without tokens), or the refusal to answer with."""
        if self.auth is None:
            return None
        got = await refusal(self.auth, req.method, req.name, req.headers.get(b"authorization"), peer)
        return refused_answer(*got) if isinstance(got, tuple) else got
