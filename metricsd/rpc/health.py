"""The standard gRPC health service (``grpc.health.v1.Health/Check``) next to the Metrics API.

Kubernetes' ``grpc`` probes and tools such as grpc-health-probe speak this service, not our
``Metrics/Health`` RPC, so cluster processes serve both on the same port. The two messages are a
single field each, so they are encoded here by hand rather than pulling in grpcio-health-checking:

- ``HealthCheckRequest {string service = 1;}``
- ``HealthCheckResponse {ServingStatus status = 1;}`` with SERVING = 1, NOT_SERVING = 2.

Service names: ``""`` and ``"readiness"`` answer from the backend's Health (SERVING or
CATCHING_UP count as serving: a catching-up store takes writes); ``"liveness"`` answers SERVING
whenever the process answers at all, so that a store waiting for etcd or for its first shard map
is not restarted by its liveness probe (a restart would not help).
"""

from __future__ import annotations

from typing import Any, Protocol

import grpc

from metricsd.proto import metricsd_pb2 as pb
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.rpc.server import listen, new_server
from metricsd.security.settings import ServerSecurity

__all__ = ["HEALTH_SERVICE", "HasHealth", "decode_check_request", "encode_check_response", "health_handler",
           "start_cluster_grpc"]

HEALTH_SERVICE = "grpc.health.v1.Health"
SERVING = 1
NOT_SERVING = 2
_READY = (pb.HealthResponse.SERVING, pb.HealthResponse.CATCHING_UP)


class HasHealth(Protocol):
    """What the health service needs: a MetricsBackend, or a process with no data API."""

    async def health(self) -> pb.HealthResponse: ...


def decode_check_request(data: bytes) -> str:
    """The ``service`` field of a HealthCheckRequest; unknown fields are skipped."""
    i, service = 0, ""
    while i < len(data):
        key, i = _varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, i = _varint(data, i)
        elif wire == 2:
            n, i = _varint(data, i)
            if field == 1:
                service = data[i : i + n].decode("utf-8", errors="replace")
            i += n
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return service


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if i >= len(data):
            raise ValueError("truncated varint")
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def encode_check_response(status: int) -> bytes:
    return bytes([0x08, status])


def health_handler(backend: HasHealth) -> grpc.GenericRpcHandler:
    async def check(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            service = decode_check_request(request)
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad HealthCheckRequest: {e}")
            raise AssertionError("unreachable") from e
        if service == "liveness":
            return encode_check_response(SERVING)
        if service not in ("", "readiness"):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {service!r}")
        try:
            status = (await backend.health()).status
        except Exception:
            return encode_check_response(NOT_SERVING)
        return encode_check_response(SERVING if status in _READY else NOT_SERVING)

    identity: Any = lambda b: b  # noqa: E731  # raw bytes both ways
    return grpc.method_handlers_generic_handler(HEALTH_SERVICE, {
        "Check": grpc.unary_unary_rpc_method_handler(check, request_deserializer=identity,
                                                     response_serializer=identity),
    })


async def start_cluster_grpc(servicer: pb_grpc.MetricsServicer | None, backend: HasHealth, host: str,
                             port: int, security: ServerSecurity | None = None) -> tuple[grpc.aio.Server, int]:
    """Serve the Metrics API (unless ``servicer`` is None) and the health service; returns the
    server and the bound port (useful with port 0). Health checks stay open to probes."""
    server = new_server(security)
    if servicer is not None:
        pb_grpc.add_MetricsServicer_to_server(servicer, server)
    server.add_generic_rpc_handlers((health_handler(backend),))
    bound = listen(server, host, port, security)
    await server.start()
    return server, bound
