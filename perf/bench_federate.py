"""Benchmark of ``metricsd federate`` over 3 clusters (a documented command, not a test).

    .venv/bin/python perf/bench_federate.py            # 3 clusters x 5,000 pods, 200 queries
    .venv/bin/python perf/bench_federate.py --quick    # 3 x 200 pods, 20 queries (proves it runs)

Processes on loopback: per cluster one store (an in-memory Store served over gRPC) and one proxy
(ProxyBackend on a static 64-slot RF 1 shard map, W 1 / R 1); one ``metricsd federate`` over the
three proxies (the real command, gRPC only); and this client. Each cluster gets its own simulated
Deployment ``big`` of ``--pods`` pods (seeded differently), backfilled ``--ticks`` ticks of 10 s.

Measures the HPA's question, the average CPU rate of Deployment ``big`` over 1 minute, p50 / p99
at concurrency 1 and 8: asked of one cluster's proxy (that cluster's pods), and asked of the
federating proxy (all three clusters' pods: one aggregate pushed down per cluster, partials
merged). Prints a Markdown table and writes perf/results/bench_federate.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_proxy import Proc, _agg_request, _free_port, _serve_store, _until_signal, ingest
from bench_store import latency

from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.rpc.client import MetricsClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SLOTS = 64
CLUSTERS = ("eu", "us", "ap")


async def _serve_proxy(port: int, store: str) -> None:
    from metricsd.clock import SystemClock
    from metricsd.cluster.assign import assign
    from metricsd.cluster.mapsource import StaticMapSource
    from metricsd.cluster.shardmap import Member
    from metricsd.proxy.backend import ProxyBackend
    from metricsd.proxy.settings import ProxySettings
    from metricsd.rpc.server import start_grpc_server
    from metricsd.rpc.servicer import MetricsServicer

    shard_map = assign([Member("store-0", store)], None, SLOTS, 1)
    proxy = ProxyBackend(StaticMapSource(shard_map), ProxySettings(w=1, r=1, call_timeout_s=30), SystemClock())
    server, _ = await start_grpc_server(MetricsServicer(proxy), "127.0.0.1", port)
    await _until_signal()
    await server.stop(None)
    await proxy.close()


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    out: dict[str, object] = {"command": " ".join([".venv/bin/python", "perf/bench_federate.py", *sys.argv[1:]]),
                              "cores": os.cpu_count(), "python": platform.python_version(), "pods": args.pods,
                              "clusters": len(CLUSTERS)}
    me = [sys.executable, __file__]
    procs: list[Proc] = []
    try:
        stores = [Proc([*me, "--serve-store"]) for _ in CLUSTERS]
        procs += stores
        for s in stores:
            await s.wait_ready()
        proxies = [Proc([*me, "--serve-proxy", "--store", s.addr]) for s in stores]
        procs += proxies
        for p in proxies:
            await p.wait_ready()
        port = _free_port()
        fed = Proc([sys.executable, "-m", "metricsd", "federate", "--grpc-port", str(port), "--http-port", "-1",
                    "--cluster-timeout", "30",
                    *(a for name, p in zip(CLUSTERS, proxies, strict=True) for a in ("--cluster", f"{name}={p.addr}"))],
                   port, cwd=ROOT)
        procs.append(fed)
        await fed.wait_ready()
        at = 0
        for i, p in enumerate(proxies):
            sim = Simulator(SimConfig(pods=args.pods, workloads=1, nodes=max(1, args.pods // 50), seed=10 + i,
                                      big_workload_pods=args.pods), 1_700_000_000_000)
            async with MetricsClient(p.addr, timeout_s=120) as client:
                await ingest(client, {"proxy": [p.proc.pid]}, sim, args.ticks, 60, first=True)
            at = sim.next_timestamp_ms - 1
        req = _agg_request(at)
        results: dict[str, object] = {}
        async with MetricsClient(proxies[0].addr, timeout_s=120) as one:
            results["one_cluster"] = {f"c{c}": await latency(one, req, args.queries, c, min_series=args.pods,
                                                             warmup=5, exact=True) for c in (1, 8)}
        async with MetricsClient(fed.addr, timeout_s=120) as client:
            results["federated"] = {f"c{c}": await latency(client, req, args.queries, c,
                                                           min_series=args.pods * len(CLUSTERS), warmup=5,
                                                           exact=True) for c in (1, 8)}
            resp = await client.aggregate(req)
            if resp.missing_clusters:
                raise RuntimeError(f"clusters missing from the federated answer: {list(resp.missing_clusters)}")
        out["hpa_question"] = results
    finally:
        for p in reversed(procs):
            p.stop()
    return out


def markdown(r: dict) -> str:
    h = r["hpa_question"]
    rows = [f"| avg CPU rate of Deployment `big` (1 m window) | {r['pods']:,} pods, one cluster's proxy | "
            f"{r['clusters']} x {r['pods']:,} pods, `metricsd federate` |", "| --- | --- | --- |"]
    for c in ("c1", "c8"):
        one, fed = h["one_cluster"][c], h["federated"][c]
        rows.append(f"| concurrency {c[1:]}: p50 / p99 | {one['p50_ms']:.1f} / {one['p99_ms']:.1f} ms | "
                    f"{fed['p50_ms']:.1f} / {fed['p99_ms']:.1f} ms |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="200 pods per cluster, 20 queries, 12 ticks")
    p.add_argument("--pods", type=int, default=5000, help="pods of each cluster's Deployment big")
    p.add_argument("--ticks", type=int, default=60, help="backfilled ticks of 10 s per cluster")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--serve-store", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--serve-proxy", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--store", default="", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_store:
        asyncio.run(_serve_store(args.port))
        return
    if args.serve_proxy:
        asyncio.run(_serve_proxy(args.port, args.store))
        return
    if args.quick:
        args.pods, args.queries, args.ticks = 200, 20, 12
    r = asyncio.run(main_async(args))
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "bench_federate.json").write_text(json.dumps(r, indent=2))
    print(f"command: {r['command']}  (cores: {r['cores']}, Python {r['python']})")
    print(markdown(r))


if __name__ == "__main__":
    main()
