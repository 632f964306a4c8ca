"""Prometheus' own client, promtool (Debian's `prometheus` package, 2.42), against a real
`metricsd up`: its `query` commands read metricsd's Prometheus API as they read a Prometheus
server, and `check metrics` lints metricsd's /metrics exposition."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from processes import stop_process

from metricsd.cluster.etcd_server import free_port

PROMTOOL = shutil.which("promtool")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed: run `make prometheus-deps` "
                                                "(apt-get install prometheus, as root)"),
]


@pytest.fixture(scope="module")
def metricsd_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("promtool") / "metricsd.log"
    http, grpc = free_port(), free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "metricsd", "up", "--no-consumers", "--pods", "40",
                                 "--http-port", str(http), "--grpc-port", str(grpc)],
                                stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{http}"
    try:
        deadline = time.monotonic() + 60
        while True:  # until the simulator's backfilled hour is there, with a fresh sample
            try:
                q = "count(rate(container_cpu_usage_seconds_total[1m]))"
                with urllib.request.urlopen(url + "/api/v1/query?query=" + urllib.parse.quote(q), timeout=2) as r:
                    if json.loads(r.read())["data"]["result"]:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.3)
        yield url
    finally:
        stop_process(proc)


def promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], input=stdin, capture_output=True, timeout=60)


def _json(out: subprocess.CompletedProcess[bytes]) -> Any:
    assert out.returncode == 0, out.stderr.decode()
    return json.loads(out.stdout)


def test_promtool_instant_query(metricsd_url: str) -> None:
    q = "sum by (namespace) (rate(container_cpu_usage_seconds_total[1m]))"
    got = _json(promtool("query", "instant", "-o", "json", metricsd_url, q))
    assert got and all(set(s["metric"]) == {"namespace"} and float(s["value"][1]) > 0 for s in got), got


def test_promtool_range_query(metricsd_url: str) -> None:
    end = time.time()
    got = _json(promtool("query", "range", "-o", "json", "--start", f"{end - 1800:.3f}", "--end", f"{end:.3f}",
                         "--step", "60s", metricsd_url, "avg(container_memory_working_set_bytes)"))
    assert len(got) == 1 and len(got[0]["values"]) >= 25, got  # the simulator backfilled the last hour


def test_promtool_series_and_labels(metricsd_url: str) -> None:
    out = promtool("query", "series", "--match", 'kube_pod_container_resource_requests{resource="cpu"}', metricsd_url)
    assert out.returncode == 0, out.stderr.decode()
    lines = out.stdout.decode().splitlines()
    assert len(lines) == 40 and all('resource="cpu"' in line for line in lines), lines[:3]
    out = promtool("query", "labels", metricsd_url, "namespace")
    assert out.returncode == 0, out.stderr.decode()
    assert {"default"} <= set(out.stdout.decode().split()), out.stdout


def test_promtool_lints_metricsd_own_metrics(metricsd_url: str) -> None:
    with urllib.request.urlopen(metricsd_url + "/metrics", timeout=5) as r:
        body = r.read()
    assert b"metricsd_" in body
    out = promtool("check", "metrics", stdin=body)
    assert out.returncode == 0, (out.stdout + out.stderr).decode()
