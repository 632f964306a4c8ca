"""The proxy's HTTP end of a whole query (metricsd/proxy/wholequery.py): an aiohttp middleware in front of
``/api/v1/query`` and ``/api/v1/query_range`` that, for a read of consistency one, sends the
query to one store and answers its result's bytes; otherwise, and whenever the whole path falls
back, the Prometheus API's handler (metricsd/http/promapi.py) answers as before.

It sits inside the app's error middleware (metricsd/http/server.py build_app), so the request's
consistency is already chosen and its errors are mapped as every other route's. The parameters
are read as promapi.py reads them, in the same order, so a bad parameter gets the same 400.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

from metricsd.clock import Clock
from metricsd.http.params import ApiError, Params, query_timeout_s, range_ms, read_params
from metricsd.http.selfmetrics import SelfMetrics
from metricsd.http.settings import HttpSettings
from metricsd.rpc import consistency
from metricsd.rpc.consistency import Consistency
from metricsd.rpc.wholequery import LIMIT_NAMES, QueryAnswer, RunnerSettings

__all__ = ["WholeAnswer", "WholeAsk", "WholeHttp", "may_select", "timed_out", "whole_answer", "whole_query_middleware"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_PATHS = {"/api/v1/query": True, "/api/v1/query_range": False}  # path -> instant


class WholeQueries(Protocol):
    """What a proxy offers (metricsd/proxy/wholequery.py WholeQueryPath): the store's answer, or
    None to evaluate the query here; TimeoutError past ``timeout_s`` and a grace (its own deadline)."""

    async def run(self, query: str, *, instant: bool, start_ms: int, end_ms: int, step_ms: int, timeout_s: float,
                  settings: RunnerSettings) -> QueryAnswer | None: ...


def may_select(expr: str) -> bool:
    """Whether a query's text may hold a series selector: a metric name or a label matcher needs a
    letter or a brace; a text of numbers and operators (Grafana's `1`) has neither and reads no
    data. Only routes a query (a query that reads nothing is answered by the proxy, whose answer
    is the store's), so a text that reads nothing but has letters (`vector(1)`) may go either way."""
    return "{" in expr or any(c.isalpha() for c in expr)


WholeAnswer = Callable[[Params, bool], Awaitable[bytes | None]]


WholeAsk = tuple[str, int, int, int, float]  # a whole query's text, start_ms, end_ms, step_ms and timeout_s


class WholeHttp:
    """A whole query's HTTP steps around the proxy's path, in two halves: :meth:`ask` reads the
    parameters (raising the API's 400), :meth:`body` turns the store's answer into the body (raising
    the query's error). Two halves because the hot path also runs them without a task around the
    store's answer (metricsd/http/hotnow.py); :meth:`answer` is both, awaiting the path between."""

    def __init__(self, path: WholeQueries, settings: HttpSettings, metrics: SelfMetrics, clock: Clock) -> None:
        limits = tuple((name, int(getattr(settings.query_limits, name))) for name in LIMIT_NAMES)
        self.runner = RunnerSettings(settings.lookback_ms, settings.max_samples, settings.pushdown,
                                     settings.request_timeout_s, limits)
        self.path = path
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.duration = metrics.query_duration.labels(path="whole")  # once: labels() locks and builds a key

    def ask(self, params: Params, instant: bool) -> WholeAsk | None:
        """The frame's arguments, or None for a query that reads no data (evaluated here)."""
        expr = params.require("query")
        if not may_select(expr):  # `1`: nothing to read, so a hop to a store is all it would add
            return None
        if instant:
            start = end = params.time_ms("time", self.clock.now_ms())
            step = 1
        else:
            start, end, step = range_ms(params)
        return expr, start, end, step, query_timeout_s(params, self.settings.request_timeout_s)

    def body(self, got: QueryAnswer | None, started: float) -> bytes | None:
        """The answer's body (None: evaluate it here); raises ApiError for the query's own error.
        ``started``: the clock's monotonic time the parameters were read at."""
        if got is None:
            return None
        if got.data is None:
            if got.limit:
                self.metrics.queries_refused.labels(limit=got.limit).inc()
            raise ApiError(got.error_type, got.message, got.status)
        self.duration.observe(self.clock.monotonic() - started)
        return b'{"status":"success","data":' + got.data + b"}"

    async def answer(self, params: Params, instant: bool) -> bytes | None:
        ask = self.ask(params, instant)
        if ask is None:
            return None
        started = self.clock.monotonic()
        try:  # under the path's own deadline, the timeout and a grace for the store's timeout answer
            query, start_ms, end_ms, step_ms, timeout_s = ask
            got = await self.path.run(query, instant=instant, start_ms=start_ms, end_ms=end_ms, step_ms=step_ms,
                                      timeout_s=timeout_s, settings=self.runner)
        except TimeoutError:
            raise timed_out() from None
        return self.body(got, started)


def timed_out() -> ApiError:
    """What a whole query past its deadline answers."""
    return ApiError("timeout", "query timed out in expression evaluation")


def whole_answer(path: WholeQueries, settings: HttpSettings, metrics: SelfMetrics, clock: Clock) -> WholeAnswer:
    """A query's answer body from one store, or None to evaluate it here: called with the request's
    parameters and whether it is instant, inside the request's consistency of one. Shared by the
    middleware below and the hot path (metricsd/http/hotpath.py)."""
    return WholeHttp(path, settings, metrics, clock).answer


def whole_query_middleware(path: WholeQueries, settings: HttpSettings, metrics: SelfMetrics, clock: Clock
                           ) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    answer = whole_answer(path, settings, metrics, clock)

    @web.middleware
    async def handle(request: web.Request, handler: Handler) -> web.StreamResponse:
        instant = _PATHS.get(request.path)
        if instant is None or consistency.current() is not Consistency.ONE:
            return await handler(request)
        body = await answer(await read_params(request), instant)  # params cached by aiohttp
        if body is None:
            return await handler(request)
        return web.Response(body=body, content_type="application/json", charset="utf-8")

    return handle
