"""A real Prometheus (Debian's ``prometheus`` package, 2.42, remote write 1.0) scrapes itself and
remote-writes into a real ``metricsd up --no-simulate`` on 127.0.0.1: its own series, which carry
no namespace or pod, become queryable from metricsd, under the cluster-level key by default and
as a relabel file says with one. ``make prometheus-deps`` installs the package (as root);
without the binary the test is skipped, saying so."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from processes import stop_process

from metricsd.cluster.etcd_server import free_port

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus binary is not installed: run `make prometheus-deps` "
                                                  "(apt-get install prometheus, as root)"),
]



def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


@contextmanager
def _process(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        stop_process(proc)


def _wait_for(what: str, check: Any, logs: list[Path], timeout_s: float = 90) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            got = check()
        except OSError:
            got = None
        if got:
            return got
        time.sleep(0.5)
    tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs)
    raise AssertionError(f"{what} did not happen in {timeout_s:g} s\n{tails}")


def _query(url: str, q: str) -> list[dict[str, Any]]:
    doc = _get(url + "/api/v1/query?" + urllib.parse.urlencode({"query": q}))
    assert doc["status"] == "success", doc
    return list(doc["data"]["result"])


Result = list[dict[str, Any]]


def _run(tmp: Path, relabel: str | None) -> tuple[Result, Result, Result, str]:
    http, grpc, prom = free_port(), free_port(), free_port()
    argv = [sys.executable, "-m", "metricsd", "up", "--no-simulate", "--no-consumers", "--host", "127.0.0.1",
            "--http-port", str(http), "--grpc-port", str(grpc)]
    if relabel is not None:
        (tmp / "relabel.yaml").write_text(relabel)
        argv += ["--remote-write-relabel", str(tmp / "relabel.yaml")]
    metricsd_url = f"http://127.0.0.1:{http}"
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n"
        f"scrape_configs:\n  - job_name: prometheus\n    static_configs:\n      - targets: ['127.0.0.1:{prom}']\n"
        f"remote_write:\n  - url: {metricsd_url}/api/v1/write\n"
        "    queue_config: {batch_send_deadline: 1s, min_backoff: 100ms, max_backoff: 1s}\n")
    logs = [tmp / "metricsd.log", tmp / "prometheus.log"]
    with _process(argv, logs[0]):
        _wait_for("metricsd answering", lambda: _get(metricsd_url + "/api/v1/status/buildinfo"), logs[:1])
        prom_argv = [str(PROMETHEUS), f"--config.file={tmp / 'prometheus.yml'}",
                     f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{prom}"]
        with _process(prom_argv, logs[1]):
            up = _wait_for("up from Prometheus in metricsd", lambda: _query(metricsd_url, "up"), logs)
            info = _wait_for("prometheus_build_info in metricsd",
                             lambda: _query(metricsd_url, "prometheus_build_info"), logs)
            goroutines = _query(metricsd_url, "go_goroutines")  # written in the same batches as up
            # Nothing was refused along the way: Prometheus logs a 400 as a dropped batch.
            with urllib.request.urlopen(metricsd_url + "/metrics", timeout=5) as r:
                metrics = r.read().decode()
            assert "metricsd_remote_write_refused_series_total{" not in metrics
    return up, info, goroutines, metrics


def test_prometheus_own_series_are_stored_under_the_cluster_level_key(tmp_path: Path) -> None:
    up, info, goroutines, _ = _run(tmp_path, None)
    assert up[0]["metric"] == {"__name__": "up", "instance": up[0]["metric"]["instance"], "job": "prometheus",
                               "namespace": "_cluster", "pod": up[0]["metric"]["instance"]}
    assert up[0]["value"][1] == "1"
    assert info[0]["metric"]["namespace"] == "_cluster" and info[0]["metric"]["version"].startswith("2.")
    assert goroutines and goroutines[0]["metric"]["pod"] == up[0]["metric"]["instance"]


def test_prometheus_own_series_relabelled_by_the_operators_rules(tmp_path: Path) -> None:
    rules = """
- source_labels: [job]
  target_label: namespace
  replacement: monitoring-$1
- source_labels: [instance]
  regex: '([^:]+):(\\d+)'
  target_label: pod
  replacement: prom-${2}
- source_labels: [__name__]
  regex: 'go_.*'
  action: drop
"""
    up, info, goroutines, metrics = _run(tmp_path, rules)
    m = up[0]["metric"]
    assert m["namespace"] == "monitoring-prometheus"
    assert m["pod"] == "prom-" + m["instance"].rsplit(":", 1)[1]
    assert info[0]["metric"]["namespace"] == "monitoring-prometheus"
    assert goroutines == []
    assert 'metricsd_remote_write_relabel_dropped_samples_total{rule="3"}' in metrics
