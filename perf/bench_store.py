"""Benchmark of one store process over gRPC on loopback (a documented command, not a test).

    .venv/bin/python perf/bench_store.py            # full: 10,000+ series x 1 day, 5,000-pod aggregate
    .venv/bin/python perf/bench_store.py --quick    # a few minutes smaller

Measures, on simulated pod metrics (metricsd/agent/simulate.py, seeded):
1. ingest through gRPC Write into a separate `metricsd up --no-simulate` process: samples/s and
   server CPU seconds per million samples, in two shapes: backfill (1,000 series x 60 samples a
   request) and the agents' live shape (1,000 series x 1 sample a request);
2. chunk bytes per sample (the store's Stats) and whole-process RSS per sample and per series;
3. latency (p50, p99, at concurrency 1 and 8) of the average CPU rate over one 5,000-pod
   workload over a 1-minute window, and of the same as utilisation (usage / requests).
Prints a Markdown table to paste into perf/RESULTS.md and writes perf/results/bench_store.json.
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
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procstat import cpu_seconds, rss_bytes

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.ports import free_port as _free_port
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.client import MetricsClient
from metricsd.rpc.wire import matchers_to_pb
from metricsd.selector import parse_selector

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent / "metricsd"
DAY_MS = 86_400_000




class StoreProcess:
    """A store in its own process on a free loopback port; ``command(port)`` says how to start it
    (default: ``metricsd up --no-simulate``)."""

    def __init__(self, command: Callable[[int], list[str]] | None = None) -> None:
        self.port = _free_port()
        cmd = command(self.port) if command is not None else [
            str(BIN), "--log-level", "WARNING", "up", "--no-simulate", "--no-consumers", "--grpc-port", str(self.port),
            "--http-port", str(_free_port())]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        self.addr = f"127.0.0.1:{self.port}"

    async def wait_ready(self, client: MetricsClient) -> None:
        for _ in range(200):
            try:
                await client.health()
                return
            except Exception:
                await asyncio.sleep(0.1)
        raise RuntimeError("store did not start")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)  # a durable store writes its final snapshot first


async def _send_block(client: MetricsClient, reqs: list[pb.WriteRequest], inflight: int) -> None:
    sem = asyncio.Semaphore(inflight)

    async def one(r: pb.WriteRequest) -> None:
        async with sem:
            resp = await client.write(r)
            if resp.unknown_ids or resp.rejected_too_old or resp.rejected_duplicate:
                raise RuntimeError(f"unexpected write response {resp}")

    await asyncio.gather(*(one(r) for r in reqs))


async def ingest(client: MetricsClient, pid: int, sim: Simulator, ticks: int, ticks_per_req: int,
                 series_per_req: int, first: bool) -> dict[str, float]:
    """Feed ``ticks`` ticks; requests of a block go concurrently, blocks in order (no reordering)."""
    sent = 0
    wall = 0.0
    cpu0 = cpu_seconds(pid)
    labels_sent = not first
    done = 0
    while done < ticks:
        n = min(ticks_per_req, ticks - done)
        ts, values = sim.block(n)
        reqs = write_requests(sim, ts, values, max_samples=series_per_req * n,
                              send_labels_for=set() if labels_sent else None)
        labels_sent = True
        t0 = time.perf_counter()
        await _send_block(client, reqs, inflight=4)
        wall += time.perf_counter() - t0
        sent += values.size
        done += n
    cpu = cpu_seconds(pid) - cpu0
    return {"samples": sent, "wall_s": wall, "samples_per_s": sent / wall, "server_cpu_s": cpu,
            "server_cpu_s_per_million": cpu / sent * 1e6}


def _agg_request(ratio: bool, at_ms: int) -> pb.AggregateRequest:
    req = pb.AggregateRequest(across=pb.ACROSS_AVG if not ratio else pb.ACROSS_SUM, start_ms=at_ms, end_ms=at_ms)
    req.query.matchers.extend(matchers_to_pb(parse_selector('workload="big"', "container_cpu_usage_seconds_total")))
    req.query.series_fn = pb.SERIES_RATE
    req.query.window_ms = 60_000
    if ratio:
        req.denominator.matchers.extend(matchers_to_pb(parse_selector('workload="big",resource="cpu"',
                                                                      "kube_pod_container_resource_requests")))
        req.denominator.series_fn = pb.SERIES_LAST
        req.denominator.window_ms = 300_000
    return req


async def latency(client: MetricsClient, req: pb.AggregateRequest, n: int, concurrency: int,
                  min_series: int = 5000, warmup: int = 10, exact: bool = False) -> dict[str, float]:
    """p50 / p99 of ``n`` aggregates at ``concurrency``; each must have scanned ``min_series``
    series (exactly that many with ``exact``: through a proxy, replicas must not be counted twice)."""
    for _ in range(warmup):
        await client.aggregate(req)
    times: list[float] = []
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            t0 = time.perf_counter()
            resp = await client.aggregate(req)
            times.append(time.perf_counter() - t0)
            if resp.series_scanned < min_series or (exact and resp.series_scanned != min_series):
                raise RuntimeError(f"aggregate scanned {resp.series_scanned} series, want {min_series}")

    await asyncio.gather(*(one() for _ in range(n)))
    a = np.array(times) * 1000
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)), "n": n}


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    out: dict[str, object] = {"command": " ".join([".venv/bin/python", "perf/bench_store.py", *sys.argv[1:]]),
                              "cores": os.cpu_count(), "python": platform.python_version()}
    # Part 1: ingest and memory, >= 10,000 series over a day (backfill) then live-shaped.
    pods = args.pods
    day_ticks = args.hours * 360
    live_ticks = args.live_ticks
    store = StoreProcess()
    async with MetricsClient(store.addr, timeout_s=60) as client:
        await store.wait_ready(client)
        base_rss = rss_bytes(store.proc.pid)
        sim = Simulator(SimConfig(pods=pods, workloads=50, nodes=max(5, pods // 50), seed=1), 1_700_000_000_000)
        n_series = len(sim.series)
        backfill = await ingest(client, store.proc.pid, sim, day_ticks - live_ticks, 60, 1000, first=True)
        live = await ingest(client, store.proc.pid, sim, live_ticks, 1, 1000, first=False)
        st = await client.stats()
        rss = rss_bytes(store.proc.pid)
    store.stop()
    out["ingest"] = {"series": n_series, "backfill_shape": backfill, "live_shape": live}
    out["memory"] = {"series": st.series, "samples": st.samples, "chunk_bytes": st.chunk_bytes,
                     "chunk_bytes_per_sample": st.bytes_per_sample, "rss_bytes": rss, "rss_bytes_at_start": base_rss,
                     "rss_bytes_per_sample": rss / st.samples, "rss_bytes_per_series": rss / st.series}
    if args.skip_aggregate:
        out["aggregate_5000_pods"] = {}
        return out
    # Part 2: aggregate latency over a 5,000-pod workload.
    store = StoreProcess()
    async with MetricsClient(store.addr, timeout_s=60) as client:
        await store.wait_ready(client)
        sim = Simulator(SimConfig(pods=args.agg_pods, workloads=101, nodes=100, seed=2, big_workload_pods=5000),
                        1_700_000_000_000)
        await ingest(client, store.proc.pid, sim, 360, 60, 1000, first=True)
        at = sim.next_timestamp_ms - 1
        lat = {}
        for name, ratio in (("avg_rate", False), ("utilisation", True)):
            for c in (1, 8):
                lat[f"{name}_c{c}"] = await latency(client, _agg_request(ratio, at), args.queries, c)
    store.stop()
    out["aggregate_5000_pods"] = lat
    return out


def markdown(r: dict) -> str:
    ing, mem, lat = r["ingest"], r["memory"], r["aggregate_5000_pods"]
    b, li = ing["backfill_shape"], ing["live_shape"]
    rows = [
        "| measure | metricsd (one store process) | target |",
        "| --- | --- | --- |",
        f"| ingest, backfill shape (1,000 series x 60 samples a request) | {b['samples_per_s']:,.0f} samples/s; "
        f"{b['server_cpu_s_per_million']:.2f} server CPU s per million | >= 500,000 samples/s |",
        f"| ingest, live shape (1,000 series x 1 sample a request) | {li['samples_per_s']:,.0f} samples/s; "
        f"{li['server_cpu_s_per_million']:.2f} server CPU s per million | >= 500,000 samples/s; < 1.0 CPU s/M |",
        f"| chunk bytes per sample ({mem['samples']:,} samples, {mem['series']:,} series) | "
        f"{mem['chunk_bytes_per_sample']:.3f} | <= 1.5 |",
        f"| RSS per sample / per series (RSS {mem['rss_bytes'] / 2**20:.0f} MiB) | "
        f"{mem['rss_bytes_per_sample']:.2f} / {mem['rss_bytes_per_series']:,.0f} | < 6.0 (VictoriaMetrics) |",
    ]
    for k, v in lat.items():
        target = "p99 < 10 ms" if k.endswith("_c1") else "5x faster than peers (Prometheus ~300 ms, VM ~200 ms)"
        rows.append(f"| aggregate {k.replace('_c', ', concurrency ')} over 5,000 pods, 1m window: p50 / p99 | "
                    f"{v['p50_ms']:.2f} / {v['p99_ms']:.2f} ms | {target} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 hours of data instead of 24")
    p.add_argument("--pods", type=int, default=1250, help="pods for part 1 (8 series each)")
    p.add_argument("--hours", type=int, default=24)
    p.add_argument("--live-ticks", type=int, default=30)
    p.add_argument("--agg-pods", type=int, default=10_000)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--skip-aggregate", action="store_true", help="only ingest and memory")
    args = p.parse_args()
    if args.quick:
        args.hours = 2
    r = asyncio.run(main_async(args))
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "bench_store.json").write_text(json.dumps(r, indent=2))
    print(f"command: {r['command']}  (cores: {r['cores']}, Python {r['python']})")
    print(markdown(r))


if __name__ == "__main__":
    main()
