"""Bearer tokens and roles on the HTTP API: a middleware that checks every request against
metricsd/security/policy.py before its handler runs, answering in Prometheus' error shape:
401 ``unauthorized`` (with ``WWW-Authenticate: Bearer``) or 403 ``forbidden``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from metricsd.security.auth import Authenticator, PermissionDenied, Unauthenticated
from metricsd.security.policy import http_role

__all__ = ["IDENTITY_KEY", "UNAUTHORIZED_HEADERS", "auth_middleware", "refusal"]

IDENTITY_KEY = web.RequestKey("identity", str)  # the authenticated name of a request's sender

UNAUTHORIZED_HEADERS = {"WWW-Authenticate": 'Bearer realm="metricsd"'}  # with every 401

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, error_type: str, message: str) -> web.Response:
    headers = UNAUTHORIZED_HEADERS if status == 401 else None
    return web.json_response({"status": "error", "errorType": error_type, "error": message}, status=status,
                             headers=headers)


async def refusal(auth: Authenticator, method: str, path: str, authorization: str | None, peer: str
                  ) -> tuple[int, str, str] | str | None:
    """A request's check: (status, errorType, message) when refused, else the sender's name (None for
    an open route). The middleware below and the hot path (metricsd/http/hotpath.py) share it."""
    try:
        identity = await auth.check(authorization, http_role(method, path), f"{method} {path}", peer)
    except Unauthenticated as e:
        return 401, "unauthorized", str(e)
    except PermissionDenied as e:
        return 403, "forbidden", str(e)
    return identity.name if identity is not None else None


def auth_middleware(auth: Authenticator) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        got = await refusal(auth, request.method, request.path, request.headers.get("Authorization"),
                            request.remote or "?")
        if isinstance(got, tuple):
            return _error(*got)
        if got is not None:
            request[IDENTITY_KEY] = got  # who sent it, e.g. for refused samples per sender
        return await handler(request)

    return check
