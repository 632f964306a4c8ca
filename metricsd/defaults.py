"""Defaults that more than one process or command shares, defined once.

Every flag's default and every settings dataclass's default that names a port or an interval
used in several places comes from here, so ``metricsd up``, ``metricsd store``, the proxy, the
agent, the consumers and ``metricsd cluster up`` cannot drift apart.
"""

from __future__ import annotations

__all__ = [
    "AGENT_METRICS_PORT",
    "ANTI_ENTROPY_INTERVAL_S",
    "CONFIG_SERVER_HEALTH_PORT",
    "GRPC_PORT",
    "HOST",
    "HTTP_PORT",
    "K8S_API_PORT",
    "LEASE_TTL_S",
    "SNAPSHOT_INTERVAL_S",
    "grpc_address",
    "http_url",
]

HOST = "127.0.0.1"
"""What every listener binds unless told otherwise: loopback only."""

GRPC_PORT = 7401
"""The Metrics API over gRPC: a store's, a proxy's, ``metricsd up``'s."""

HTTP_PORT = 7400
"""The HTTP API (Prometheus query API, remote write, native JSON, dashboard, /metrics)."""

AGENT_METRICS_PORT = 7402
"""The node agent's own /metrics."""

CONFIG_SERVER_HEALTH_PORT = 7403
"""A config server's grpc.health.v1 endpoint for probes."""

SNAPSHOT_INTERVAL_S = 600.0
"""Seconds between a durable store's snapshots (and one on a clean shutdown)."""

ANTI_ENTROPY_INTERVAL_S = 240.0
"""Seconds between a cluster store's anti-entropy rounds (metricsd/replica/replication.py): a
64-slot pass in 16 minutes. Hinted hand-off and read repair do the quick repairs; this is the
backstop, and it runs whether or not anything is written. On the side-by-side cluster (3 stores,
RF 3, 40,000 series x 2 h) a round cost the stores about 0.95 CPU s together, measured idle in
10 s windows (perf/RESULTS.md, "The cluster column"): every 60 s that is more than ingesting
the same 40,000 series at a 10 s interval costs them (240,000 samples a minute, ~0.7 CPU s)."""

LEASE_TTL_S = 5
"""etcd lease of a store's member record and of the config servers' leader key, seconds."""


def grpc_address(host: str = HOST, port: int = GRPC_PORT) -> str:
    return f"{host}:{port}"


def http_url(host: str = HOST, port: int = HTTP_PORT) -> str:
    return f"http://{host}:{port}"

K8S_API_PORT = 7443
"""``metricsd k8s-api``: the aggregated API server (HTTPS) the API server's aggregator calls."""
