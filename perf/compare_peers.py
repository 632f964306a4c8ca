"""The server processes of the side-by-side benchmark (perf/compare.py): metricsd, Prometheus and
VictoriaMetrics, each on 127.0.0.1 with a free port and a temporary data directory.

The peers come from Debian's packages (``prometheus`` 2.42, ``victoria-metrics`` 1.79);
:func:`ensure_installed` installs them with apt-get when missing and this runs as root, and
otherwise says what to run. :class:`Processes` stops every process it started, on exit, on an
exception and on Ctrl-C alike.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from metricsd.ports import free_port, free_range

__all__ = ["PACKAGES", "Processes", "Server", "armed", "check_loops", "ensure_installed", "free_port",
           "free_port_block", "package_version", "server_of", "uses_uvloop"]

PACKAGES = {"prometheus": "prometheus", "victoria-metrics": "victoria-metrics"}  # binary -> Debian package
METRICSD = Path(sys.executable).parent / "metricsd"

# The peers run as they would for this job: Prometheus receives remote write and keeps the data a
# day; VictoriaMetrics shows fresh samples at once (no 30 s latency offset) and never answers
# from its response cache, so every timed query does the work.
PROMETHEUS_CONFIG = "global:\n  scrape_interval: 10s\nscrape_configs: []\n"




def free_port_block(size: int = 200) -> int:
    """A base port with ``size`` free ports above it (``metricsd cluster up`` lays its ports out
    from one base)."""
    return free_range("127.0.0.1", size)


def ensure_installed() -> None:
    """Install the peers' Debian packages if a binary is missing (root only); raise SystemExit
    with the command to run otherwise."""
    missing = [pkg for binary, pkg in PACKAGES.items() if shutil.which(binary) is None]
    if not missing:
        return
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SystemExit(f"perf/compare.py needs {', '.join(missing)} (Debian packages). Install them with:\n"
                         f"  sudo apt-get update && sudo {' '.join(cmd)}")
    print(f"installing {', '.join(missing)} with apt-get ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(cmd, check=True, env=env)


def package_version(binary: str) -> str:
    """The Debian package version of a peer, or its own ``--version`` line."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", PACKAGES[binary]], capture_output=True,
                             text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else "unknown"


@dataclass
class Server:
    """A started server: its name, HTTP base URL, process and data directory."""

    name: str
    url: str
    proc: subprocess.Popen[bytes]
    data_dir: Path
    grpc_address: str = ""
    log_path: Path = field(default_factory=Path)
    tree: bool = False  # the server is this process and its children (a local cluster)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def pids(self) -> dict[str, list[int]]:
        """The server's processes by role: ``server`` for a single process; for a tree, its
        children by the metricsd command they run (``store``, ``proxy``, ...) and ``control`` for
        the rest (the parent, etcd, config servers)."""
        if not self.tree:
            return {"server": [self.pid]}
        out: dict[str, list[int]] = {"control": [self.pid]}
        for child in _children(self.pid):
            try:
                argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            words = [a.decode(errors="replace") for a in argv]
            role = next((w for w in words if w in ("store", "proxy")), "control")
            out.setdefault(role, []).append(child)
        return out

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.data_dir.rglob("*") if p.is_file())


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out.append(int(d.name))
    return out


def uses_uvloop(pid: int) -> bool:
    """Whether the process has uvloop's extension mapped: metricsd imports it only to run on it
    (metricsd/cmd/eventloop.py), so this tells which loop a started server really runs."""
    try:
        return "uvloop" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def armed(name: str, loop: str, loops: list[str]) -> str:
    """A metricsd system's name on ``loop``: the run's first loop keeps the report's names, the
    others' are suffixed (``metricsd-cluster@uvloop``)."""
    return name if loop == loops[0] else f"{name}@{loop}"


def server_of(system: str) -> str:
    """The server a system asks (a metricsd PromQL endpoint is its server's HTTP port)."""
    return system.replace("-promql", "")


def check_loops(servers: dict[str, Server], loops: list[str]) -> None:
    """Raises unless every metricsd process runs the loop its arm names (an A/B of nothing else)."""
    for name, server in servers.items():
        if not name.startswith("metricsd"):
            continue
        want = name.partition("@")[2] or loops[0]
        for role, pids in server.pids().items():
            for pid in pids if role != "control" or not server.tree else []:
                if uses_uvloop(pid) != (want == "uvloop"):
                    raise RuntimeError(f"{name}: {role} process {pid} does not run on {want}")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


class Processes:
    """Starts servers and stops them all: use as a context manager. SIGTERM is turned into
    SystemExit while inside, so a killed benchmark still stops its servers."""

    def __init__(self) -> None:
        self.servers: list[Server] = []
        self._tmp = Path(tempfile.mkdtemp(prefix="metricsd-compare-"))
        self._old_term: object = None

    def __enter__(self) -> Processes:
        self._old_term = signal.signal(signal.SIGTERM, self._on_term)
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self.print_logs()
        self.stop_all()
        signal.signal(signal.SIGTERM, self._old_term)  # type: ignore[arg-type]
        shutil.rmtree(self._tmp, ignore_errors=True)

    @staticmethod
    def _on_term(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    def _start(self, name: str, argv: list[str], url: str, ready_path: str, data_dir: Path,
               grpc_address: str = "", tree: bool = False, env: dict[str, str] | None = None) -> Server:
        """Starts ``argv`` with ``env`` added to this process' environment (a cluster's children
        inherit it) and waits until ``url + ready_path`` answers 200."""
        log_path = self._tmp / f"{name}.log"
        with open(log_path, "wb") as log:
            # A new session: Ctrl-C reaches this script only, which then stops the servers in order.
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, **(env or {})})
        server = Server(name, url, proc, data_dir, grpc_address, log_path, tree)
        self.servers.append(server)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
            if _http_ok(url + ready_path):
                return server
            time.sleep(0.1)
        raise RuntimeError(f"{name} did not become ready in 60 s: {log_path.read_text()[-2000:]}")

    def start_prometheus(self) -> Server:
        d = self._tmp / "prometheus"
        d.mkdir()
        (d / "prometheus.yml").write_text(PROMETHEUS_CONFIG)
        port = free_port()
        argv = ["prometheus", f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver",
                "--storage.tsdb.retention.time=1d", "--log.level=warn"]
        return self._start("prometheus", argv, f"http://127.0.0.1:{port}", "/-/ready", d / "data")

    def start_victoria_metrics(self) -> Server:
        d = self._tmp / "victoria-metrics"
        d.mkdir()
        port = free_port()
        argv = ["victoria-metrics", f"-storageDataPath={d}", f"-httpListenAddr=127.0.0.1:{port}",
                "-search.latencyOffset=0s", "-search.disableCache", "-retentionPeriod=2d", "-loggerLevel=WARN"]
        return self._start("victoria-metrics", argv, f"http://127.0.0.1:{port}", "/health", d)

    def start_metricsd(self, name: str = "metricsd", data_dir: bool = False,
                       snapshot_every_s: float | None = None, env: dict[str, str] | None = None) -> Server:
        """``metricsd up``; with ``data_dir`` it keeps a WAL and snapshots in the server's directory
        (every ``snapshot_every_s``, default the store's 10 minutes); ``env`` is added to its
        environment (``METRICSD_EVENT_LOOP``)."""
        d = self._tmp / name
        d.mkdir()
        grpc_port, http_port = free_port(), free_port()
        argv = [str(METRICSD), "--log-level", "WARNING", "up", "--no-simulate", "--no-consumers",
                "--grpc-port", str(grpc_port), "--http-port", str(http_port),
                # the series limits are sized for a live cluster; a side-by-side backfill creates
                # 200,000 series (--scale 5) in under a minute on a quiet machine
                "--max-series", "0", "--max-new-series-per-minute", "0"]
        if data_dir:
            argv += ["--data-dir", str(d / "data")]
        if snapshot_every_s is not None:
            argv += ["--snapshot-every", str(snapshot_every_s)]
        return self._start(name, argv, f"http://127.0.0.1:{http_port}", "/api/v1/status/buildinfo",
                           d / "data" if data_dir else d, grpc_address=f"127.0.0.1:{grpc_port}", env=env)

    def start_metricsd_cluster(self, name: str = "metricsd-cluster", stores: int = 3, rf: int = 3, w: int = 2,
                               r: int = 2, env: dict[str, str] | None = None) -> Server:
        """``metricsd cluster up`` without the simulated agent and without TLS (loopback only, as
        every other server here): etcd, one config server, ``stores`` stores and one proxy. The
        Server's URL and gRPC address are the proxy's. ``BENCH_CLUSTER_ARGS`` (environment) adds
        flags of ``cluster up``, e.g. ``--write-linger 20``, to every benchmark's cluster."""
        d = self._tmp / name
        d.mkdir()
        base = free_port_block()
        argv = [str(METRICSD), "--log-level", "WARNING", "cluster", "up", "--stores", str(stores), "--proxies", "1",
                "--config-servers", "1", "--rf", str(rf), "--w", str(w), "--r", str(r), "--no-simulate",
                "--plaintext", "--base-port", str(base), "--data-dir", str(d),
                *shlex.split(os.environ.get("BENCH_CLUSTER_ARGS", ""))]
        return self._start(name, argv, f"http://127.0.0.1:{base}", "/api/v1/status/buildinfo", d,
                           grpc_address=f"127.0.0.1:{base + 1}", tree=True, env=env)

    def print_logs(self, lines: int = 25) -> None:
        """The end of every server's log (a cluster's: each of its processes'), to see why a run failed."""
        for s in self.servers:
            logs = [s.log_path, *sorted((s.data_dir / "logs").glob("*.log"))] if s.tree else [s.log_path]
            for log in logs:
                if log.is_file():
                    tail = log.read_text(errors="replace").splitlines()[-lines:]
                    print(f"--- {s.name}: {log.name} (last {len(tail)} lines)", file=sys.stderr)
                    print("\n".join(tail), file=sys.stderr)

    def stop_all(self) -> None:
        """SIGTERM each server, then SIGKILL what is still running after 20 s."""
        for s in self.servers:
            if s.proc.poll() is None:
                s.proc.send_signal(signal.SIGTERM)
        for s in self.servers:
            try:
                s.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                s.proc.kill()
                s.proc.wait(timeout=10)
        self.servers.clear()
