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


@pytest.mark.slow
@pytest.mark.parametrize("snapshot_every", [None, 0.2], ids=["default snapshots", "a snapshot every 0.2 s"])
def test_up_with_a_data_dir_keeps_acknowledged_samples_across_kill_9(tmp_path: Path, free_ports: Callable[[], int],
                                                                    snapshot_every: float | None) -> None:
    """With snapshots every 0.2 s (``--snapshot-every``), the kill finds one written and likely
    another under way: what was acknowledged is there either way."""
    import grpc

    from metricsd.model import make_labels, series_id
    from metricsd.proto import metricsd_pb2 as pb
    from metricsd.proto import metricsd_pb2_grpc as pb_grpc
    from metricsd.rpc.wire import labels_to_pb

    port = free_ports()
    cmd = [str(BIN), "up", "--no-simulate", "--no-consumers", "--grpc-port", str(port), "--http-port",
           str(free_ports()), "--data-dir", str(tmp_path / "data"), "--wal-fsync", "never"]
    if snapshot_every is not None:
        cmd += ["--snapshot-every", str(snapshot_every)]
    labels = make_labels("m", {"namespace": "n", "pod": "p"})
    sid = series_id(labels)

    def start() -> tuple[subprocess.Popen[str], pb_grpc.MetricsStub, grpc.Channel]:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=20)
        return proc, pb_grpc.MetricsStub(channel), channel

    proc, stub, channel = start()
    acked = 0
    for k in range(50):
        req = pb.WriteRequest(ids=[sid], counts=[10], timestamps=[k * 10_000 + i for i in range(10)],
                              values=[float(k * 10 + i) for i in range(10)])
        req.series.add(id=sid).labels.extend(labels_to_pb(labels))
        acked += stub.Write(req, timeout=10).samples_written
    channel.close()
    try:
        deadline = time.monotonic() + 20
        while snapshot_every is not None and not list((tmp_path / "data" / "snapshots").glob("*.snap")):
            assert time.monotonic() < deadline, "no snapshot written with --snapshot-every"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    proc, stub, channel = start()
    try:
        got = stub.Read(pb.ReadRequest(matchers=[pb.Matcher(name="pod", value="p")], start_ms=0, end_ms=10**9),
                        timeout=10)
        assert acked == 500
        assert list(got.series[0].values) == [float(v) for v in range(500)]
    finally:
        channel.close()
        proc.send_signal(signal.SIGINT)
        proc.wait(20)
