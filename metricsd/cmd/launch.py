"""Running a cluster plan's processes: start, check, watch, stop (``cluster up`` and ``chaos``).

What an operator can count on:

- **Nothing outlives the launcher.** Every child ends when the launcher does, however it ends
  (SIGKILL, a closed terminal, the OOM killer): metricsd children are told their parent and ask
  for SIGTERM on its death; etcd is started through metricsd/parentdeath.py's exec wrapper with
  SIGKILL. Children are started from the calling thread (the main or event-loop thread), which
  lives as long as the launcher: the kernel signals a child when the thread that started it ends.
- **A taken port stops the start, named.** Before starting anything every port of the plan is
  tried; one that is taken ends the start with a line per port naming the process that holds it
  where it can (metricsd/cmd/ports.py), instead of a cluster coming up against an old etcd.
- **Ready means serving.** :meth:`LocalCluster.start` returns once etcd answers /health, every
  gRPC child answers Health, every proxy's HTTP port and the agent's metrics port accept
  connections and every store reports SERVING (it has a shard map and is level with its peers).
  A child that exits meanwhile fails the start with its exit code and its log's last lines.
- **A death is reported.** :meth:`LocalCluster.deaths` names each child that exited since the
  last call, with its log's tail; ``cluster up`` prints them as they happen.

Not thread-safe: use one LocalCluster from one thread (the one that started it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
from pathlib import Path

import grpc

from metricsd.cluster.etcd_server import EtcdServer, EtcdServerError
from metricsd.cmd.clusterplan import ClusterPlan, ProcessSpec
from metricsd.cmd.ports import taken_ports
from metricsd.cmd.status import member_health
from metricsd.parentdeath import parent_env
from metricsd.rpc.channel import open_channel
from metricsd.rpc.health import HEALTH_SERVICE
from metricsd.security.settings import ClientSecurity

__all__ = ["LaunchError", "LocalCluster", "log_tail"]

log = logging.getLogger("metricsd.cluster")

TAIL_LINES = 20


class LaunchError(RuntimeError):
    """The cluster could not start (a port taken, a child that died or never became ready); the
    message says which and shows the child's log tail. Whatever had started is stopped again."""


def log_tail(path: Path, lines: int = TAIL_LINES, max_bytes: int = 16_384) -> str:
    """The last ``lines`` lines of a log file, each indented, or a note when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            text = f.read().decode(errors="replace")
    except OSError as e:
        return f"    (log {path} unreadable: {e})"
    kept = text.splitlines()[-lines:] if text else []
    return "\n".join(f"    {line}" for line in kept) if kept else "    (log empty)"


class LocalCluster:
    """Starts and stops a plan's processes. :meth:`stop` is idempotent."""

    def __init__(self, plan: ClusterPlan, data_dir: Path, log_level: str = "INFO") -> None:
        self.plan = plan
        self.data_dir = data_dir
        self.log_dir = data_dir / "logs"
        self.log_level = log_level
        host, _, client_port = plan.etcd_endpoint.rpartition(":")
        self.etcd = EtcdServer(data_dir / "etcd", host=host, client_port=int(client_port),
                               peer_port=plan.base_port + 80, log_path=self.log_dir / "etcd.log")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._reported: set[tuple[str, int]] = set()  # (name, pid) of deaths already reported

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def spawn(self, spec: ProcessSpec) -> subprocess.Popen[bytes]:
        """Start one child (from this thread: it ends when this thread does)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = parent_env(dict(os.environ, PYTHONUNBUFFERED="1"))
        with open(self.log_path(spec.name), "ab") as out:
            proc = subprocess.Popen(spec.argv(self.log_level),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)  # no preexec_fn: see metricsd/parentdeath.py
        self.procs[spec.name] = proc
        return proc

    def check_ports(self) -> None:
        """Raises LaunchError naming every port of the plan that is taken, and by whom."""
        taken = taken_ports(self.plan.host, self.plan.ports())
        if taken:
            raise LaunchError("cannot start: " + "; ".join(taken) + ". Stop that process (a cluster of an earlier "
                              "run?) or choose another --base-port")

    def client_security(self) -> ClientSecurity | None:
        sec = self.plan.security
        return sec.client("ops") if sec is not None else None

    async def start(self, timeout_s: float = 90.0) -> None:
        """Check the ports, start etcd and every child, and return once all are serving.
        Raises LaunchError (after stopping what had started)."""
        self.check_ports()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.plan.security is not None:
            await asyncio.to_thread(self.plan.security.create)
        try:
            self.etcd.spawn()
            await self.etcd.wait_healthy_async(timeout_s)
            for spec in self.plan.specs():
                self.spawn(spec)
            await asyncio.wait_for(self._all_ready(), timeout_s)
        except EtcdServerError as e:
            self.stop()
            raise LaunchError(str(e)) from None
        except TimeoutError:
            waiting = await self._not_ready()
            self.stop()
            raise LaunchError(f"not ready within {timeout_s:.0f} s: " + "; ".join(waiting)) from None
        except BaseException:
            self.stop()
            raise

    async def _all_ready(self) -> None:
        while True:
            self._raise_if_dead()
            if not await self._not_ready():
                return
            await asyncio.sleep(0.2)  # polling child processes

    def _raise_if_dead(self) -> None:
        if not self.etcd.running:
            raise LaunchError(f"etcd exited during the start; last lines of {self.etcd.log_path}:\n"
                              f"{log_tail(self.etcd.log_path)}")
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise LaunchError(f"{name} exited with code {proc.returncode} during the start; last lines of "
                                  f"{self.log_path(name)}:\n{log_tail(self.log_path(name))}")

    async def _not_ready(self) -> list[str]:
        """What is not serving yet, one phrase each (empty: all ready)."""
        p, security = self.plan, self.client_security()
        waiting: list[str] = []
        for spec in p.specs():
            if spec.grpc_port is None:
                continue
            address = f"{p.host}:{spec.grpc_port}"
            if spec.command == "config-server":  # serves grpc.health.v1 only
                if not await _health_check(address, security):
                    waiting.append(f"{spec.name} does not answer health checks on {address}")
            else:
                status = await member_health(address, 2.0, security)
                if status.startswith("unreachable"):
                    waiting.append(f"{spec.name} does not answer Health on {address}")
                elif spec.command == "store" and status != "SERVING":
                    waiting.append(f"{spec.name} is {status} (no shard map yet, or catching up)")
        ports = [(f"proxy-{i}", p.proxy_http_port(i)) for i in range(1, p.proxies + 1)]
        if p.simulate:
            ports.append(("agent", p.base_port + 2))
        for name, port in ports:
            if not await _listening(p.host, port):
                waiting.append(f"{name} does not listen on {p.host}:{port}")
        return waiting

    def deaths(self) -> list[str]:
        """A message for each child (etcd included) that exited since the last call, with its log's tail."""
        out = []
        dead = [(n, p.pid, p.returncode, self.log_path(n)) for n, p in self.procs.items() if p.poll() is not None]
        if self.etcd.pid is not None and not self.etcd.running:
            dead.append(("etcd", self.etcd.pid, None, self.etcd.log_path))
        for name, pid, code, path in dead:
            if (name, pid) in self._reported:
                continue
            self._reported.add((name, pid))
            how = f"exited with code {code}" if code is not None else "exited"
            out.append(f"{name} (pid {pid}) {how}; last lines of {path}:\n{log_tail(path)}")
        return out

    def dead(self) -> list[str]:
        return [name for name, p in self.procs.items() if p.poll() is not None]

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM each child in reverse start order (SIGKILL after ``timeout_s``), etcd last."""
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


async def _health_check(address: str, security: ClientSecurity | None) -> bool:
    """grpc.health.v1 Check of the ``liveness`` service answered (metricsd/rpc/health.py)."""
    request = b"\x0a\x08liveness"  # HealthCheckRequest{service: "liveness"}
    async with open_channel(address, security) as channel:
        check = channel.unary_unary(f"/{HEALTH_SERVICE}/Check")
        try:
            await check(request, timeout=2.0)
        except grpc.aio.AioRpcError:
            return False
    return True


async def _listening(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2.0)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def supervise(argv: list[str]) -> int:
    """A launcher of one child, as ``cluster up`` launches each: ``python -m metricsd.cmd.launch
    LOG -- COMMAND...`` starts COMMAND with its output appended to LOG, told to end with this
    process; prints the child's pid on a line of its own, waits for it and exits with its status.
    ``metricsd chaos`` runs a store this way and SIGKILLs the launcher, to check that the child
    goes with it. It ends with its own parent too."""
    import sys

    from metricsd.parentdeath import die_with_parent

    die_with_parent()
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m metricsd.cmd.launch LOG -- COMMAND...", file=sys.stderr)
        return 2
    with open(argv[0], "ab") as out:
        child = subprocess.Popen(argv[2:], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 env=parent_env(dict(os.environ, PYTHONUNBUFFERED="1")), start_new_session=True)
    print(child.pid, flush=True)
    return child.wait()


if __name__ == "__main__":
    import sys

    sys.exit(supervise(sys.argv[1:]))
