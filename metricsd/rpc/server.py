"""gRPC server options and start-up, shared by every process that serves the Metrics API."""

from __future__ import annotations

import grpc

from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.rpc.auth import AuthInterceptor
from metricsd.security.settings import ServerSecurity

__all__ = ["GRPC_OPTIONS", "listen", "new_server", "start_grpc_server"]

# Large batches and aggregate replies (per-series partials of big workloads) exceed gRPC's 4 MiB default.
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


def new_server(security: ServerSecurity | None = None) -> grpc.aio.Server:
    """A gRPC server with metricsd's options, checking tokens and roles when ``security`` has an
    authenticator."""
    interceptors = [AuthInterceptor(security.auth)] if security is not None and security.auth is not None else []
    return grpc.aio.server(options=GRPC_OPTIONS, interceptors=interceptors)


def listen(server: grpc.aio.Server, host: str, port: int, security: ServerSecurity | None = None) -> int:
    """Add host:port, over TLS when ``security`` has it; returns the bound port. Raises OSError."""
    address = f"{host}:{port}"
    if security is not None and security.tls is not None:
        bound = server.add_secure_port(address, security.tls.grpc_credentials())
    else:
        bound = server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot listen on {address} (in use?)")
    return int(bound)


async def start_grpc_server(servicer: pb_grpc.MetricsServicer, host: str, port: int,
                            security: ServerSecurity | None = None) -> tuple[grpc.aio.Server, int]:
    """Start serving; returns the server and the bound port (useful with port 0)."""
    server = new_server(security)
    pb_grpc.add_MetricsServicer_to_server(servicer, server)
    bound = listen(server, host, port, security)
    await server.start()
    return server, bound
