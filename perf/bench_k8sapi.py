"""Benchmark of ``metricsd k8s-api``, the Kubernetes metrics APIs (a documented command, not a test).

    .venv/bin/python perf/bench_k8sapi.py            # 10,000 pods (5,000 in one Deployment), 100 requests each
    .venv/bin/python perf/bench_k8sapi.py --quick    # 1,000 pods, 10 requests each

Three processes on loopback, as a cluster runs them: ``metricsd store`` (the data), ``metricsd k8s-api``
(HTTPS, trusting the front proxy's client certificate as the API server's aggregator calls it) and
this client, which plays the aggregator. The store holds ten minutes of simulated pod metrics at
10 s (``Simulator``: 10,000 pods over 200 nodes, 5,000 of them in Deployment ``big`` in namespace
``default``), written up to now and then one tick every 10 s as agents push, because the API
answers for the present (the store's CPU per request includes that ingest).

Measures, at concurrency 1 and 4, p50 / p99 and the k8s-api's and store's CPU per request of:
1. ``kubectl top pods -A``: ``GET /apis/metrics.k8s.io/v1beta1/pods`` (every pod, every container);
2. the stock HPA's Resource metric for the 5,000-pod Deployment:
   ``GET /apis/metrics.k8s.io/v1beta1/namespaces/default/pods?labelSelector=workload=big``
   (the HPA sends the Deployment's pod selector; metricsd matches ``--label-selector-keys`` against
   series labels, here ``workload``);
3. ``kubectl top nodes``: ``GET /apis/metrics.k8s.io/v1beta1/nodes``.
Each answer is checked for its item count (every pod, every pod of ``big``, every node) before it
is timed. Prints a Markdown table and writes perf/results/bench_k8sapi.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procstat import cpu_seconds, rss_bytes

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.cluster.etcd_server import free_port
from metricsd.rpc.client import MetricsClient
from metricsd.security.certs import create_local_pki

HERE = Path(__file__).resolve().parent
FRONT_HEADERS = {"X-Remote-User": "system:serviceaccount:kube-system:horizontal-pod-autoscaler",
                 "X-Remote-Group": "system:serviceaccounts"}


def _start(argv: list[str], log: Path, banner: str) -> subprocess.Popen[str]:
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "metricsd", *argv], stdout=subprocess.PIPE, stderr=err,
                                text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if banner not in line:
        proc.kill()
        raise RuntimeError(f"{argv[0]} did not start: {line!r}\n{log.read_text()}")
    return proc


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for p in reversed(procs):
        p.terminate()
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


async def _feed(addr: str, sim: Simulator, ticks: int) -> int:
    sent, first = 0, True
    async with MetricsClient(addr, timeout_s=120) as client:
        while ticks > 0:
            n = min(60, ticks)
            ts, values = sim.block(n)
            for req in write_requests(sim, ts, values, max_samples=1000 * n, send_labels_for=None if first else set()):
                resp = await client.write(req)
                if resp.unknown_ids or resp.rejected_too_old or resp.rejected_duplicate:
                    raise RuntimeError(f"unexpected write response {resp}")
            first = False
            sent += values.size
            ticks -= n
    return sent


async def _keep_feeding(addr: str, sim: Simulator) -> None:
    """One tick every 10 s in real time, as node agents push, so the API always has a fresh window."""
    async with MetricsClient(addr, timeout_s=60) as client:
        while True:
            await asyncio.sleep(max(0.0, sim.next_timestamp_ms / 1000 - time.time()))
            ts, values = sim.block(1)
            for req in write_requests(sim, ts, values, max_samples=1000, send_labels_for=set()):
                await client.write(req)


async def _measure(session: aiohttp.ClientSession, url: str, ctx: ssl.SSLContext, want_items: int, n: int,
                   concurrency: int, pids: dict[str, int]) -> dict[str, float]:
    async def get() -> tuple[float, int]:
        t0 = time.perf_counter()
        async with session.get(url, ssl=ctx, headers=FRONT_HEADERS) as r:
            body = await r.read()
            if r.status != 200:
                raise RuntimeError(f"{url}: {r.status} {body[:300]!r}")
        elapsed = time.perf_counter() - t0
        items = len(json.loads(body)["items"])
        if items != want_items:
            raise RuntimeError(f"{url}: {items} items, want {want_items}")
        return elapsed, len(body)

    for _ in range(3):
        await get()
    cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
    sem = asyncio.Semaphore(concurrency)
    times: list[float] = []
    size = 0

    async def one() -> None:
        nonlocal size
        async with sem:
            t, size = await get()
            times.append(t)

    await asyncio.gather(*(one() for _ in range(n)))
    a = np.array(times) * 1000
    out = {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)), "n": float(n),
           "items": float(want_items), "body_bytes": float(size)}
    for k, p in pids.items():
        out[f"{k}_cpu_ms_per_request"] = (cpu_seconds(p) - cpu0[k]) / n * 1000
    return out


async def main_async(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"command": " ".join([".venv/bin/python", "perf/bench_k8sapi.py", *sys.argv[1:]]),
                           "cores": os.cpu_count(), "python": platform.python_version()}
    server = create_local_pki(tmp / "server", days=1)
    front = create_local_pki(tmp / "front", days=1)  # its component certificate plays the front proxy's
    grpc_port, https_port = free_port(), free_port()
    procs = [_start(["store", "--grpc-port", str(grpc_port)], tmp / "store.log", "serving gRPC")]
    try:
        interval = 10_000
        now = int(time.time() * 1000) // interval * interval
        sim = Simulator(SimConfig(pods=args.pods, workloads=20, nodes=max(5, args.pods // 50), seed=3,
                                  big_workload_pods=args.pods // 2), now - args.ticks * interval)
        out["series"] = len(sim.series)
        out["samples"] = await _feed(f"127.0.0.1:{grpc_port}", sim, args.ticks)
        procs.append(_start(["k8s-api", "--addr", f"127.0.0.1:{grpc_port}", "--port", str(https_port),
                             "--tls-cert", str(server.cert), "--tls-key", str(server.key),
                             "--requestheader-client-ca-file", str(front.ca),
                             "--label-selector-keys", "workload"], tmp / "k8sapi.log", "serving metrics.k8s.io"))
        pids = {"k8s_api": procs[1].pid, "store": procs[0].pid}
        feeder = asyncio.ensure_future(_keep_feeding(f"127.0.0.1:{grpc_port}", sim))
        ctx = ssl.create_default_context(cafile=str(server.ca))
        ctx.load_cert_chain(str(front.cert), str(front.key))
        base = f"https://127.0.0.1:{https_port}/apis/metrics.k8s.io/v1beta1"
        pods = sim.pods()
        big = sum(1 for p in pods if p.workload == "big")
        nodes = len({p.node for p in pods})
        cases = {"top_pods_all": (f"{base}/pods", len(pods)),
                 "hpa_big_deployment": (f"{base}/namespaces/default/pods?labelSelector=workload%3Dbig", big),
                 "top_nodes": (f"{base}/nodes", nodes)}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            out["cases"] = {name: {f"c{c}": await _measure(session, url, ctx, want, args.requests, c, pids)
                                   for c in (1, 4)}
                            for name, (url, want) in cases.items()}
        out["rss_mib"] = {k: rss_bytes(p) / 2**20 for k, p in pids.items()}
        feeder.cancel()
        await asyncio.gather(feeder, return_exceptions=True)
    finally:
        _stop(procs)
    return out


LABELS = {"top_pods_all": "`kubectl top pods -A` ({items:,} pods)",
          "hpa_big_deployment": "the stock HPA's per-pod CPU/memory of one Deployment ({items:,} pods)",
          "top_nodes": "`kubectl top nodes` ({items:,} nodes)"}


def markdown(r: dict[str, Any]) -> str:
    rows = ["| request (metricsd k8s-api over one store, HTTPS, front-proxy client certificate) | c1 p50 / p99 | "
            "c4 p50 / p99 | body | CPU per request: k8s-api / store |", "| --- | --- | --- | --- | --- |"]
    for name, by_c in r["cases"].items():
        c1, c4 = by_c["c1"], by_c["c4"]
        rows.append(f"| {LABELS[name].format(items=int(c1['items']))} | {c1['p50_ms']:.1f} / {c1['p99_ms']:.1f} ms | "
                    f"{c4['p50_ms']:.1f} / {c4['p99_ms']:.1f} ms | {c1['body_bytes'] / 1024:,.0f} KiB | "
                    f"{c1['k8s_api_cpu_ms_per_request']:.1f} / {c1['store_cpu_ms_per_request']:.1f} ms |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1,000 pods, 10 requests")
    p.add_argument("--pods", type=int, default=10_000, help="simulated pods; half of them in Deployment big")
    p.add_argument("--ticks", type=int, default=60, help="ticks of 10 s written, ending now")
    p.add_argument("--requests", type=int, default=100, help="timed requests per case and concurrency")
    args = p.parse_args()
    if args.quick:
        args.pods, args.requests = 1000, 10
    with tempfile.TemporaryDirectory(prefix="bench-k8sapi-") as d:
        r = asyncio.run(main_async(args, Path(d)))
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "bench_k8sapi.json").write_text(json.dumps(r, indent=2))
    print(f"command: {r['command']}  (cores: {r['cores']}, Python {r['python']}; {r['series']:,} series, "
          f"{r['samples']:,} samples)")
    print(markdown(r))


if __name__ == "__main__":
    main()
