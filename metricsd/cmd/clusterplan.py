"""What ``metricsd cluster up`` runs, as data: the processes, their flags and the port layout.

Pure (no processes, no sockets), so the layout and the flags are testable; metricsd/cmd/launch.py
runs a plan. Ports, from ``base_port`` B (default 7400, so proxy-1 answers on the single-node
defaults)::

    proxy-i           HTTP B + 10(i-1), gRPC B + 10(i-1) + 1    7400/7401, 7410/7411, ...
    agent metrics     B + 2                                     7402
    config-server-i   gRPC health B + 50 + i                    7451, 7452, ...
    etcd              client B + 79, peer B + 80                7479, 7480
    store-i           gRPC B + 100 + i                          7501, 7502, ...
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from metricsd.cmd.localsecurity import LocalSecurity
from metricsd.defaults import HOST, HTTP_PORT, LEASE_TTL_S
from metricsd.maths.slots import DEFAULT_SLOTS

__all__ = ["MAX_PROXIES", "ClusterPlan", "ProcessSpec"]

MAX_PROXIES = 5


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    command: str  # the metricsd subcommand
    args: tuple[str, ...]
    grpc_port: int | None = None

    def argv(self, log_level: str = "INFO", python: str = sys.executable) -> list[str]:
        return [python, "-m", "metricsd", "--log-level", log_level, self.command, *self.args]


@dataclass(frozen=True)
class ClusterPlan:
    """What ``cluster up`` runs; pure, so the port layout and flags are testable."""

    base_port: int = HTTP_PORT
    stores: int = 3
    proxies: int = 2
    config_servers: int = 2
    slots: int = DEFAULT_SLOTS
    rf: int = 3
    w: int = 2
    r: int = 2
    simulate: bool = True
    pods: int = 200
    workloads: int = 10
    nodes: int = 5
    host: str = HOST
    cluster: str = "default"
    lease_ttl: int = LEASE_TTL_S
    security_dir: str = ""  # TLS and tokens from LocalSecurity there; "" runs plaintext without tokens
    proxy_args: tuple[str, ...] = ()  # more flags for every proxy (the remote-write ones)

    def __post_init__(self) -> None:
        if not 1 <= self.proxies <= MAX_PROXIES:
            raise ValueError(f"--proxies must be between 1 and {MAX_PROXIES}")
        if self.stores < 1 or self.config_servers < 1 or self.stores > 99:
            raise ValueError("--stores must be 1..99 and --config-servers at least 1")
        if not 1024 <= self.base_port <= 65535 - 200:
            raise ValueError("--base-port must leave room for 200 ports above it")

    @property
    def etcd_endpoint(self) -> str:
        return f"{self.host}:{self.base_port + 79}"

    def store_port(self, i: int) -> int:
        return self.base_port + 100 + i

    def proxy_grpc_port(self, i: int) -> int:
        return self.base_port + 10 * (i - 1) + 1

    def proxy_http_port(self, i: int) -> int:
        return self.base_port + 10 * (i - 1)

    def config_port(self, i: int) -> int:
        return self.base_port + 50 + i

    def _cluster_args(self) -> tuple[str, ...]:
        return ("--etcd", self.etcd_endpoint, "--cluster", self.cluster)

    @property
    def security(self) -> LocalSecurity | None:
        return LocalSecurity(Path(self.security_dir)) if self.security_dir else None

    def _secure(self, server: bool, client: str | None = None) -> tuple[str, ...]:
        """The security flags of a process: serving TLS and checking tokens (``server``), dialling
        others over TLS with ``client``'s token."""
        sec = self.security
        if sec is None:
            return ()
        return ((*sec.server_args(),) if server else sec.tls_args()) + (sec.client_args(client) if client else ())

    def store_specs(self) -> list[ProcessSpec]:
        return [ProcessSpec(f"store-{i}", "store",
                            ("--member-id", f"store-{i}", "--host", self.host, "--grpc-port", str(self.store_port(i)),
                             "--advertise", f"{self.host}:{self.store_port(i)}", "--lease-ttl", str(self.lease_ttl),
                             *self._cluster_args(), *self._secure(True, "store")), self.store_port(i))
                for i in range(1, self.stores + 1)]

    def config_specs(self) -> list[ProcessSpec]:
        return [ProcessSpec(f"config-server-{i}", "config-server",
                            ("--id", f"config-server-{i}", "--slots", str(self.slots), "--rf", str(self.rf),
                             "--min-members", str(self.stores), "--lease-ttl", str(self.lease_ttl),
                             "--host", self.host, "--grpc-port", str(self.config_port(i)), *self._cluster_args(),
                             *self._secure(False)),
                            self.config_port(i))
                for i in range(1, self.config_servers + 1)]

    def proxy_specs(self) -> list[ProcessSpec]:
        return [ProcessSpec(f"proxy-{i}", "proxy",
                            ("--host", self.host, "--grpc-port", str(self.proxy_grpc_port(i)),
                             "--http-port", str(self.proxy_http_port(i)), "--w", str(self.w), "--r", str(self.r),
                             *self._cluster_args(), *self._secure(True, "proxy"), *self.proxy_args),
                            self.proxy_grpc_port(i))
                for i in range(1, self.proxies + 1)]

    def agent_spec(self) -> ProcessSpec:
        targets = ",".join(f"{self.host}:{self.proxy_grpc_port(i)}" for i in range(1, self.proxies + 1))
        return ProcessSpec("agent", "agent",
                           ("--simulate", "--targets", targets, "--pods", str(self.pods), "--workloads",
                            str(self.workloads), "--nodes", str(self.nodes), "--metrics-host", self.host,
                            "--metrics-port", str(self.base_port + 2), *self._secure(False, "agent")))

    def specs(self) -> list[ProcessSpec]:
        """In start order; stop in reverse."""
        out = [*self.store_specs(), *self.config_specs(), *self.proxy_specs()]
        return [*out, self.agent_spec()] if self.simulate else out

    def ports(self) -> dict[int, str]:
        """Every port the plan listens on -> what listens there (for the launcher's check)."""
        out = {self.base_port + 79: "etcd client", self.base_port + 80: "etcd peer"}
        for i in range(1, self.stores + 1):
            out[self.store_port(i)] = f"store-{i} gRPC"
        for i in range(1, self.config_servers + 1):
            out[self.config_port(i)] = f"config-server-{i} health"
        for i in range(1, self.proxies + 1):
            out[self.proxy_http_port(i)] = f"proxy-{i} HTTP"
            out[self.proxy_grpc_port(i)] = f"proxy-{i} gRPC"
        if self.simulate:
            out[self.base_port + 2] = "agent metrics"
        return out
