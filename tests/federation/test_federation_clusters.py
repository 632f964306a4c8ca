"""``metricsd federate`` over two real local clusters (``metricsd cluster up``, each with its own
etcd, store, config server and proxy), then one cluster's proxy stopped and killed with SIGKILL while
a query waits on it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from processes import stop_process

from metricsd.cluster.etcd_server import free_port
from metricsd.model import make_labels, series_id
from metricsd.ports import free_range
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import Unavailable
from metricsd.rpc.client import GrpcBackend, MetricsClient
from metricsd.rpc.wire import labels_to_pb, matchers_to_pb
from metricsd.selector import parse_selector

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONUNBUFFERED="1")
STEP_MS = 10_000


def _free_bases(n: int) -> list[int]:
    """Base ports of ``n`` local clusters, 200 ports each, apart and outside the ephemeral range."""
    out: list[int] = []
    for _ in range(200):
        base = free_range("127.0.0.1", 200)
        if all(abs(base - b) >= 200 for b in out):
            out.append(base)
            if len(out) == n:
                return out
    raise AssertionError("no free port ranges")


def _start_cluster(base: int, data: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "metricsd", "cluster", "up", "--base-port", str(base), "--stores", "1",
         "--config-servers", "1", "--proxies", "1", "--rf", "1", "--w", "1", "--r", "1", "--slots", "8",
         "--no-simulate", "--plaintext", "--data-dir", str(data)],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_banner(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "Ctrl-C stops everything" in line:
            return
    raise AssertionError("cluster up ended before serving:\n" + "".join(seen))


def _pid_listening_as_proxy(grpc_port: int) -> int:
    """The pid of the ``metricsd proxy`` child that ``cluster up`` started on ``grpc_port``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"proxy" in argv and b"--grpc-port" in argv and argv[argv.index(b"--grpc-port") + 1] == str(
                grpc_port).encode():
            return int(entry.name)
    raise AssertionError(f"no proxy process on port {grpc_port}")


def _batch(pods: int, rate0: float, end_ms: int) -> tuple[pb.WriteRequest, list[float]]:
    req = pb.WriteRequest()
    rates = []
    times = range(end_ms - 30 * STEP_MS, end_ms + 1, STEP_MS)
    for i in range(pods):
        labels = make_labels("fed_cpu_seconds_total", {"namespace": "shop", "pod": f"web-{i}", "workload": "web"})
        rate = rate0 + 0.01 * i
        rates.append(rate)
        sid = series_id(labels)
        req.ids.append(sid)
        req.counts.append(len(times))
        req.timestamps.extend(times)
        req.values.extend(rate * (t - times[0]) / 1000 for t in times)
        req.series.add(id=sid).labels.extend(labels_to_pb(labels))
    return req, rates


async def _write_when_ready(address: str, req: pb.WriteRequest, timeout_s: float = 40.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with MetricsClient(address, timeout_s=5.0) as c:
        while True:
            try:
                resp = await c.write(req)
                assert resp.samples_written == len(req.timestamps), resp
                return
            except Exception:  # the shard map may not be there yet
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.3)


def _get(url: str, params: dict[str, str]) -> tuple[int, dict[str, object]]:
    full = f"{url}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(full, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


@pytest.fixture
def clusters(tmp_path: Path) -> Iterator[list[int]]:
    bases = _free_bases(2)
    procs = [_start_cluster(b, tmp_path / f"c{i}") for i, b in enumerate(bases)]
    try:
        for p in procs:
            _wait_banner(p)
        yield bases
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.communicate(timeout=40)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()


@pytest.mark.slow
async def test_federate_over_two_clusters_then_one_killed(clusters: list[int], tmp_path: Path) -> None:
    east, west = clusters
    end_ms = (int(time.time() * 1000) // STEP_MS) * STEP_MS
    east_req, east_rates = _batch(3, 0.1, end_ms)
    west_req, west_rates = _batch(4, 0.5, end_ms)
    await asyncio.gather(_write_when_ready(f"127.0.0.1:{east + 1}", east_req),
                         _write_when_ready(f"127.0.0.1:{west + 1}", west_req))

    grpc_port, http_port = free_port(), free_port()
    log = open(tmp_path / "federate.log", "wb")  # noqa: SIM115 - closed below
    fed = subprocess.Popen([sys.executable, "-m", "metricsd", "federate", "--cluster", f"east=127.0.0.1:{east + 1}",
                            "--cluster", f"west=127.0.0.1:{west + 1}", "--grpc-port", str(grpc_port),
                            "--http-port", str(http_port), "--cluster-timeout", "2", "--cluster-retries", "1"],
                           cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", http_port), timeout=1):
                    break
            except OSError:
                assert fed.poll() is None, (tmp_path / "federate.log").read_text()
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
        url = f"http://127.0.0.1:{http_port}/api/v1"
        t = str(end_ms / 1000)

        # every series carries its cluster
        code, body = await asyncio.to_thread(_get, f"{url}/series", {"match[]": "fed_cpu_seconds_total"})
        assert code == 200, body
        got = sorted((s["cluster"], s["pod"]) for s in body["data"])  # type: ignore[attr-defined]
        assert got == [("east", f"web-{i}") for i in range(3)] + [("west", f"web-{i}") for i in range(4)]

        # a cluster selector routes: only west's series
        q = 'count(fed_cpu_seconds_total{cluster="west"})'
        code, body = await asyncio.to_thread(_get, f"{url}/query", {"query": q, "time": t})
        assert code == 200 and body["data"]["result"][0]["value"][1] == "4", body  # type: ignore[index]

        # one aggregate across both equals the one computed from the raw data
        q = "sum(rate(fed_cpu_seconds_total[1m]))"
        code, body = await asyncio.to_thread(_get, f"{url}/query", {"query": q, "time": t})
        assert code == 200 and "warnings" not in body, body
        assert float(body["data"]["result"][0]["value"][1]) == pytest.approx(  # type: ignore[index]
            sum(east_rates) + sum(west_rates), rel=1e-9)
        q = "avg by (cluster) (rate(fed_cpu_seconds_total[1m]))"
        code, body = await asyncio.to_thread(_get, f"{url}/query", {"query": q, "time": t})
        per = {r["metric"]["cluster"]: float(r["value"][1]) for r in body["data"]["result"]}  # type: ignore[index]
        assert per == pytest.approx({"east": sum(east_rates) / 3, "west": sum(west_rates) / 4}, rel=1e-9)

        # west's proxy hangs (SIGSTOP) while a query waits on it, then is killed mid-query: the
        # answer is east's alone, and says so
        west_pid = _pid_listening_as_proxy(west + 1)
        os.kill(west_pid, signal.SIGSTOP)
        q = "sum(rate(fed_cpu_seconds_total[1m]))"
        pending = asyncio.ensure_future(asyncio.to_thread(_get, f"{url}/query", {"query": q, "time": t}))
        await asyncio.sleep(0.5)
        assert not pending.done()  # waiting on west
        os.kill(west_pid, signal.SIGKILL)
        code, body = await pending
        assert code == 200, body
        assert float(body["data"]["result"][0]["value"][1]) == pytest.approx(sum(east_rates), rel=1e-9)  # type: ignore[index]
        warnings = body["warnings"]
        assert len(warnings) == 1 and warnings[0].startswith("cluster west did not answer within 2 s"), warnings  # type: ignore[index, arg-type]

        code, body = await asyncio.to_thread(_get, f"{url}/metricsd/aggregate", {
            "metric": "fed_cpu_seconds_total", "across": "sum", "time": t})
        assert code == 200 and [m["cluster"] for m in body["missingClusters"]] == ["west"], body  # type: ignore[attr-defined]

        async with MetricsClient(f"127.0.0.1:{grpc_port}") as c:
            req = pb.AggregateRequest(across=pb.ACROSS_SUM, start_ms=end_ms, end_ms=end_ms)
            req.query.matchers.extend(matchers_to_pb(parse_selector("", "fed_cpu_seconds_total")))
            req.query.series_fn = pb.SERIES_RATE
            req.query.window_ms = 60_000
            agg = await c.aggregate(req)
            assert [m.cluster for m in agg.missing_clusters] == ["west"]
            assert agg.values[0] == pytest.approx(sum(east_rates), rel=1e-9)
            # only the dead cluster asked: an error, not an empty success
            del req.query.matchers[:]
            req.query.matchers.extend(matchers_to_pb(parse_selector('cluster="west"', "fed_cpu_seconds_total")))
            with pytest.raises(Unavailable, match=r"UNAVAILABLE.*cluster west did not answer"):
                await GrpcBackend(c.stub, timeout_s=10).aggregate(req)

        code, body = await asyncio.to_thread(_get, f"{url}/query", {
            "query": 'sum(rate(fed_cpu_seconds_total{cluster="west"}[1m]))', "time": t})
        assert code == 503 and "cluster west" in body["error"], body  # type: ignore[operator]

        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=30) as r:
            metrics = r.read().decode()
        assert 'metricsd_federation_cluster_up{cluster="west"} 0.0' in metrics
        assert 'metricsd_federation_cluster_up{cluster="east"} 1.0' in metrics
        assert 'metricsd_federation_failures_total{cluster="west",method="Aggregate"}' in metrics
    finally:
        stop_process(fed, 20)
        log.close()
    assert fed.returncode == 0, (tmp_path / "federate.log").read_text()
