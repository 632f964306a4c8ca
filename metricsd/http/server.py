"""The aiohttp application and its lifecycle: routes, limits, timeouts, gzip, access logs, and a
graceful stop.

``build_app`` wires handlers to a :class:`MetricsBackend`; it does not care whether the data is in
this process or behind a proxy. ``/`` is the dashboard page (dashboard.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import hdrs, web
from prometheus_client import CollectorRegistry

from metricsd.clock import Clock
from metricsd.http.auth import auth_middleware
from metricsd.http.consumers import DocumentProvider, add_consumer_routes
from metricsd.http.dashboard import add_dashboard_routes
from metricsd.http.export import ExportAPI
from metricsd.http.hotpath import HotQueries, HotSite
from metricsd.http.hotwrite import HotWrites
from metricsd.http.looplag import attach, watch_loop
from metricsd.http.native import NativeAPI
from metricsd.http.params import ApiError, error_body
from metricsd.http.promapi import PromAPI
from metricsd.http.remote_write import RemoteWriteReceiver
from metricsd.http.selfmetrics import SelfMetrics
from metricsd.http.settings import HttpSettings
from metricsd.http.wholehttp import WholeHttp, whole_query_middleware
from metricsd.promql import PromQLError
from metricsd.promql.queries import QueryRunner
from metricsd.rpc import consistency
from metricsd.rpc.backend import BadRequest, LimitExceeded, MetricsBackend, Unavailable
from metricsd.rpc.consistency import CONSISTENCY_HEADER, CONSISTENCY_PARAM, Consistency
from metricsd.rpc.missing import Missing, collecting, warning
from metricsd.security.auth import Authenticator
from metricsd.security.settings import ServerSecurity
from metricsd.security.tls import ServerTLS

__all__ = ["METRICS_KEY", "SETTINGS_KEY", "build_app", "serve_http", "start_http", "stop_http"]

log = logging.getLogger("metricsd.http")
ACCESS_LOG = logging.getLogger("metricsd.http.access")
ACCESS_LOG_FORMAT = '%a "%r" %s %b %Tf "%{User-Agent}i"'

SETTINGS_KEY = web.AppKey("settings", HttpSettings)
METRICS_KEY = web.AppKey("metrics", SelfMetrics)
HOT_KEY = web.AppKey("hot", HotQueries)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error_response(err: ApiError) -> web.Response:
    return web.json_response(error_body(err.error_type, err.message), status=err.status)


def _as_api_error(e: Exception, settings: HttpSettings) -> ApiError | None:
    if isinstance(e, ApiError):
        return e
    if isinstance(e, PromQLError):
        return ApiError(e.kind, e.message)
    if isinstance(e, BadRequest):
        return ApiError("bad_data", str(e))
    if isinstance(e, LimitExceeded):  # 429: remote-write senders back off instead of retrying at once
        return ApiError("resource_exhausted", str(e), 429)
    if isinstance(e, Unavailable):
        return ApiError("unavailable", str(e))
    if isinstance(e, TimeoutError):
        return ApiError("timeout", f"request took longer than {settings.request_timeout_s:g} s")
    if isinstance(e, web.HTTPRequestEntityTooLarge):
        return ApiError("too_large", f"request body is larger than the limit of {settings.client_max_size} bytes",
                        413)
    return None


NATIVE_PREFIX = "/api/v1/metricsd/"
PROMETHEUS_PREFIX = "/api/v1/"


def read_consistency(request: web.Request) -> Consistency:
    """The request's read consistency (metricsd/rpc/consistency.py): ``?consistency=`` or the
    ``X-Metricsd-Consistency`` header (the parameter wins); by default ONE on the Prometheus API
    (dashboards: one replica, hedged), QUORUM elsewhere (the native API, which the consumers'
    pages and scripts read). Raises ApiError (400) for an unknown value."""
    return consistency_of(request.query.get(CONSISTENCY_PARAM) or request.headers.get(CONSISTENCY_HEADER),
                          request.path)


def consistency_of(text: str | None, path: str) -> Consistency:
    """read_consistency from the parameter's (or else the header's) text and the request's path."""
    if text:
        try:
            return consistency.parse(text)
        except ValueError as e:
            raise ApiError("bad_data", f'invalid parameter "{CONSISTENCY_PARAM}": {e}') from None
    if path.startswith(PROMETHEUS_PREFIX) and not path.startswith(NATIVE_PREFIX):
        return Consistency.ONE
    return Consistency.QUORUM


def _with_missing(resp: web.StreamResponse, missing: list[Missing], native: bool) -> web.StreamResponse:
    """A JSON answer with the clusters a federating backend could not reach (metricsd/rpc/missing.py):
    Prometheus' ``warnings`` (which Grafana shows on the panel) and, on the native API, also
    ``missingClusters``, so that a partial answer never reads as whole."""
    if not isinstance(resp, web.Response) or resp.content_type != "application/json" or not isinstance(
            resp.body, bytes):
        return resp
    body = body_with_missing(resp.body, missing, native)
    if body is resp.body:
        return resp
    return web.Response(body=body, status=resp.status, content_type="application/json", charset="utf-8")


def body_with_missing(body: bytes, missing: list[Missing], native: bool) -> bytes:
    """_with_missing on a JSON body's bytes (the same body when it is not an object)."""
    doc = json.loads(body)
    if not isinstance(doc, dict):
        return body
    doc["warnings"] = [*doc.get("warnings", []), *(warning(m) for m in missing)]
    if native:
        doc["missingClusters"] = [{"cluster": m.cluster, "reason": m.reason} for m in missing]
    return json.dumps(doc).encode()


class RequestMetrics:
    """The request counter and duration children per route, kept: prometheus_client's labels()
    takes a lock and builds a key on every call. Bounded by the routes times the status codes."""

    def __init__(self, metrics: SelfMetrics) -> None:
        self.metrics = metrics
        self.counted: dict[tuple[str, int], Any] = {}
        self.timed: dict[str, Any] = {}

    def count(self, name: str, code: int) -> None:
        child = self.counted.get((name, code))
        if child is None:
            child = self.counted[(name, code)] = self.metrics.requests.labels(handler=name, code=str(code))
        child.inc()

    def observe(self, name: str, seconds: float) -> None:
        child = self.timed.get(name)
        if child is None:
            child = self.timed[name] = self.metrics.request_duration.labels(handler=name)
        child.observe(seconds)


def error_of(e: Exception, settings: HttpSettings, what: str) -> ApiError:
    """The API error a handler's exception is answered with (an unexpected one logged as internal)."""
    err = _as_api_error(e, settings)
    if err is None:
        log.exception("%s failed", what)
        err = ApiError("internal", f"internal error: {type(e).__name__}")
    return err


# Routes that stream an answer of any size with bounded memory (http/export.py): not cut by the
# request timeout, which stopped an export of an hour of 40,000 series after 30 s mid-stream and
# left its client waiting on a stream that never ended (2026-11-27 session 34). The client may
# hang up at any time.
STREAMED_ROUTES = frozenset({"/api/v1/export"})


def _middleware(settings: HttpSettings, metrics: SelfMetrics, clock: Clock) -> Callable[..., Awaitable[
        web.StreamResponse]]:
    counter = RequestMetrics(metrics)
    count = counter.count

    @web.middleware
    async def handle(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Timeout, error mapping, gzip and request metrics, for every route."""
        started = clock.monotonic()
        resource = request.match_info.route.resource
        name = resource.canonical if resource is not None else "unmatched"
        try:
            with collecting() as missing, consistency.reading_with(read_consistency(request)):
                async with asyncio.timeout(None if name in STREAMED_ROUTES else settings.request_timeout_s):
                    resp = await handler(request)
            if missing:
                resp = _with_missing(resp, missing, request.path.startswith(NATIVE_PREFIX))
        except web.HTTPException as e:
            err = _as_api_error(e, settings)
            if err is None:
                count(name, e.status)
                raise
            resp = _error_response(err)
        except Exception as e:
            resp = _error_response(error_of(e, settings, f"{request.method} {request.path}"))
        if (isinstance(resp, web.Response) and resp.body is not None
                and isinstance(resp.body, bytes) and len(resp.body) >= settings.gzip_min_bytes
                and "gzip" in request.headers.get(hdrs.ACCEPT_ENCODING, "").lower()):
            resp.enable_compression(web.ContentCoding.gzip)
        count(name, resp.status)
        counter.observe(name, clock.monotonic() - started)
        return resp

    return handle


def build_app(
    backend: MetricsBackend,
    *,
    settings: HttpSettings,
    registry: CollectorRegistry,
    clock: Clock,
    metrics: SelfMetrics | None = None,
    consumers: DocumentProvider | None = None,
    auth: Authenticator | None = None,
) -> web.Application:
    """The HTTP API over ``backend``. Pass ``metrics`` when other components share the registry
    (one SelfMetrics per registry); otherwise one is made on ``registry``. With ``auth`` every
    route but the open ones (metricsd/security/policy.py) needs a bearer token with its role."""
    metrics = metrics if metrics is not None else SelfMetrics(registry)
    middlewares = [_middleware(settings, metrics, clock)]
    if auth is not None:
        middlewares.append(auth_middleware(auth))
    whole = getattr(backend, "whole_queries", None)  # a proxy's: a query sent whole to one store
    if whole is not None and getattr(whole, "enabled", True):  # off (the default): not a step of every request
        middlewares.append(whole_query_middleware(whole, settings, metrics, clock))
    app = web.Application(client_max_size=settings.client_max_size, middlewares=middlewares)
    app[SETTINGS_KEY] = settings
    app[METRICS_KEY] = metrics
    runner = QueryRunner(backend, lookback_ms=settings.lookback_ms, max_samples=settings.max_samples,
                         allow_pushdown=settings.pushdown, limits=settings.query_limits,
                         timeout_s=settings.request_timeout_s)
    prom = PromAPI(backend, runner, settings, clock, metrics)
    prom.add_routes(app)
    if settings.hot_path:  # the two query routes below aiohttp's web layer (http/hotpath.py)
        answer_whole = (WholeHttp(whole, settings, metrics, clock)
                        if whole is not None and getattr(whole, "enabled", True) else None)
        app[HOT_KEY] = HotQueries({"/api/v1/query": prom.query_body, "/api/v1/query_range": prom.query_range_body},
                                  answer_whole, settings, RequestMetrics(metrics), auth, clock)
    receiver = RemoteWriteReceiver(backend, settings, metrics)
    receiver.add_routes(app)
    if settings.hot_path and settings.hot_write:  # remote write on the hot path too (http/hotwrite.py)
        hot = app[HOT_KEY]
        hot.writes = HotWrites(receiver, settings, hot.counter, auth, clock)
    ExportAPI(backend, settings, clock, metrics).add_routes(app)
    NativeAPI(backend, settings, clock, metrics).add_routes(app)
    if consumers is not None:
        add_consumer_routes(app, consumers)
    add_dashboard_routes(app)
    return app


async def start_http(app: web.Application, host: str, port: int, tls: ServerTLS | None = None
                     ) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on host:port (0 picks a free port), over TLS when ``tls`` is given; returns
    the runner and the bound port."""
    settings = app.get(SETTINGS_KEY) or HttpSettings()
    runner = web.AppRunner(
        app,
        access_log=ACCESS_LOG if settings.access_log else None,
        access_log_format=ACCESS_LOG_FORMAT,
        shutdown_timeout=settings.shutdown_timeout_s,
    )
    background: list[asyncio.Task[None]] = []
    metrics = app.get(METRICS_KEY)

    async def start_background(_: web.Application) -> None:
        loop = asyncio.get_running_loop()
        if tls is not None:  # re-read rotated certificate files while serving
            background.append(loop.create_task(tls.watch(), name="tls-watch"))
        if metrics is not None:
            lag = attach(metrics.loop_lag, metrics.loop_stalls)
            background.append(loop.create_task(watch_loop(lag), name="loop-lag"))

    async def stop_background(_: web.Application) -> None:
        for task in background:
            task.cancel()

    app.on_startup.append(start_background)
    app.on_cleanup.append(stop_background)
    await runner.setup()
    ssl = tls.ssl_context() if tls is not None else None
    hot = app.get(HOT_KEY)
    site = (HotSite(runner, host, port, hot=hot, settings=settings, ssl_context=ssl) if hot is not None
            else web.TCPSite(runner, host, port, ssl_context=ssl))
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    log.info("HTTP API serving on %s://%s:%d", "https" if tls is not None else "http", host, bound)
    return runner, int(bound)


async def stop_http(runner: web.AppRunner) -> None:
    """Stop accepting, let requests in flight finish (up to the shutdown timeout), then close."""
    await runner.cleanup()


async def serve_http(
    backend: MetricsBackend,
    host: str,
    port: int,
    registry: CollectorRegistry,
    clock: Clock,
    settings: HttpSettings | None = None,
    metrics: SelfMetrics | None = None,
    consumers: DocumentProvider | None = None,
    security: ServerSecurity | None = None,
) -> tuple[web.AppRunner, int]:
    """Build the app and serve it; ``metricsd up`` and the proxy call this. Stop with stop_http."""
    settings = settings or HttpSettings()
    app = build_app(backend, settings=settings, registry=registry, clock=clock, metrics=metrics, consumers=consumers,
                    auth=security.auth if security is not None else None)
    return await start_http(app, host, port, security.tls if security is not None else None)
