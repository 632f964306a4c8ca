"""Bearer tokens and roles on gRPC: a server interceptor that checks every call against
metricsd/security/policy.py before the servicer runs, and client interceptors that send a
process's token on every call (over TLS or, on loopback, plaintext alike)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from metricsd.security.auth import Authenticator, PermissionDenied, Unauthenticated
from metricsd.security.policy import grpc_role
from metricsd.security.settings import ClientSecurity
from metricsd.security.tokens import Role

__all__ = ["AuthInterceptor", "token_interceptors"]


def _authorization(context: grpc.aio.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return str(value)
    return None


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses a call with UNAUTHENTICATED (no or unknown token) or PERMISSION_DENIED (a role it
    lacks), with a message saying which; calls the policy leaves open pass untouched."""

    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        role = grpc_role(details.method)
        if handler is None or role is None:
            return handler
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._guard_unary(handler.unary_unary, role, details.method),
                request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._guard_stream(handler.unary_stream, role, details.method),
                request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._guard_stream(handler.stream_stream, role, details.method),
                request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
        # A stream-unary RPC would pass unchecked: refuse it until this guard knows the shape.
        raise NotImplementedError(f"no token check for the stream-unary method {details.method}")

    async def _check(self, context: grpc.aio.ServicerContext, role: Role, method: str) -> None:
        try:
            await self.auth.check(_authorization(context), role, method, context.peer())
        except Unauthenticated as e:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(e))
        except PermissionDenied as e:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(e))

    def _guard_unary(self, behaviour: Callable[..., Awaitable[Any]], role: Role, method: str
                     ) -> Callable[..., Awaitable[Any]]:
        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await self._check(context, role, method)
            return await behaviour(request, context)

        return guarded

    def _guard_stream(self, behaviour: Callable[..., AsyncIterator[Any]], role: Role, method: str
                      ) -> Callable[..., AsyncIterator[Any]]:
        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await self._check(context, role, method)
            async for item in behaviour(request, context):
                yield item

        return guarded


def _with_token(details: Any, token: str | None) -> Any:
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    if token:
        metadata.add("authorization", f"Bearer {token}")
    return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata, details.credentials,
                                      details.wait_for_ready)


class _Token:
    """Sends ``token()`` as the bearer token; gRPC wants one interceptor class per call shape."""

    def __init__(self, token: Callable[[], str | None]) -> None:
        self.token = token


class _UnaryToken(_Token, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self.token()), request)


class _StreamToken(_Token, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self.token()), request)


class _BothStreamsToken(_Token, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(_with_token(details, self.token()), request_iterator)


def token_interceptors(security: ClientSecurity | None) -> list[Any]:
    """Interceptors sending ``security``'s token (read anew as its file changes) on every call."""
    if security is None or not security.sends_token:
        return []
    return [_UnaryToken(security.bearer), _StreamToken(security.bearer), _BothStreamsToken(security.bearer)]
