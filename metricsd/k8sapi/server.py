"""The aiohttp shell of the aggregated API server: routes, who may call them, errors as Status.

Every handler gathers the request's parameters, asks ``ResourceMetrics`` or ``CustomMetrics`` and
returns their JSON; errors become ``metav1.Status`` objects (400 for a bad selector, 404 for an
unknown object or metric, 503 when the store or proxy cannot answer).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from metricsd import __version__
from metricsd.clock import Clock, SystemClock
from metricsd.k8sapi.custom import CustomMetrics, MetricNotFound, custom_resources, external_resources
from metricsd.k8sapi.discovery import (
    CUSTOM,
    EXTERNAL,
    GROUPS,
    METRICS,
    ApiGroup,
    ResourceEntry,
    api_group,
    api_group_list,
    resource_list,
    status,
)
from metricsd.k8sapi.labelselector import SelectorError, parse_label_selector, to_matchers
from metricsd.k8sapi.requestheader import FrontProxyUser, RequestHeaderSettings, front_proxy_user
from metricsd.k8sapi.resource import ResourceMetrics, pod_metrics_list, single
from metricsd.rpc.backend import BadRequest, MetricsBackend, Unavailable
from metricsd.security.auth import Authenticator, PermissionDenied, Unauthenticated
from metricsd.security.tls import ServerTLS
from metricsd.security.tokens import Role
from metricsd.selector import Matcher

__all__ = ["FrontProxyTLS", "K8sApiSettings", "build_k8s_app"]

log = logging.getLogger("metricsd.security")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_OPEN = ("/healthz", "/livez", "/readyz", "/openapi/v2", "/version", "/apis")


class FrontProxyTLS(ServerTLS):
    """ServerTLS whose listener asks for a client certificate without requiring one: probes and
    token holders connect without, the front proxy with its own, which must chain to the
    request-header CA (``client_ca``) or the handshake fails."""

    def ssl_context(self) -> ssl.SSLContext:
        ctx = super().ssl_context()
        if self.client_ca is not None:
            ctx.verify_mode = ssl.CERT_OPTIONAL
        return ctx


@dataclass(frozen=True)
class K8sApiSettings:
    window_ms: int = 60_000
    # Label selector keys applied to series labels; others are ignored (no pod labels are stored).
    selector_keys: frozenset[str] = frozenset()
    requestheader: RequestHeaderSettings | None = None


def _json(doc: dict[str, Any], code: int = 200) -> web.Response:
    return web.json_response(doc, status=code)


def _fail(code: int, message: str, details: dict[str, str] | None = None) -> web.Response:
    return _json(status(code, message, details), code)


def _is_open(path: str) -> bool:
    if path in _OPEN:
        return True
    parts = [p for p in path.split("/") if p]
    # /apis/<group> and /apis/<group>/<version>: discovery only
    return len(parts) in (2, 3) and parts[0] == "apis" and any(parts[1] == g.name for g in GROUPS)


def _auth_middleware(settings: K8sApiSettings, auth: Authenticator | None
                     ) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if _is_open(request.path):
            return await handler(request)
        peer = request.remote or "?"
        user: FrontProxyUser | None = None
        if settings.requestheader is not None and request.transport is not None:
            peercert = request.transport.get_extra_info("peercert")
            user = front_proxy_user(settings.requestheader, peercert, list(request.headers.items()))
        if user is not None:
            return await handler(request)
        if auth is not None:
            try:
                await auth.check(request.headers.get("Authorization"), Role.READ, f"GET {request.path}", peer)
            except Unauthenticated as e:
                return _fail(401, f"Unauthorized: {e}")
            except PermissionDenied as e:
                return _fail(403, str(e))
            return await handler(request)
        if settings.requestheader is None:
            return await handler(request)  # neither configured: open (loopback only, checked at start)
        log.warning("denied GET %s from %s: no front-proxy certificate and no token", request.path, peer)
        return _fail(401, "Unauthorized: no front-proxy client certificate and no bearer token")

    return check


def _selector(request: web.Request, param: str, keys: frozenset[str] | None) -> tuple[list[Matcher], str | None]:
    """Matchers from a selector parameter; with ``keys``, only requirements on those keys."""
    text = request.query.get(param)
    if not text:
        return [], None
    reqs = parse_label_selector(text)
    if keys is not None:
        reqs = [r for r in reqs if r.key in keys]
    return to_matchers(reqs), text


def build_k8s_app(backend: MetricsBackend, rules: CustomMetrics | None, settings: K8sApiSettings,
                  auth: Authenticator | None = None, clock: Clock | None = None) -> web.Application:
    clock = clock or SystemClock()
    resources = ResourceMetrics(backend, settings.window_ms)
    middlewares: list[Callable[..., Awaitable[web.StreamResponse]]] = [_auth_middleware(settings, auth)]
    app = web.Application(middlewares=middlewares)

    async def guarded(request: web.Request, work: Callable[[], Awaitable[web.Response]]) -> web.Response:
        try:
            return await work()
        except SelectorError as e:
            return _fail(400, f"invalid selector: {e}")
        except BadRequest as e:
            return _fail(400, str(e))
        except MetricNotFound as e:
            return _fail(404, str(e))
        except Unavailable as e:
            return _fail(503, f"metrics backend unavailable: {e}")

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        try:
            await backend.health()
        except Unavailable as e:
            return web.Response(status=500, text=f"[-]metricsd backend failed: {e}\nreadyz check failed")
        return web.Response(text="ok")

    async def openapi(_: web.Request) -> web.Response:
        return _json({"swagger": "2.0", "info": {"title": "metricsd", "version": __version__}, "paths": {}})

    async def version(_: web.Request) -> web.Response:
        return _json({"major": "", "minor": "", "gitVersion": f"metricsd-{__version__}"})

    served = (METRICS, *((CUSTOM, EXTERNAL) if rules is not None else ()))

    async def groups(_: web.Request) -> web.Response:
        return _json(api_group_list(served))

    def group_of(request: web.Request) -> ApiGroup | None:
        return next((g for g in served if g.name == request.match_info["group"]), None)

    async def group(request: web.Request) -> web.Response:
        g = group_of(request)
        if g is None:
            return _fail(404, f"the server could not find the requested resource (group {request.match_info['group']})")
        return _json(api_group(g))

    async def version_resources(request: web.Request) -> web.Response:
        g = group_of(request)
        if g is None or request.match_info["version"] != g.version:
            return _fail(404, "the server could not find the requested resource")

        async def work() -> web.Response:
            entries: Sequence[ResourceEntry]
            if g == METRICS:
                entries = (ResourceEntry("nodes", False, "NodeMetrics", ("get", "list")),
                           ResourceEntry("pods", True, "PodMetrics", ("get", "list")))
            else:
                assert rules is not None
                found = await rules.discovered()
                entries = custom_resources(found) if g == CUSTOM else external_resources(found)
            return _json(resource_list(g, entries))

        return await guarded(request, work)

    def keys() -> frozenset[str]:
        return settings.selector_keys

    async def pods(request: web.Request) -> web.Response:
        ns, name = request.match_info.get("ns"), request.match_info.get("name")

        async def work() -> web.Response:
            selector, _ = _selector(request, "labelSelector", keys())
            items = await resources.pods(clock.now_ms(), ns, name, selector)
            if name is None:
                return _json(pod_metrics_list(items, "PodMetrics"))
            if not items:
                return _fail(404, f'podmetrics.metrics.k8s.io "{ns}/{name}" not found',
                             {"name": f"{ns}/{name}", "group": METRICS.name, "kind": "pods"})
            return _json(single(items[0], "PodMetrics"))

        return await guarded(request, work)

    async def nodes(request: web.Request) -> web.Response:
        name = request.match_info.get("name")

        async def work() -> web.Response:
            items = await resources.nodes(clock.now_ms(), name)
            if name is None:
                return _json(pod_metrics_list(items, "NodeMetrics"))
            if not items:
                return _fail(404, f'nodemetrics.metrics.k8s.io "{name}" not found',
                             {"name": name, "group": METRICS.name, "kind": "nodes"})
            return _json(single(items[0], "NodeMetrics"))

        return await guarded(request, work)

    async def custom(request: web.Request) -> web.Response:
        mi = request.match_info
        ns = mi.get("ns")
        resource, name = (("namespaces", ns) if mi.get("resource") is None and ns is not None
                          else (mi["resource"], mi["name"]))

        async def work() -> web.Response:
            assert rules is not None and name is not None
            selector, text = _selector(request, "metricSelector", None)
            return _json(await rules.custom(mi["metric"], resource, ns, name, selector, text, clock.now_ms()))

        return await guarded(request, work)

    async def external(request: web.Request) -> web.Response:
        async def work() -> web.Response:
            assert rules is not None
            selector, _ = _selector(request, "labelSelector", None)
            return _json(await rules.external(request.match_info["metric"], request.match_info["ns"], selector,
                                              clock.now_ms()))

        return await guarded(request, work)

    m, c, x = (f"/apis/{g.group_version}" for g in GROUPS)
    app.router.add_get("/healthz", ok)
    app.router.add_get("/livez", ok)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/openapi/v2", openapi)
    app.router.add_get("/version", version)
    app.router.add_get("/apis", groups)
    app.router.add_get("/apis/{group}", group)
    app.router.add_get("/apis/{group}/{version}", version_resources)
    app.router.add_get(f"{m}/nodes", nodes)
    app.router.add_get(f"{m}/nodes/{{name}}", nodes)
    app.router.add_get(f"{m}/pods", pods)
    app.router.add_get(f"{m}/namespaces/{{ns}}/pods", pods)
    app.router.add_get(f"{m}/namespaces/{{ns}}/pods/{{name}}", pods)
    if rules is not None:
        app.router.add_get(f"{c}/namespaces/{{ns}}/metrics/{{metric}}", custom)
        app.router.add_get(f"{c}/namespaces/{{ns}}/{{resource}}/{{name}}/{{metric}}", custom)
        app.router.add_get(f"{c}/{{resource}}/{{name}}/{{metric}}", custom)
        app.router.add_get(f"{x}/namespaces/{{ns}}/{{metric}}", external)
    return app
