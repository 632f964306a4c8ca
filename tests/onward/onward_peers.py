"""Real receivers for the onward tests: VictoriaMetrics and Prometheus (Debian's packages, which
``make victoria-metrics-deps`` and ``make prometheus-deps`` install as root), started on loopback
ports with their own data directories, and the HTTP helpers the tests ask them with."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from processes import stop_process

from metricsd.ports import free_port

VICTORIA_METRICS = shutil.which("victoria-metrics")
PROMETHEUS = shutil.which("prometheus")




def get(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body = r.read()
    return json.loads(body) if body[:1] in (b"{", b"[") else body


def query(base: str, q: str, at_s: float | None = None) -> list[dict[str, Any]]:
    params = {"query": q} | ({"time": f"{at_s:.3f}"} if at_s is not None else {})
    doc = get(base + "/api/v1/query?" + urllib.parse.urlencode(params))
    assert doc["status"] == "success", doc
    return list(doc["data"]["result"])


def scalar(base: str, q: str, at_s: float | None = None) -> float:
    found = query(base, q, at_s)
    assert len(found) == 1, found
    return float(found[0]["value"][1])


def wait_for(what: str, check: Callable[[], Any], logs: list[Path] = (), timeout_s: float = 90) -> Any:  # type: ignore[assignment]
    deadline = time.monotonic() + timeout_s
    got = None
    while time.monotonic() < deadline:
        try:
            got = check()
        except (OSError, urllib.error.URLError, AssertionError, KeyError, ValueError):
            got = None
        if got:
            return got
        time.sleep(0.3)  # polling another process
    tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists())
    raise AssertionError(f"{what} did not happen in {timeout_s:g} s (last: {got!r})\n{tails}")


class Peer:
    def __init__(self, argv: list[str], url: str, ready: str, log: Path) -> None:
        self.argv, self.url, self.ready, self.log = argv, url, ready, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Peer:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT)
        wait_for(f"{self.argv[0]} ready", lambda: get(self.url + self.ready) is not None, [self.log])
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


def victoria_metrics(data: Path, port: int | None = None) -> Peer:
    port = port or free_port()
    argv = [str(VICTORIA_METRICS), f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}",
            "-search.latencyOffset=0s", "-search.disableCache", "-retentionPeriod=100y"]
    return Peer(argv, f"http://127.0.0.1:{port}", "/health", data.parent / f"{data.name}.log")


def prometheus_receiver(data: Path, port: int | None = None) -> Peer:
    port = port or free_port()
    data.mkdir(parents=True, exist_ok=True)
    (data / "prometheus.yml").write_text("global: {}\n")
    argv = [str(PROMETHEUS), f"--config.file={data / 'prometheus.yml'}", f"--storage.tsdb.path={data / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver"]
    return Peer(argv, f"http://127.0.0.1:{port}", "/-/ready", data.parent / f"{data.name}.log")


def vm_flush(vm: Peer) -> None:
    """Make what VictoriaMetrics took searchable now (it buffers for a second or two)."""
    get(vm.url + "/internal/force_flush")


@contextmanager
def running(*peers: Peer) -> Iterator[None]:
    try:
        for p in peers:
            p.start()
        yield
    finally:
        for p in peers:
            p.stop()


def metric_values(text: str, name: str) -> dict[str, float]:
    """``name{labels} value`` lines of a /metrics page, by their label text."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            out[key[len(name):]] = float(value)
    return out
