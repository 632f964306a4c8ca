"""Benchmark of the proxy in a 3-store RF 3 cluster on loopback (a documented command, not a test).

    .venv/bin/python perf/bench_proxy.py            # 5,000 pods, 10 minutes of data, 200 queries
    .venv/bin/python perf/bench_proxy.py --quick    # fewer queries and ticks

Five processes: three stores (an in-memory Store served over gRPC, no WAL: this measures the
proxy's data path, not durability), one proxy (ProxyBackend on a static 64-slot RF 3 shard map,
W 2 / R 2, served over gRPC) and this client. All three stores hold every slot (RF 3 of 3), so
each write is sent three times and acknowledged at two.

Measures, on simulated pod metrics (one Deployment ``big`` of 5,000 pods, seeded):
1. ingest through the proxy: samples/s acknowledged, in the backfill shape (1,000 series x 60
   samples a request) and the agents' live shape (1,000 series x 1 sample a request), with the
   proxy's and the stores' CPU seconds per million samples;
2. latency (p50, p99 at concurrency 1 and 8) of the average CPU rate over the 5,000-pod workload
   (1-minute window) through the proxy: R=2 replicas per slot, one answering with group partials
   and the other with slot digests (``--exact-reads``: both with per-series values, merged).
Prints a Markdown table and writes perf/results/bench_proxy.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_store import latency
from procstat import cpu_seconds

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.ports import free_port as _free_port
from metricsd.proto import metricsd_pb2 as pb
from metricsd.proxy.coalesce import CoalesceSettings
from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import MetricsClient, StreamingBackend
from metricsd.rpc.wire import matchers_to_pb
from metricsd.selector import parse_selector

HERE = Path(__file__).resolve().parent
SLOTS = 64




# --- the server processes (this script re-run with --serve-store / --serve-proxy) -----------------


async def _serve_store(port: int) -> None:
    from metricsd.rpc.server import start_grpc_server
    from metricsd.store.api import StoreServicer
    from metricsd.store.engine import Store

    server, _ = await start_grpc_server(StoreServicer(Store(), f"store-{port}"), "127.0.0.1", port)
    await _until_signal()
    await server.stop(None)


async def _serve_proxy(port: int, stores: list[str], digest_reads: bool, calls_per_member: int,
                       linger_ms: float) -> None:
    from metricsd.clock import SystemClock
    from metricsd.cluster.assign import assign
    from metricsd.cluster.mapsource import StaticMapSource
    from metricsd.cluster.shardmap import Member
    from metricsd.proxy.backend import ProxyBackend
    from metricsd.proxy.settings import ProxySettings
    from metricsd.rpc.server import start_grpc_server
    from metricsd.rpc.servicer import MetricsServicer

    members = [Member(f"store-{i}", addr) for i, addr in enumerate(stores)]
    proxy = ProxyBackend(StaticMapSource(assign(members, None, SLOTS, 3)),
                         ProxySettings(call_timeout_s=30, digest_reads=digest_reads,
                                       coalesce=CoalesceSettings(calls_per_member=calls_per_member,
                                                                 linger_s=linger_ms / 1000)),
                         SystemClock())
    server, _ = await start_grpc_server(MetricsServicer(proxy), "127.0.0.1", port)
    await _until_signal()
    await server.stop(None)
    await proxy.close()


async def _until_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


class Proc:
    """A server process on 127.0.0.1. ``argv`` without ``port`` gets ``--port`` and a free port
    appended; with ``port`` it already names it its own way."""

    def __init__(self, argv: list[str], port: int | None = None, cwd: Path | None = None) -> None:
        self.port = port or _free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([*argv, "--port", str(self.port)] if port is None else argv, cwd=cwd)

    async def wait_ready(self) -> None:
        async with MetricsClient(self.addr, timeout_s=2) as c:
            for _ in range(200):
                try:
                    await c.health()
                    return
                except Exception:
                    await asyncio.sleep(0.1)
        raise RuntimeError(f"{self.addr} did not start")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)


# --- the client -----------------------------------------------------------------------------------


class Writer(Protocol):
    async def write(self, request: pb.WriteRequest) -> pb.WriteResponse: ...


async def ingest(client: Writer, pids: dict[str, list[int]], sim: Simulator, ticks: int, ticks_per_req: int,
                 first: bool, in_flight: int = 4) -> dict[str, float]:
    """Feed ``ticks`` ticks; the requests of a block go ``in_flight`` at a time (as that many agents
    would), blocks in time order."""
    sent, wall, done = 0, 0.0, 0
    cpu0 = {k: sum(cpu_seconds(p) for p in v) for k, v in pids.items()}
    labels_sent = not first
    sem = asyncio.Semaphore(in_flight)
    while done < ticks:
        n = min(ticks_per_req, ticks - done)
        ts, values = sim.block(n)
        reqs = write_requests(sim, ts, values, max_samples=1000 * n, send_labels_for=set() if labels_sent else None)
        labels_sent = True

        async def one(r: pb.WriteRequest) -> None:
            async with sem:
                resp = await client.write(r)
                if resp.unknown_ids or resp.rejected_too_old or resp.rejected_duplicate:
                    raise RuntimeError(f"unexpected write response {resp}")

        t0 = time.perf_counter()
        await asyncio.gather(*(one(r) for r in reqs))
        wall += time.perf_counter() - t0
        sent += values.size
        done += n
    out = {"samples": float(sent), "wall_s": wall, "samples_per_s": sent / wall}
    for k, v in pids.items():
        out[f"{k}_cpu_s_per_million"] = (sum(cpu_seconds(p) for p in v) - cpu0[k]) / sent * 1e6
    return out


def _agg_request(at_ms: int) -> pb.AggregateRequest:
    req = pb.AggregateRequest(across=pb.ACROSS_AVG, start_ms=at_ms, end_ms=at_ms)
    req.query.matchers.extend(matchers_to_pb(parse_selector('workload="big"', "container_cpu_usage_seconds_total")))
    req.query.series_fn = pb.SERIES_RATE
    req.query.window_ms = 60_000
    return req


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    out: dict[str, object] = {"command": " ".join([".venv/bin/python", "perf/bench_proxy.py", *sys.argv[1:]]),
                              "cores": os.cpu_count(), "python": platform.python_version()}
    me = [sys.executable, __file__]
    stores = [Proc([*me, "--serve-store"]) for _ in range(3)]
    proxy = None
    try:
        for s in stores:
            await s.wait_ready()
        proxy = Proc([*me, "--serve-proxy", "--stores", ",".join(s.addr for s in stores),
                      *(["--exact-reads"] if args.exact_reads else []),
                      "--write-calls-per-member", str(args.write_calls_per_member),
                      "--write-linger", str(args.write_linger)])
        await proxy.wait_ready()
        pids = {"proxy": [proxy.proc.pid], "stores": [s.proc.pid for s in stores]}
        sim = _simulator(args)
        out["series"] = len(sim.series)
        async with MetricsClient(proxy.addr, timeout_s=120) as client:
            out["ingest"] = await feed(args, client, pids, sim)
            at = sim.next_timestamp_ms - 1
            out["aggregate"] = {
                f"c{c}": await latency(client, _agg_request(at), args.queries, c, min_series=args.pods, warmup=5,
                                       exact=True)
                for c in (1, 8)}
            st = await client.stats()
            out["stats"] = {"series_raw": st.series, "samples_raw": st.samples,
                            "proxy": {k: v for k, v in st.rejected.items() if k.startswith("proxy_")}}
    finally:
        if proxy is not None:
            proxy.stop()
        for s in stores:
            s.stop()
    if args.one_store:
        out["one_store"] = await one_store(args)
    return out


async def one_store(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """The same workload fed the same way straight into one store: the reference for what the three
    stores of the cluster together cost (at most 3x, issue 12)."""
    store = Proc([sys.executable, __file__, "--serve-store"])
    try:
        await store.wait_ready()
        async with MetricsClient(store.addr, timeout_s=120) as client:
            return await feed(args, client, {"store": [store.proc.pid]}, _simulator(args))
    finally:
        store.stop()


def _simulator(args: argparse.Namespace) -> Simulator:
    return Simulator(SimConfig(pods=args.pods, workloads=1, nodes=100, seed=2, big_workload_pods=args.pods),
                     1_700_000_000_000)


async def feed(args: argparse.Namespace, client: MetricsClient, pids: dict[str, list[int]], sim: Simulator
               ) -> dict[str, dict[str, float]]:
    """The backfill, then the live shape, to ``client``'s address as the node agent writes
    (cmd/agent.py): over one WriteStream, or with ``--writes unary`` a Write a batch."""
    writer: Writer = StreamingBackend(open_channel(client.address), 120) if args.writes == "stream" else client
    try:
        backfill = await ingest(writer, pids, sim, args.ticks, 60, first=True)
        live = await ingest(writer, pids, sim, args.live_ticks, 1, first=False, in_flight=args.in_flight)
    finally:
        if isinstance(writer, StreamingBackend):
            await writer.close()
    return {"backfill_shape": backfill, "live_shape": live}


def markdown(r: dict) -> str:
    b, li = r["ingest"]["backfill_shape"], r["ingest"]["live_shape"]
    rows = [
        "| measure (3 stores, RF 3, W 2, R 2, one proxy, loopback) | metricsd |",
        "| --- | --- |",
        f"| ingest through the proxy, backfill shape (1,000 series x 60 samples a request) | "
        f"{b['samples_per_s']:,.0f} samples/s; CPU s per million: proxy {b['proxy_cpu_s_per_million']:.2f}, "
        f"3 stores {b['stores_cpu_s_per_million']:.2f} |",
        f"| ingest through the proxy, live shape (1,000 series x 1 sample a request) | "
        f"{li['samples_per_s']:,.0f} samples/s; CPU s per million: proxy {li['proxy_cpu_s_per_million']:.2f}, "
        f"3 stores {li['stores_cpu_s_per_million']:.2f} |",
    ]
    one = r.get("one_store")
    if one is not None:
        for shape, label in (("backfill_shape", "backfill"), ("live_shape", "live")):
            alone, three = one[shape]["store_cpu_s_per_million"], r["ingest"][shape]["stores_cpu_s_per_million"]
            rows.append(f"| one store fed directly, {label} shape: CPU s per million (the 3 stores' multiple) | "
                        f"{alone:.2f} ({three / alone:.1f}x) |")
    counters = r.get("stats", {}).get("proxy", {})
    if counters.get("proxy_member_write_parts"):
        rows.append(f"| the proxy's write calls to stores / parts sent (whole run) | "
                    f"{counters.get('proxy_member_write_calls', 0):,} / {counters['proxy_member_write_parts']:,} |")
    for c, v in r["aggregate"].items():
        rows.append(f"| avg CPU rate of the 5,000-pod workload through the proxy, concurrency {c[1:]}: p50 / p99 | "
                    f"{v['p50_ms']:.1f} / {v['p99_ms']:.1f} ms |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="20 queries, 30 ticks")
    p.add_argument("--pods", type=int, default=5000, help="pods of the one big Deployment (8 series each)")
    p.add_argument("--ticks", type=int, default=60, help="backfilled ticks of 10 s")
    p.add_argument("--live-ticks", type=int, default=6, help="ticks sent in the live shape afterwards")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--exact-reads", action="store_true",
                   help="the proxy merges every replica's per-series values (ProxySettings.digest_reads off)")
    p.add_argument("--no-one-store", dest="one_store", action="store_false",
                   help="skip feeding one store directly with the same workload (the stores' reference)")
    p.add_argument("--serve-store", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--write-calls-per-member", type=int, default=1, metavar="N",
                   help="the proxy's write calls under way per store before batches coalesce (0: a call per batch)")
    p.add_argument("--write-linger", type=float, default=CoalesceSettings.linger_s * 1000, metavar="MS",
                   help="how long a batch bound for an idle store waits for others (the proxy's --write-linger)")
    p.add_argument("--writes", choices=("stream", "unary"), default="stream",
                   help="how the client sends its batches to the proxy: one WriteStream (as the agent does) or a "
                        "Write call each")
    p.add_argument("--in-flight", type=int, default=4, help="live-shape requests in flight (agents writing at once)")
    p.add_argument("--serve-proxy", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--stores", default="", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_store:
        asyncio.run(_serve_store(args.port))
        return
    if args.serve_proxy:
        asyncio.run(_serve_proxy(args.port, args.stores.split(","), not args.exact_reads, args.write_calls_per_member,
                                 args.write_linger))
        return
    if args.quick:
        args.queries, args.ticks = 20, 30
    r = asyncio.run(main_async(args))
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "bench_proxy.json").write_text(json.dumps(r, indent=2))
    print(f"command: {r['command']}  (cores: {r['cores']}, Python {r['python']})")
    print(markdown(r))


if __name__ == "__main__":
    main()
