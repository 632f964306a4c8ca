"""Every gRPC channel metricsd opens to another metricsd process: TLS and a bearer token as the
process's ClientSecurity says, plaintext without one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from metricsd.rpc.auth import token_interceptors
from metricsd.rpc.server import GRPC_OPTIONS
from metricsd.security.settings import ClientSecurity

__all__ = ["open_channel"]


def open_channel(address: str, security: ClientSecurity | None = None,
                 options: Sequence[tuple[str, Any]] = GRPC_OPTIONS) -> grpc.aio.Channel:
    opts = list(options)
    interceptors = token_interceptors(security)
    if security is not None and security.tls is not None:
        return grpc.aio.secure_channel(address, security.tls.grpc_credentials(),
                                       options=opts + security.tls.grpc_options(), interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=opts, interceptors=interceptors)
