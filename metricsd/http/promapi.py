"""The Prometheus HTTP API (``/api/v1/...``), so Grafana's Prometheus data source and other tools
that speak it work unchanged.

Shapes follow Prometheus' web/api/v1: ``{"status": "success", "data": ...}``, errors as
``{"status": "error", "errorType": ..., "error": ...}`` with 400 for ``bad_data``, 422 for
``execution`` and 503 when the backend is unavailable (see server.py's error middleware).

``/api/v1/series``, ``/labels`` and ``/label/<name>/values`` answer from the series the stores
hold; their ``start``/``end`` are accepted and checked, but every series held is listed (the
stores keep about a day, which is what such requests usually cover). The series come as columns
(metricsd/rpc/columnar.py): label names are read off the label codes, and the series list's JSON
is written from each distinct label pair's text, so 50,000 series cost no dict or message each.
Past --query.max-series a series lookup is refused with 422 (a ``limit`` parameter bounds the
answer instead); label names and values are answered from the codes, whatever the count.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from aiohttp import web

from metricsd import __version__
from metricsd.clock import Clock
from metricsd.columns import LabelColumns, SeriesColumns
from metricsd.http.jsonbody import json_response
from metricsd.http.params import ApiError, Params, bad, positive_int, query_timeout_s, range_ms, read_params
from metricsd.http.selfmetrics import SelfMetrics
from metricsd.http.settings import HttpSettings
from metricsd.promql import to_prometheus_body
from metricsd.promql.limits import QueryLimitError, refused_by_store
from metricsd.promql.queries import QueryRunner
from metricsd.promql.values import Result
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import LimitExceeded, MetricsBackend
from metricsd.rpc.columnar import list_columns
from metricsd.rpc.wire import matchers_to_pb
from metricsd.selector import Matcher, MatchOp

__all__ = ["PromAPI", "success"]

_ANY_SERIES = [Matcher(MatchOp.RE, "__name__", ".+")]


def success(data: Any) -> web.Response:
    return json_response({"status": "success", "data": data})


class PromAPI:
    """Handlers of the Prometheus-compatible API over one backend."""

    def __init__(self, backend: MetricsBackend, runner: QueryRunner, settings: HttpSettings, clock: Clock,
                 metrics: SelfMetrics) -> None:
        self.backend = backend
        self.runner = runner
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self._durations: dict[str, Any] = {}  # path -> its query_duration child (labels() locks and builds a key)

    def _observe(self, path: str, started: float) -> None:
        child = self._durations.get(path)
        if child is None:
            child = self._durations[path] = self.metrics.query_duration.labels(path=path)
        child.observe(self.clock.monotonic() - started)

    def add_routes(self, app: web.Application) -> None:
        for path, handler in (
            ("/api/v1/query", self.query),
            ("/api/v1/query_range", self.query_range),
            ("/api/v1/series", self.series),
            ("/api/v1/labels", self.labels),
            ("/api/v1/label/{name}/values", self.label_values),
            ("/api/v1/query_exemplars", self.exemplars),
            ("/api/v1/format_query", self.format_query),
        ):
            app.router.add_get(path, handler)
            app.router.add_post(path, handler)
        app.router.add_get("/api/v1/status/buildinfo", self.buildinfo)
        app.router.add_get("/api/v1/metadata", self.metadata)

    async def query(self, request: web.Request) -> web.Response:
        return _json_body_response(await self.query_body(await read_params(request)))

    async def query_range(self, request: web.Request) -> web.Response:
        return _json_body_response(await self.query_range_body(await read_params(request)))

    async def query_body(self, params: Params) -> bytes:
        """/api/v1/query's answer body from its parameters; aiohttp's route and the hot path
        (metricsd/http/hotpath.py) both call it, so the two answer alike."""
        expr = params.require("query")
        t = params.time_ms("time", self.clock.now_ms())
        return await self._evaluate(params, lambda timeout: self.runner.instant(expr, t, timeout_s=timeout))

    async def query_range_body(self, params: Params) -> bytes:
        """/api/v1/query_range's answer body from its parameters (see query_body)."""
        expr = params.require("query")
        start, end, step = range_ms(params)
        return await self._evaluate(params, lambda timeout: self.runner.range(expr, start, end, step,
                                                                              timeout_s=timeout))

    async def _evaluate(self, params: Params,
                        run: Callable[[float], Awaitable[tuple[Result, str]]]) -> bytes:
        """``run(timeout)`` under the query's time limit, its errors as the API's, its path timed.

        Called under the request's own timeout (server.py's middleware, the hot path), which starts
        first and so fires first at the same limit: a timer of its own only for a shorter
        ``timeout`` parameter (a timer is ~4 us a request, issue 23 session 38)."""
        started = self.clock.monotonic()
        try:
            timeout = query_timeout_s(params, self.settings.request_timeout_s)
            if timeout < self.settings.request_timeout_s:
                async with asyncio.timeout(timeout):
                    result, path = await run(timeout)
            else:
                result, path = await run(timeout)
        except TimeoutError:
            raise ApiError("timeout", "query timed out in expression evaluation") from None
        except QueryLimitError as e:
            self.metrics.queries_refused.labels(limit=e.limit).inc()
            raise
        self._observe(path, started)
        return to_prometheus_body(result)

    def _check_window(self, params: Params) -> None:
        start = params.time_ms("start", -(2**62))
        end = params.time_ms("end", 2**62)
        if end < start:
            raise bad("end", "end timestamp must not be before start time")

    async def _series(self, selectors: list[list[Matcher]], limit: int = 0, max_series: int = 0) -> SeriesColumns:
        """The series matching any selector, once each (by id), as columns. Raises QueryLimitError
        past ``max_series`` (0: none)."""
        try:
            parts = await asyncio.gather(*(
                list_columns(self.backend, pb.ListSeriesRequest(matchers=matchers_to_pb(m), limit=limit,
                                                                max_series=max_series))
                for m in selectors
            ))
        except LimitExceeded as e:
            err = refused_by_store(str(e))
            self.metrics.queries_refused.labels(limit=err.limit).inc()
            raise err from None
        cols = SeriesColumns.concat(parts)
        if len(parts) > 1 and cols.ids is not None:
            _, first = np.unique(cols.ids, return_index=True)
            cols = cols.take(np.sort(first))
        return cols

    async def series(self, request: web.Request) -> web.Response:
        params = await read_params(request)
        selectors = params.matchers()
        if not selectors:
            raise ApiError("bad_data", "no match[] parameter provided")
        self._check_window(params)
        limit = positive_int(params, "limit", 0)
        labels = (await self._series(selectors, limit, self.runner.limits.max_series)).labels
        order = labels.sort_order()
        if limit:
            order = order[:limit]
        return _raw_success(_series_json(labels.take(order)))

    async def labels(self, request: web.Request) -> web.Response:
        params = await read_params(request)
        self._check_window(params)
        selectors = params.matchers() or [_ANY_SERIES]
        names = (await self._series(selectors)).labels.present_names()
        limit = positive_int(params, "limit", 0)
        return success(names[:limit] if limit else names)

    async def label_values(self, request: web.Request) -> web.Response:
        params = await read_params(request)
        name = request.match_info["name"]
        if name.startswith("U__"):  # Prometheus' escaping of names with characters outside [a-zA-Z0-9_]
            raise ApiError("bad_data", f"invalid label name: {name!r}")
        self._check_window(params)
        selectors = params.matchers() or [[]]
        resps = await asyncio.gather(*(
            self.backend.label_values(pb.LabelValuesRequest(name=name, matchers=matchers_to_pb(m)))
            for m in selectors
        ))
        # one store's answer is sorted and distinct already
        values = list(resps[0].values) if len(resps) == 1 else sorted({v for r in resps for v in r.values})
        limit = positive_int(params, "limit", 0)
        return success(values[:limit] if limit else values)

    async def exemplars(self, request: web.Request) -> web.Response:
        return success([])

    async def format_query(self, request: web.Request) -> web.Response:
        """Prometheus' /api/v1/format_query (Grafana's "Format query"): the expression prettified,
        under the same limits as a query and parsed off the event loop."""
        params = await read_params(request)
        expr = params.require("query")
        try:
            text = await self.runner.prettify(expr)
        except QueryLimitError as e:
            self.metrics.queries_refused.labels(limit=e.limit).inc()
            raise
        return success(text)

    async def buildinfo(self, request: web.Request) -> web.Response:
        return success({
            "version": __version__, "revision": "", "branch": "", "buildUser": "", "buildDate": "",
            "goVersion": "", "application": "metricsd",
        })

    async def metadata(self, request: web.Request) -> web.Response:
        return success({})


def _json_body_response(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/json", charset="utf-8")


def _raw_success(data_json: str) -> web.Response:
    """success() for a ``data`` member already in JSON."""
    return web.Response(text='{"status":"success","data":' + data_json + "}", content_type="application/json")


def _series_json(labels: LabelColumns) -> str:
    """The series' label sets as a JSON list of objects, in their order: each distinct
    ``"name":"value"`` pair is encoded once, then joined per series."""
    if len(labels) == 0:
        return "[]"
    cols = []
    for name, codes, values in zip(labels.names, labels.codes, labels.values, strict=True):
        used = np.unique(codes)
        text = {int(c): json.dumps(name) + ":" + json.dumps(values[int(c)]) for c in used.tolist() if c >= 0}
        text[-1] = ""
        cols.append([text[c] for c in codes.tolist()])
    return "[" + ",".join("{" + ",".join(p for p in row if p) + "}" for row in zip(*cols, strict=True)) + "]"
