"""`metricsd up` as a real process: a query answers within 10 s of start; SIGINT stops it cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent / "metricsd"


def _query(addr: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN), "query", "--addr", addr, "--metric", "container_cpu_usage_seconds_total", *extra],
        capture_output=True, text=True, timeout=30,
    )


@pytest.mark.slow
def test_up_answers_a_query_within_10_seconds_and_stops_on_sigint(tmp_path: Path,
                                                                  free_ports: Callable[[], int]) -> None:
    port = free_ports()
    http_port = free_ports()
    addr = f"127.0.0.1:{port}"
    start = time.monotonic()
    proc = subprocess.Popen(
        [str(BIN), "up", "--grpc-port", str(port), "--http-port", str(http_port), "--data-dir", str(tmp_path / "d")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        answered = None
        while time.monotonic() - start < 10:
            r = _query(addr, "--selector", 'workload="feed-api"', "--fn", "rate", "--across", "avg", "--window", "1m")
            if r.returncode == 0 and "series" in r.stdout and r.stdout.splitlines()[2].split()[-1] != "-":
                answered = r
                break
            time.sleep(0.3)
        assert answered is not None, "no answer within 10 s of start"
        lines = answered.stdout.splitlines()
        value = float(lines[2].split()[-1])
        assert 0.0 < value < 64.0, answered.stdout  # cores per pod: positive and plausible
        by = _query(addr, "--fn", "rate", "--across", "sum", "--by", "workload", "--ratio-metric",
                    "kube_pod_container_resource_requests", "--ratio-selector", 'resource="cpu"')
        assert by.returncode == 0
        rows = by.stdout.splitlines()[2:-1]
        utilisation = {row.split()[0]: float(row.split()[-1]) for row in rows}
        assert len(utilisation) == 10, by.stdout  # the ten simulated workloads
        assert all(0.0 < u < 5.0 for u in utilisation.values()), by.stdout
        bad = _query(addr, "--selector", 'pod=~"("')
        assert bad.returncode == 2 and "regular expression" in bad.stderr
        http = f"http://127.0.0.1:{http_port}"
        q = urllib.parse.urlencode({"query": "avg by (workload) (rate(container_cpu_usage_seconds_total[1m]))"})
        with urllib.request.urlopen(f"{http}/api/v1/query?{q}", timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success" and body["data"]["resultType"] == "vector"
        assert len(body["data"]["result"]) == 10
        assert all(float(s["value"][1]) > 0 for s in body["data"]["result"])
        for kind in ("hpa", "vpa", "overcommit"):  # every consumer decided within a minute of start
            while True:
                with urllib.request.urlopen(f"{http}/api/v1/metricsd/{kind}", timeout=10) as r:
                    doc = json.load(r)
                if doc["history"] or time.monotonic() - start > 60:
                    break
                time.sleep(0.5)
            assert doc["history"], f"no {kind} decision within a minute"
        status = subprocess.run([str(BIN), "hpa", "status", "--url", http], capture_output=True, text=True, timeout=30)
        assert status.returncode == 0 and "default/feed-api" in status.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert "metricsd is up" in out and "shutting down" in out
