"""The listeners of a stateless front over other servers (``metricsd proxy``, ``metricsd
federate``): its backend over the gRPC API with grpc.health.v1, the probes port, and the HTTP API
unless ``--http-port`` is negative. Started in that order, stopped in reverse, so both commands
shut down alike."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from prometheus_client import CollectorRegistry

from metricsd.clock import Clock
from metricsd.cmd.queryflags import http_settings_from_args
from metricsd.cmd.security import serve_probes
from metricsd.http.selfmetrics import SelfMetrics
from metricsd.http.server import serve_http, stop_http
from metricsd.rpc.backend import MetricsBackend
from metricsd.rpc.health import start_cluster_grpc
from metricsd.rpc.servicer import MetricsServicer
from metricsd.security.settings import ServerSecurity

__all__ = ["serve_front"]


@asynccontextmanager
async def serve_front(args: argparse.Namespace, backend: MetricsBackend, security: ServerSecurity, clock: Clock,
                      registry: CollectorRegistry, metrics: SelfMetrics | None = None) -> AsyncIterator[str]:
    """Yields where it listens ("gRPC host:port, HTTP http://host:port") for the start-up line."""
    grpc_server = http_runner = probes = None
    try:
        grpc_server, grpc_port = await start_cluster_grpc(MetricsServicer(backend), backend, args.host,
                                                          args.grpc_port, security)
        probes = await serve_probes(args, backend)
        where = f"gRPC {args.host}:{grpc_port}"
        if args.http_port >= 0:
            http_runner, http_port = await serve_http(backend, args.host, args.http_port, registry, clock,
                                                      security=security, settings=http_settings_from_args(args),
                                                      metrics=metrics)
            where += f", HTTP {'https' if security.tls else 'http'}://{args.host}:{http_port}"
        yield where
    finally:
        if http_runner is not None:
            await stop_http(http_runner)
        if grpc_server is not None:
            await grpc_server.stop(grace=2.0)
        if probes is not None:
            await probes.stop(grace=None)
