"""Which role each gRPC method and HTTP route needs. Pure tables; None means open to anyone who
reaches the port (health probes and the dashboard page itself, whose data calls need ``read``).
"""

from __future__ import annotations

from metricsd.security.tokens import Role

__all__ = ["GRPC_ROLES", "grpc_role", "http_role"]

GRPC_ROLES: dict[str, Role | None] = {
    "/metricsd.v1.Metrics/Write": Role.WRITE,
    "/metricsd.v1.Metrics/WriteParts": Role.WRITE,
    "/metricsd.v1.Metrics/WriteStream": Role.WRITE,
    "/metricsd.v1.Metrics/Read": Role.READ,
    "/metricsd.v1.Metrics/Aggregate": Role.READ,
    "/metricsd.v1.Metrics/Rollups": Role.READ,
    "/metricsd.v1.Metrics/ListSeries": Role.READ,
    "/metricsd.v1.Metrics/LabelValues": Role.READ,
    "/metricsd.v1.Metrics/Stats": Role.READ,
    "/metricsd.v1.Metrics/Health": None,
    "/metricsd.v1.Metrics/CatchUp": Role.ADMIN,
    "/metricsd.v1.Metrics/Digest": Role.ADMIN,
    "/grpc.health.v1.Health/Check": None,
    "/grpc.health.v1.Health/Watch": None,
}


def grpc_role(method: str) -> Role | None:
    """The role ``method`` needs; a method this table does not know needs ``admin`` (a new RPC is
    closed until someone decides otherwise)."""
    return GRPC_ROLES.get(method, Role.ADMIN)


_OPEN_PATHS = ("/", "/healthz", "/-/healthy", "/-/ready")


def http_role(method: str, path: str) -> Role | None:
    if path in _OPEN_PATHS or path.startswith("/static/"):
        return None
    if path in ("/api/v1/write", "/api/v1/import"):
        return Role.WRITE
    return Role.READ
