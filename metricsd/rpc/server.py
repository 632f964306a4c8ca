"""gRPC server options and start-up, shared by every process that serves the Metrics API."""

from __future__ import annotations

import grpc

from metricsd.proto import metricsd_pb2_grpc as pb_grpc

__all__ = ["GRPC_OPTIONS", "start_grpc_server"]

# Large batches and aggregate replies (per-series partials of big workloads) exceed gRPC's 4 MiB default.
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


async def start_grpc_server(servicer: pb_grpc.MetricsServicer, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """Start serving; returns the server and the bound port (useful with port 0)."""
    server = grpc.aio.server(options=GRPC_OPTIONS)
    pb_grpc.add_MetricsServicer_to_server(servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port} (in use?)")
    await server.start()
    return server, bound
