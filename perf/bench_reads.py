"""The fixed cost of a read, for A/B runs and profiles (issue 23): perf/compare_http.py's questions
over PromQL HTTP on one store (``metricsd up``), a cluster (``metricsd cluster up --plaintext``: 3
stores, RF 3, W 2, R 2, one proxy) and VictoriaMetrics, fed the same seeded workload
(perf/compare_workload.py), then asked in rounds, systems interleaved, with each system's server
CPU per question from /proc (in nanoseconds, perf/compare_cpu.py; each row's ``cpu_ms_all_ticks``
is the old utime + stime reading in 10 ms ticks, beside it). Smaller and quicker than
perf/compare.py (no Prometheus, no ingest figures), so that a change can be measured against its
parent in the same minutes.

    .venv/bin/python perf/bench_reads.py                       # 2,000 pods x 1 h, questions 1 b a
    .venv/bin/python perf/bench_reads.py --questions 1,b --rounds 5 --queries 200 --concurrency 1,8
    .venv/bin/python perf/bench_reads.py --profile 10 --questions 1,b   # py-spy, 10 s a question
    METRICSD_EVENT_LOOP=asyncio .venv/bin/python perf/bench_reads.py    # the servers without uvloop

``--extra-env NAME=VALUE`` starts the metricsd servers with that variable (an A/B of a setting).
``--variant NAME=DIR[,VAR=VALUE...]`` adds one more store process (``metricsd up``) running the
code of checkout DIR (``git worktree add DIR COMMIT``; PYTHONPATH=DIR) with those variables, and
``--cluster-variant`` one more cluster: the variants are fed and asked with the rest, interleaved,
so a before/after is measured in the same minutes on the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_peers
from compare import grpc_senders, ingest, remote_write_sender, server_cpu, wait_cluster_ready
from compare_cpu import cpu_seconds
from compare_http import http_questions, interleaved_cpu, profile_pids, proxy_counters
from compare_peers import Processes, Server
from compare_queries import Question, promql_get, summarise
from compare_workload import Workload, WorkloadConfig

from metricsd.rpc.client import MetricsClient

HERE = Path(__file__).resolve().parent


async def idle_cpu(servers: dict[str, Server], seconds: float) -> dict[str, dict[str, float]]:
    """Each metricsd server's CPU milliseconds a second while nothing writes or asks, per process
    (``role pid``) and ``all``: the background work (heartbeats, lease keep-alives, the map's watch,
    the stores' housekeeping) that every question's CPU window also counts."""
    mine = {n: s for n, s in servers.items() if n.startswith("metricsd")}
    before = {n: {(r, p): cpu_seconds(p) for r, ps in s.pids().items() for p in ps} for n, s in mine.items()}
    t0 = time.monotonic()
    await asyncio.sleep(seconds)
    took = time.monotonic() - t0
    out: dict[str, dict[str, float]] = {}
    for n, procs in before.items():
        row = {f"{r} {p}": (cpu_seconds(p) - v) / took * 1000 for (r, p), v in procs.items()}
        row["all"] = sum(row.values())
        out[n] = row
        print(f"idle {n}: " + json.dumps({k: round(v, 2) for k, v in row.items()}), flush=True)
    return out


def _folded_top(path: Path, n: int = 30) -> list[str]:
    """The ``n`` frames with the most samples in a py-spy raw profile (inclusive), and the total."""
    incl: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        c = int(count)
        total += c
        for frame in set(stack.split(";")):
            incl[frame] += c
    return [f"{total} samples"] + [f"{v / total:6.1%} {k}" for k, v in incl.most_common(n)]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    end = (time.time_ns() // 1_000_000 // 10_000) * 10_000 - 10_000
    cfg = WorkloadConfig(end_ms=end, ticks=round(args.hours * 360), live_ticks=10).scaled(args.scale)
    wl = Workload(cfg)
    keys = args.questions.split(",")
    conc = [int(c) for c in args.concurrency.split(",")]
    out: dict[str, Any] = {"command": " ".join(["perf/bench_reads.py", *sys.argv[1:]]),
                           "load_before": os.getloadavg(), "series": len(wl.series), "rows": []}
    with Processes() as procs:
        servers: dict[str, Server] = {"metricsd-promql": procs.start_metricsd()}
        if not args.no_cluster:
            servers["metricsd-cluster-promql"] = procs.start_metricsd_cluster()
        for spec, cluster in [(v, False) for v in args.variant] + [(v, True) for v in args.cluster_variant]:
            name, _, rest = spec.partition("=")
            folder, *envs = rest.split(",")
            saved, cwd = dict(os.environ), os.getcwd()
            os.environ["PYTHONPATH"] = folder
            os.environ.update(e.split("=", 1) for e in envs)  # type: ignore[misc]
            # A cluster's processes are started as `python -m metricsd`, which puts their working
            # directory first on sys.path: started from a checkout, they would run ITS code, not DIR's.
            os.chdir(folder)
            try:
                servers[name] = (procs.start_metricsd_cluster(name) if cluster else procs.start_metricsd(name))
            finally:
                os.chdir(cwd)
                os.environ.clear()
                os.environ.update(saved)
        if not args.no_vm:
            servers["victoriametrics"] = procs.start_victoria_metrics()
        grpc = {n: s for n, s in servers.items() if s.grpc_address}
        async with AsyncExitStack() as stack:
            http = await stack.enter_async_context(aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64), timeout=aiohttp.ClientTimeout(total=300)))
            for n, s in grpc.items():
                if s.tree:
                    async with MetricsClient(s.grpc_address) as c:
                        await wait_cluster_ready(c, n)
            senders = grpc_senders(stack, grpc, {})
            senders.update({n: remote_write_sender(http, s) for n, s in servers.items() if n not in grpc})
            print(f"feeding {wl.samples:,} samples of {len(wl.series):,} series ...", flush=True)
            await ingest(wl, False, senders, servers)
            await ingest(wl, True, senders, servers)
            await asyncio.sleep(2.0)
            if args.idle:
                out["idle"] = await idle_cpu(servers, args.idle)
            at = wl.last_ms + 5_000
            qs = [q for q in http_questions(at, *wl.question_targets()) if q.key in keys]
            urls = {n: s.url for n, s in servers.items()}
            cpu = {n: (lambda s=s: server_cpu(s)) for n, s in servers.items()}
            counters = {n: proxy_counters(s.url) for n, s in servers.items() if s.tree}
            for q in qs:
                for url in urls.values():  # every system answers before any timing
                    await promql_get(http, url, q)
            if args.profile:
                prof = Path(args.profile_dir)
                prof.mkdir(parents=True, exist_ok=True)
                pids = {"store": servers["metricsd-promql"].pid}
                if "metricsd-cluster-promql" in servers:
                    roles = servers["metricsd-cluster-promql"].pids()
                    pids.update({"cluster_proxy": roles["proxy"][0], "cluster_store": roles["store"][0]})
                for q in qs:
                    for name in (n for n in servers if n.startswith("metricsd")):
                        own = {k: v for k, v in pids.items() if k.startswith("cluster") == ("cluster" in name)}
                        files = {k: prof / f"bench_reads_{q.key}_{k}.txt" for k in own}
                        async with profile_pids(own, lambda k, files=files: files[k]):
                            t0 = time.monotonic()

                            async def ask(url: str = urls[name], q: Question = q, t0: float = t0) -> None:
                                while time.monotonic() - t0 < args.profile:
                                    await promql_get(http, url, q)

                            await asyncio.gather(*(ask() for _ in range(max(conc))))  # at the top concurrency
                        for k, f in files.items():
                            if f.exists():
                                print(f"--- ({q.key}) {k}: {f}\n" + "\n".join(_folded_top(f)), flush=True)
            for r in range(args.rounds):
                for q in qs:
                    for c in conc:
                        calls = {n: (lambda url=url, q=q: promql_get(http, url, q)) for n, url in urls.items()}
                        times, spent = await interleaved_cpu(calls, cpu, args.queries, c, args.warmup, counters)
                        for n, t in times.items():
                            pct = summarise(t)
                            row = {"round": r, "q": q.key, "c": c, "system": n, "p50_ms": pct["p50_ms"],
                                   "p99_ms": pct["p99_ms"],
                                   "cpu_ms": spent[n].get("all", 0.0) / len(t) * 1000,
                                   **{f"cpu_ms_{k}": v / len(t) * 1000 for k, v in spent[n].items()
                                      if k in ("proxy", "store", "all_ticks")},
                                   **{k.removeprefix("counter:"): v for k, v in spent[n].items()
                                      if k.startswith("counter:")}}
                            out["rows"].append(row)
                            print(json.dumps(row), flush=True)
            for n, s in servers.items():  # how the clusters' proxies read: one replica, hedges, quorum
                if s.tree and s.grpc_address:
                    async with MetricsClient(s.grpc_address) as c:
                        stats = await c.stats()
                    out.setdefault("proxy_counters", {})[n] = {
                        k: v for k, v in stats.rejected.items() if k.startswith("proxy_read") or "whole" in k}
                    print(n, json.dumps(out["proxy_counters"][n]), flush=True)
    out["load_after"] = os.getloadavg()
    return out


def summary(res: dict[str, Any]) -> list[str]:
    """Median over rounds of p50, p99 and CPU per question, per question, concurrency and system."""
    keys: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for row in res["rows"]:
        keys.setdefault((row["q"], row["c"], row["system"]), []).append(row)
    lines = ["| question | c | system | p50 ms | p99 ms | CPU ms per question (proxy / stores) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for (q, c, s), rows in keys.items():
        med = {k: float(np.median([r.get(k, np.nan) for r in rows])) for k in
               ("p50_ms", "p99_ms", "cpu_ms", "cpu_ms_proxy", "cpu_ms_store")}
        roles = f" ({med['cpu_ms_proxy']:.2f} / {med['cpu_ms_store']:.2f})" if not np.isnan(med["cpu_ms_proxy"]) else ""
        lines.append(f"| {q} | {c} | {s} | {med['p50_ms']:.2f} | {med['p99_ms']:.2f} | {med['cpu_ms']:.2f}{roles} |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=0.2, help="of compare.py's 10,000 pods (default 0.2)")
    p.add_argument("--hours", type=float, default=1.0)
    p.add_argument("--questions", default="1,b,a", help="of 1,b,c,a,d (perf/compare_http.py)")
    p.add_argument("--concurrency", default="1")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--queries", type=int, default=200, help="per system, question, concurrency and round")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--profile", type=float, default=0.0, metavar="SECONDS",
                   help="py-spy each metricsd process while asking each question back to back, at the "
                        "highest --concurrency")
    p.add_argument("--profile-dir", default=str(HERE / "results" / "profiles"),
                   help="where --profile writes py-spy's raw stacks (METRICSD_PYSPY_RATE: samples a second)")
    p.add_argument("--idle", type=float, default=0.0, metavar="SECONDS",
                   help="after feeding, each metricsd process's CPU ms a second over SECONDS of nothing asked")
    p.add_argument("--no-cluster", action="store_true")
    p.add_argument("--no-vm", action="store_true")
    p.add_argument("--metricsd", default=str(compare_peers.METRICSD), help="the metricsd executable to run")
    p.add_argument("--extra-env", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=DIR[,VAR=VALUE...]")
    p.add_argument("--cluster-variant", action="append", default=[], metavar="NAME=DIR[,VAR=VALUE...]")
    p.add_argument("--out", default=str(HERE / "results" / "bench_reads.json"))
    args = p.parse_args()
    compare_peers.METRICSD = Path(args.metricsd)
    for kv in args.extra_env:
        name, _, value = kv.partition("=")
        os.environ[name] = value  # inherited by the servers this starts
    compare_peers.ensure_installed()
    res = asyncio.run(run(args))
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"load average before {res['load_before']}, after {res['load_after']}")
    print("\n".join(summary(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
