"""Real cluster processes for the fault tests: stores, config servers and proxies on loopback.

Each process is the command an operator runs (``python -m metricsd <command>``), with its output in a log
file under the test's tmp_path; :meth:`Procs.close` stops whatever is left. They run as ``metricsd cluster
up`` runs them: mutual TLS and a token per role (metricsd/cmd/localsecurity.py); tests dial them with
:meth:`Procs.client`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from metricsd.cluster.kv import KV
from metricsd.cluster.shardmap import KeyLayout, ShardMap
from metricsd.cmd.localsecurity import LocalSecurity
from metricsd.ports import free_port
from metricsd.security.settings import ClientSecurity

ROOT = Path(__file__).resolve().parents[2]




class Proc:
    def __init__(self, name: str, argv: list[str], log: Path, port: int | None) -> None:
        self.name, self.argv, self.log, self.port = name, argv, log, port
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                          cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"))

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill9(self) -> None:
        self.popen.kill()
        self.popen.wait()

    def stop(self, timeout_s: float = 10.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        return self.popen.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class Procs:
    """Starts cluster processes against one etcd and key layout."""

    def __init__(self, tmp: Path, etcd: str, layout: KeyLayout, security: LocalSecurity | None = None) -> None:
        self.tmp, self.etcd, self.layout = tmp, etcd, layout
        self.procs: list[Proc] = []
        self.security = security or LocalSecurity(tmp / "security").create()

    def client(self) -> ClientSecurity:
        """TLS and the admin token: how a test talks to the processes."""
        return self.security.client("ops")

    def _secure(self, command: str) -> list[str]:
        sec = self.security
        if command == "store":
            return [*sec.server_args(), *sec.client_args("store")]
        if command == "proxy":
            return [*sec.server_args(), *sec.client_args("proxy")]
        return [*sec.tls_args()]

    def _cluster(self) -> list[str]:
        return ["--etcd", self.etcd, "--etcd-root", self.layout.root, "--cluster", self.layout.cluster,
                "--etcd-timeout", "1.0"]

    def start(self, name: str, command: str, args: list[str], port: int | None = None) -> Proc:
        argv = [sys.executable, "-m", "metricsd", "--log-level", "INFO", command, *args, *self._cluster(),
                *self._secure(command)]
        proc = Proc(name, argv, self.tmp / f"{name}.log", port)
        self.procs.append(proc)
        return proc

    def store(self, member_id: str, port: int | None = None, ttl: int = 2, extra: tuple[str, ...] = ()) -> Proc:
        port = port or free_port()
        return self.start(member_id, "store",
                          ["--member-id", member_id, "--grpc-port", str(port), "--lease-ttl", str(ttl), *extra], port)

    def config_server(self, server_id: str, slots: int = 16, rf: int = 2, ttl: int = 2, min_members: int = 1) -> Proc:
        return self.start(server_id, "config-server",
                          ["--id", server_id, "--slots", str(slots), "--rf", str(rf), "--lease-ttl", str(ttl),
                           "--debounce", "0.2", "--min-members", str(min_members), "--grpc-port", "-1"])

    def proxy(self, name: str, w: int = 2, r: int = 2) -> Proc:
        port = free_port()
        return self.start(name, "proxy",
                          ["--grpc-port", str(port), "--http-port", "-1", "--w", str(w), "--r", str(r),
                           "--call-timeout", "2.0"], port)

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()

    def logs(self) -> str:
        return "\n".join(f"----- {p.name} -----\n{p.output()[-3000:]}" for p in self.procs)


# Waits for a process to come up: on a 2-core machine running other suites (load average 15), three
# stores starting at once once took more than 20 s to register; a wait that ends early is as exact.
STARTUP_S = 60.0


async def wait_listening(proc: Proc, timeout_s: float = STARTUP_S) -> None:
    assert proc.port is not None
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", proc.port)
            writer.close()
            await writer.wait_closed()
            return
        except OSError:
            if not proc.alive:
                raise AssertionError(f"{proc.name} exited:\n{proc.output()[-3000:]}") from None
            if time.monotonic() > deadline:
                raise AssertionError(f"{proc.name} not listening after {timeout_s}s") from None
            await asyncio.sleep(0.05)


async def wait_map(kv: KV, layout: KeyLayout, predicate: Callable[[ShardMap], bool],
                   timeout_s: float = STARTUP_S) -> ShardMap:
    """Poll the map key until ``predicate`` holds (polling keeps this independent of the watch
    code under test)."""
    deadline = time.monotonic() + timeout_s
    last: ShardMap | None = None
    while time.monotonic() < deadline:
        got = await kv.get(layout.map_key)
        if got is not None:
            last = ShardMap.from_json(got.value)
            if predicate(last):
                return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"no matching shard map within {timeout_s}s; last: {last}")


