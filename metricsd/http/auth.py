"""Bearer tokens and roles on the HTTP API: a middleware that checks every request against
metricsd/security/policy.py before its handler runs, answering in Prometheus' error shape:
401 ``unauthorized`` (with ``WWW-Authenticate: Bearer``) or 403 ``forbidden``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from metricsd.security.auth import Authenticator, PermissionDenied, Unauthenticated
from metricsd.security.policy import http_role

__all__ = ["IDENTITY_KEY", "auth_middleware"]

IDENTITY_KEY = web.RequestKey("identity", str)  # the authenticated name of a request's sender

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, error_type: str, message: str) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="metricsd"'} if status == 401 else None
    return web.json_response({"status": "error", "errorType": error_type, "error": message}, status=status,
                             headers=headers)


def auth_middleware(auth: Authenticator) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        role = http_role(request.method, request.path)
        what = f"{request.method} {request.path}"
        try:
            identity = await auth.check(request.headers.get("Authorization"), role, what, request.remote or "?")
        except Unauthenticated as e:
            return _error(401, "unauthorized", str(e))
        except PermissionDenied as e:
            return _error(403, "forbidden", str(e))
        if identity is not None:
            request[IDENTITY_KEY] = identity.name  # who sent it, e.g. for refused samples per sender
        return await handler(request)

    return check
