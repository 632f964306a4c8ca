"""metricsd side by side with Prometheus and VictoriaMetrics, on the same data, in one run
(a documented command, `make bench`; never part of the test suite's pass/fail).

    .venv/bin/python perf/compare.py            # full: 10,000 pods, 40,000 series, 2 h (about 10 min)
    .venv/bin/python perf/compare.py --quick    # 2,000 pods, 60 queries (about 1.5 min)
    .venv/bin/python perf/compare.py --event-loop asyncio,uvloop   # every metricsd process on each loop, one run

1. Starts metricsd (`metricsd up --no-simulate --no-consumers`, one store process), a metricsd
   cluster (`metricsd cluster up --no-simulate`: 3 stores, RF 3, W 2, R 2, one proxy, etcd and a
   config server; `--no-cluster` leaves it out), Prometheus 2.42 (remote-write receiver on) and
   VictoriaMetrics 1.79 (no latency offset, no response cache) on 127.0.0.1 with temporary data
   directories, installing the Debian packages when missing (as root); stops every process it
   started, also on Ctrl-C or an error.
2. Feeds one seeded simulation (perf/compare_workload.py) to all of them in the same batches, block
   by block with the systems' order rotating: the backfill shape, then the agents' live shape.
   metricsd and the cluster's proxy get columnar gRPC Write; the peers, and a second metricsd
   process, Prometheus remote write. Measures samples/s, server CPU seconds per million samples
   (/proc; for the cluster, all its processes, and the proxy and the stores apart), RSS (the
   cluster: the sum of its processes, three copies of every sample) and the time from the last
   acknowledged write to the sample being queryable.
3. Checks that metricsd's answers (Aggregate API and PromQL endpoint) equal Prometheus' within a
   relative 1e-6 on the three questions of perf/compare_queries.py, and exits non-zero before any
   timing if they do not; VictoriaMetrics' differences are reported.
4. Times each question at concurrency 1 and 8, systems interleaved (A B C D D C B A).
   Then the dashboard's questions over PromQL HTTP (perf/compare_http.py: `1`, (b), (c), (a) and
   average memory by workload) on one store, the cluster's proxy, Prometheus and VictoriaMetrics,
   with each system's server CPU per question; `--no-http-questions` leaves them out, and
   `--profile` records py-spy profiles of `1` and (b) on the store, the proxy and one cluster store.
5. Writes perf/results/latest.json, perf/results/compare_latency.png and the generated section of
   perf/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, nullcontext
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_cpu import cpu_seconds, ticks_ns
from compare_http import HTTP_SYSTEMS, check_http_answers, http_questions, profile_pids, proxy_counters, time_http
from compare_peers import Processes, Server, armed, check_loops, ensure_installed, package_version, server_of
from compare_queries import (
    Comparison,
    Question,
    compare_answers,
    from_aggregate,
    from_prometheus_json,
    interleaved,
    promql_get,
    questions,
    summarise,
)
from compare_report import latency_chart, loop_ab, markdown, measure, ratios, replace_section
from compare_workload import Batch, Workload, WorkloadConfig
from procstat import peak_rss_bytes, rss_bytes

from metricsd import __version__
from metricsd.cmd import eventloop
from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import MetricsClient, StreamingBackend

HERE = Path(__file__).resolve().parent
RTOL = 1e-6
INFLIGHT = 4
RW_HEADERS = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
              "X-Prometheus-Remote-Write-Version": "0.1.0"}
Send = Callable[[Batch], Awaitable[None]]


def server_cpu(server: Server) -> dict[str, float]:
    """CPU seconds so far by role (``server`` for one process; a cluster's roles, and ``all``), in
    nanoseconds (perf/compare_cpu.py); ``all_ticks``: every process's utime + stime, the old
    10 ms-step reading, kept beside it so that a result can say how the two agree."""
    pids = server.pids()
    by_role = {role: sum(cpu_seconds(p) for p in ps) for role, ps in pids.items()}
    by_role["all"] = sum(by_role.values())
    by_role["all_ticks"] = sum(ticks_ns(p) for ps in pids.values() for p in ps) / 1e9
    return by_role


def _cpu_of(server: Server) -> Callable[[], dict[str, float]]:
    return lambda: server_cpu(server)


def server_rss(server: Server, peak: bool = False) -> int:
    read = peak_rss_bytes if peak else rss_bytes
    return sum(read(p) for pids in server.pids().values() for p in pids)


async def wait_cluster_ready(client: MetricsClient, name: str, timeout_s: float = 60.0) -> None:
    """Until the proxy can reach a read quorum for every slot (the config server has assigned them)."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            h = await client.health()
            if h.status == h.SERVING:
                return
            last = h.member
        except Exception as e:  # not up yet
            last = str(e)
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{name} did not become ready in {timeout_s:.0f} s: {last}")


def grpc_sender(client: StreamingBackend, duplicates: dict[str, int], name: str) -> Send:
    """Batches over one WriteStream, as the node agent sends them. Every sample must be accepted. A
    duplicate counts as accepted, as the write policy has it (a timestamp the series holds already:
    first write wins, so a retry is idempotent) and as the remote-write path counts it; a cluster
    reports some when a replica got a sample by anti-entropy or a retried call before its own copy
    of the write landed. They are counted in the results, not hidden."""
    async def send(b: Batch) -> None:
        resp = await client.write(b.grpc)
        if resp.unknown_ids or resp.rejected_too_old or resp.samples_written + resp.rejected_duplicate != b.samples:
            raise RuntimeError(f"{name} write: unexpected response {resp}")
        if resp.rejected_duplicate:
            duplicates[name] = duplicates.get(name, 0) + resp.rejected_duplicate
    return send

def grpc_senders(stack: AsyncExitStack, servers: dict[str, Server], duplicates: dict[str, int]) -> dict[str, Send]:
    """grpc_sender for each server, each over a WriteStream channel of its own closed with ``stack``."""
    senders: dict[str, Send] = {}
    for name, server in servers.items():
        writer = StreamingBackend(open_channel(server.grpc_address), timeout_s=120)
        stack.push_async_callback(writer.close)
        senders[name] = grpc_sender(writer, duplicates, name)
    return senders



def remote_write_sender(http: aiohttp.ClientSession, server: Server) -> Send:
    async def send(b: Batch) -> None:
        async with http.post(server.url + "/api/v1/write", data=b.remote_write, headers=RW_HEADERS) as resp:
            if resp.status >= 300:
                raise RuntimeError(f"{server.name} remote write: HTTP {resp.status}: {(await resp.text())[:500]}")
    return send


async def send_block(send: Send, batches: list[Batch]) -> None:
    """The block's requests, ``INFLIGHT`` at a time; each request holds other series, so none of
    them sees its samples out of order."""
    sem = asyncio.Semaphore(INFLIGHT)

    async def one(b: Batch) -> None:
        async with sem:
            await send(b)

    await asyncio.gather(*(one(b) for b in batches))


async def ingest(wl: Workload, live: bool, senders: dict[str, Send], servers: dict[str, Server]) -> dict[str, Any]:
    cfg = wl.config
    per_req = cfg.live_series if live else cfg.backfill_series
    cpu0 = {n: server_cpu(servers[n]) for n in senders}
    wall = dict.fromkeys(senders, 0.0)
    samples = 0
    names = list(senders)
    for i, ticks in enumerate(wl.blocks(live)):
        batches = wl.next_block(ticks, per_req)
        samples += sum(b.samples for b in batches)
        for name in names[i % len(names):] + names[:i % len(names)]:
            t0 = time.perf_counter()
            await send_block(senders[name], batches)
            wall[name] += time.perf_counter() - t0
    await asyncio.sleep(3.0)  # background work the writes caused (flushes, merges) lands in this phase
    out: dict[str, Any] = {}
    for n in senders:
        cpu = {role: v - cpu0[n].get(role, 0.0) for role, v in server_cpu(servers[n]).items()}
        out[n] = {"samples": samples, "wall_s": wall[n], "samples_per_s": samples / wall[n],
                  "server_cpu_s": cpu["all"], "cpu_s_per_million": cpu["all"] / samples * 1e6}
        if servers[n].tree:
            out[n]["cpu_s_per_million_by_role"] = {role: v / samples * 1e6 for role, v in cpu.items()}
    return out


async def freshness(wl: Workload, senders: dict[str, Send], servers: dict[str, Server],
                    http: aiohttp.ClientSession) -> dict[str, float]:
    """One more tick in the live shape; per system, seconds from the last acknowledged request to a
    query that sees the newest series' sample. Also a barrier: every earlier sample is visible after.
    Each system first answers the same query for another series, so that the probe times the
    write's way to queryable and not a cold first query (a cluster's first PromQL query took 16 ms
    against 5.6 warm, perf/RESULTS.md)."""
    batches = wl.next_block(1, wl.config.live_series, extra_tick=True)
    at = wl.last_ms

    def probe(series: int) -> Question:
        sel = ",".join(f'{k}="{v}"' for k, v in wl.series[series])
        return Question("probe", "probe", f"count_over_time({{{sel}}}[1s])", at, at, 0, None)  # type: ignore[arg-type]

    q = probe(-1)
    out: dict[str, float] = {}
    for name, send in senders.items():
        await promql_get(http, servers[name].url, probe(0))  # warm
        await send_block(send, batches)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 60:
            body = await promql_get(http, servers[name].url, q)
            if from_prometheus_json(body).get("", {}).get(at) == 1.0:
                break
            await asyncio.sleep(0.005)
        else:
            raise RuntimeError(f"{name}: the newest sample was not queryable after 60 s")
        out[name] = time.perf_counter() - t0
    return out


def _ask(name: str, q: Question, clients: dict[str, MetricsClient], http: aiohttp.ClientSession,
         servers: dict[str, Server]) -> Callable[[], Awaitable[Any]]:
    if name in clients:
        client = clients[name]
        return lambda: client.aggregate(q.aggregate)
    url = servers[server_of(name)].url
    return lambda: promql_get(http, url, q)


async def check_answers(qs: list[Question], systems: list[str], clients: dict[str, MetricsClient],
                        http: aiohttp.ClientSession, servers: dict[str, Server]) -> tuple[dict[str, Any], list[str]]:
    report: dict[str, Any] = {}
    failures: list[str] = []
    for q in qs:
        ref = from_prometheus_json(await promql_get(http, servers["prometheus"].url, q), q.group_label)
        row: dict[str, Any] = {"points": sum(len(v) for v in ref.values())}
        for name in systems:
            if name == "prometheus":
                continue
            raw = await _ask(name, q, clients, http, servers)()
            got = (from_aggregate(raw, q.group_label, q.top) if name in clients
                   else from_prometheus_json(raw, q.group_label))
            c: Comparison = compare_answers(ref, got)
            row[name] = {"max_rel": c.max_rel, "median_rel": c.median_rel, "points": c.points,
                         "missing": c.missing[:10], "extra": c.extra[:10]}
            if name != "victoriametrics" and not c.agrees(RTOL):
                failures.append(f"({q.key}) {name}: max rel. diff {c.max_rel:.3g} over {c.points} points, "
                                f"missing {c.missing[:5]}, extra {c.extra[:5]}; Prometheus: {_short(ref)}, "
                                f"{name}: {_short(got)}")
        report[q.key] = row
    return report, failures


def _short(answer: dict[str, dict[int, float]]) -> str:
    items = [(k, t, v) for k, row in answer.items() for t, v in row.items()]
    return str(items[:3]) + (f" ... ({len(items)} points)" if len(items) > 3 else "")


def profiled(targets: dict[str, Server], folder: Path | None, phase: str) -> AbstractAsyncContextManager[None]:
    """py-spy records each target server while inside, into ``folder/profile_<phase>_<name>.txt``
    (folded stacks), when a folder is given and py-spy is installed (compare_http.profile_pids)."""
    if folder is None:
        return nullcontext()
    pids = {name: s.pid for name, s in targets.items()}
    return profile_pids(pids, lambda name: folder / f"profile_{phase}_{name}.txt")


async def http_phase(res: dict[str, Any], ms: list[dict[str, Any]], wl: Workload, servers: dict[str, Server],
                     http: aiohttp.ClientSession, args: argparse.Namespace, prof: Path | None) -> list[str]:
    """perf/compare_http.py's questions over PromQL HTTP on every system: answers checked against
    Prometheus', then timed with each system's CPU per question; returns the answer failures."""
    at = wl.last_ms + 5_000
    qs = http_questions(at, *wl.question_targets())
    res["http_questions"] = [{"key": q.key, "title": q.title, "promql": q.promql} for q in qs]
    loops = args.event_loop
    systems = [s for n in HTTP_SYSTEMS for s in ([armed(n, loop, loops) for loop in loops]
                                                 if n.startswith("metricsd") else [n]) if server_of(s) in servers]
    urls = {n: servers[server_of(n)].url for n in systems}
    print("checking the HTTP questions' answers against Prometheus ...", flush=True)
    res["http_answers"], failures = await check_http_answers(qs, systems, http, urls, RTOL)
    if failures:
        return failures
    cpu = {n: _cpu_of(servers[server_of(n)]) for n in systems}
    profile = None
    if prof is not None:
        pids: dict[str, int] = {}
        for loop in loops:
            tail = "" if loop == loops[0] else f"_{loop}"
            pids[f"store{tail}"] = servers[armed("metricsd", loop, loops)].pid
            if armed("metricsd-cluster", loop, loops) in servers:
                roles = servers[armed("metricsd-cluster", loop, loops)].pids()
                pids.update({f"cluster_proxy{tail}": roles["proxy"][0], f"cluster_store{tail}": roles["store"][0]})

        def profile(key: str) -> Any:
            if key not in ("1", "b"):
                return None
            return profile_pids(pids, lambda name: prof / f"profile_http_{key}_{name}.txt")

    counters = {n: proxy_counters(urls[n]) for n in systems if servers[server_of(n)].tree}
    ms += await time_http(qs, systems, http, urls, cpu, args.queries, args.warmup, res["concurrency"], profile,
                          counters)
    return []


def idle_rss(servers: dict[str, Server]) -> dict[str, int]:
    """Each server's RSS before it holds any data: what the per-sample growth is counted above."""
    return {n: server_rss(s) for n, s in servers.items()}


def workload_config(args: argparse.Namespace) -> WorkloadConfig:
    end = (time.time_ns() // 1_000_000 // 10_000) * 10_000 - 10_000  # on the 10 s grid, in the past
    base = WorkloadConfig(end_ms=end, ticks=round(args.hours * 360), live_ticks=args.live_ticks)
    return base.scaled(args.scale)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    cfg = workload_config(args)
    wl = Workload(cfg)
    res: dict[str, Any] = {
        "command": " ".join(["perf/compare.py", *sys.argv[1:]]), "cores": os.cpu_count(),
        "python": platform.python_version(), "date": datetime.date.today().isoformat(),
        "metricsd_mode": "one store process, metricsd up --no-simulate --no-consumers",
        "versions": {"metricsd": __version__, "prometheus": package_version("prometheus"),
                     "victoriametrics": package_version("victoria-metrics")},
        "rtol": RTOL, "queries": args.queries, "warmup": args.warmup, "concurrency": [1, 8],
    }
    live_samples = cfg.live_ticks * len(wl.series)
    res["workload"] = {
        "seed": cfg.seed, "pods": cfg.big_pods + cfg.other_pods, "big_pods": cfg.big_pods,
        "other_workloads": cfg.other_workloads, "series": len(wl.series), "hours": cfg.ticks / 360,
        "interval_s": cfg.interval_ms / 1000, "samples": wl.samples, "backfill_samples": wl.samples - live_samples,
        "live_samples": live_samples, "backfill_series": cfg.backfill_series, "backfill_ticks": cfg.backfill_ticks,
        "live_series": cfg.live_series, "start_ms": wl.start_ms, "end_ms": cfg.end_ms,
    }
    prof = HERE / "results" / "profiles" if args.profile else None
    if prof is not None:
        prof.mkdir(parents=True, exist_ok=True)
    loops = args.event_loop
    res["event_loops"] = loops
    with Processes() as procs:
        servers: dict[str, Server] = {}
        for loop in loops:  # every metricsd process of an arm on its loop, children included
            env = {eventloop.ENV: loop}
            name = armed("metricsd", loop, loops)
            servers[name] = procs.start_metricsd(name, data_dir=args.metricsd_data_dir, env=env)
            if not args.no_remote_write:
                name = armed("metricsd-rw", loop, loops)
                servers[name] = procs.start_metricsd(name, env=env)
            if not args.no_cluster:
                name = armed("metricsd-cluster", loop, loops)
                servers[name] = procs.start_metricsd_cluster(name, env=env)
                res["cluster_mode"] = "metricsd cluster up: 3 stores, RF 3, W 2, R 2, 1 proxy, etcd, 1 config server"
        servers["prometheus"] = procs.start_prometheus()
        servers["victoriametrics"] = procs.start_victoria_metrics()
        md = servers["metricsd"]
        ours = {n: s for n, s in servers.items() if n.startswith("metricsd")}
        grpc = {n: s for n, s in servers.items() if n.partition("@")[0] in ("metricsd", "metricsd-cluster")}
        async with AsyncExitStack() as stack:
            clients = {n: await stack.enter_async_context(MetricsClient(s.grpc_address, timeout_s=120))
                       for n, s in grpc.items()}
            client = clients["metricsd"]
            http = await stack.enter_async_context(aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64), timeout=aiohttp.ClientTimeout(total=300)))
            for n in clients:
                if n.startswith("metricsd-cluster"):
                    await wait_cluster_ready(clients[n], n)
            check_loops(servers, loops)
            duplicates: dict[str, int] = res.setdefault("duplicates_reported", {})
            senders = grpc_senders(stack, grpc, duplicates)
            senders.update({n: remote_write_sender(http, s) for n, s in servers.items() if n not in clients})
            ms: list[dict[str, Any]] = []
            idle = idle_rss(servers)
            for shape, live in (("backfill", False), ("live", True)):
                print(f"ingest, {shape} shape ...", flush=True)
                async with profiled(ours, prof, f"ingest_{shape}"):
                    phase = await ingest(wl, live, senders, servers)
                for n, r in phase.items():
                    ms.append(measure(n, f"ingest.{shape}.samples_per_s", r["samples_per_s"], "samples/s"))
                    ms.append(measure(n, f"ingest.{shape}.cpu_s_per_million", r["cpu_s_per_million"], "CPU s"))
                    for role, v in r.get("cpu_s_per_million_by_role", {}).items():
                        if role in ("proxy", "store"):
                            ms.append(measure(n, f"ingest.{shape}.{role}_cpu_s_per_million", v, "CPU s"))
                res[f"ingest_{shape}"] = phase
            print("freshness probe ...", flush=True)
            for n, secs in (await freshness(wl, senders, servers, http)).items():
                ms.append(measure(n, "freshness.ms", secs * 1000, "ms"))
            st = await client.stats()
            samples = wl.samples + len(wl.series)
            for n, s in servers.items():
                rss = server_rss(s)
                ms += [measure(n, "memory.rss_mib", rss / 2**20, "MiB"),
                       measure(n, "memory.rss_bytes_per_series", rss / len(wl.series), "bytes"),
                       measure(n, "memory.rss_bytes_per_sample", rss / samples, "bytes"),
                       measure(n, "memory.idle_rss_mib", idle[n] / 2**20, "MiB"),
                       measure(n, "memory.growth_bytes_per_sample", (rss - idle[n]) / samples, "bytes")]
            ms.append(measure("metricsd", "memory.chunk_bytes_per_sample", st.bytes_per_sample, "bytes"))
            res["metricsd_stats"] = {"series": st.series, "samples": st.samples, "chunk_bytes": st.chunk_bytes}
            at = wl.last_ms + 5_000
            qs = questions(at, *wl.question_targets())
            res["questions"] = [{"key": q.key, "title": q.title, "promql": q.promql} for q in qs]
            print("checking answers against Prometheus ...", flush=True)
            ours_first = [armed(n, loop, loops) for loop in loops for n in ("metricsd", "metricsd-promql")]
            systems = [*ours_first, *(n for n in servers if n.partition("@")[0] != "metricsd")]
            res["answers"], failures = await check_answers(qs, systems, clients, http, servers)
            res["measures"] = ms
            if failures:
                res["failures"] = failures
                return res
            timed = [*ours_first, *(n for n in clients if n.startswith("metricsd-cluster")),
                     "prometheus", "victoriametrics"]
            for q in qs:
                async with profiled({"metricsd": md}, prof, f"query_{q.key}"):
                    for c in res["concurrency"]:
                        print(f"timing ({q.key}) at concurrency {c} ...", flush=True)
                        calls = {n: _ask(n, q, clients, http, servers) for n in timed}
                        times = await interleaved(calls, args.queries, c, args.warmup)
                        for n, t in times.items():
                            pct = summarise(t)
                            ms += [measure(n, f"query.{q.key}.c{c}.p50_ms", pct["p50_ms"], "ms"),
                                   measure(n, f"query.{q.key}.c{c}.p99_ms", pct["p99_ms"], "ms")]
            if not args.no_http_questions:
                failures = await http_phase(res, ms, wl, servers, http, args, prof)
                if failures:
                    res["failures"] = failures
                    res["measures"] = ms
                    return res
            for n, s in servers.items():
                ms.append(measure(n, "memory.peak_rss_mib", server_rss(s, peak=True) / 2**20, "MiB"))
            for n in ("prometheus", "victoriametrics", *(["metricsd"] if args.metricsd_data_dir else [])):
                ms.append(measure(n, "disk.bytes_per_sample", servers[n].disk_bytes() / samples, "bytes"))
                ms.append(measure(n, "disk.mib", servers[n].disk_bytes() / 2**20, "MiB"))
    res["ratios"] = ratios(ms)
    if len(loops) > 1:
        res["event_loop_ab"] = loop_ab(ms, loops)
    res["duration_s"] = time.monotonic() - started
    return res


def _loops(text: str) -> list[str]:
    loops = [w.strip().lower() for w in text.split(",") if w.strip()]
    if not loops or len(set(loops)) != len(loops) or not set(loops) <= {"asyncio", "uvloop"}:
        raise argparse.ArgumentTypeError(f"{text!r}: asyncio, uvloop or asyncio,uvloop")
    return loops


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a fifth of the pods, 60 queries (about 1.5 min)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the pods (1.0: 10,000 pods, 40,000 series)")
    p.add_argument("--hours", type=float, default=2.0, help="hours of data at 10 s")
    p.add_argument("--live-ticks", type=int, default=60, help="the last ticks go in the live shape")
    p.add_argument("--queries", type=int, help="timed queries per system, question and concurrency (200; --quick 60)")
    p.add_argument("--warmup", type=int, help="untimed queries first (20; --quick 10)")
    p.add_argument("--no-remote-write", action="store_true", help="skip the metricsd fed by remote write")
    p.add_argument("--no-cluster", action="store_true", help="skip the metricsd cluster (3 stores, RF 3, a proxy)")
    p.add_argument("--no-http-questions", action="store_true",
                   help="skip the dashboard's questions over PromQL HTTP (perf/compare_http.py)")
    p.add_argument("--profile", action="store_true",
                   help="record the metricsd server with py-spy (raw folded stacks in perf/results/)")
    p.add_argument("--no-write", action="store_true", help="print the section; leave RESULTS.md alone")
    p.add_argument("--event-loop", type=_loops, default=[eventloop.DEFAULT], metavar="LOOP[,LOOP]",
                   help=f"metricsd's processes' event loop ({eventloop.ENV}): asyncio or uvloop, default "
                        f"{eventloop.DEFAULT}; two (asyncio,uvloop) start every metricsd system once per loop and "
                        "time both arms interleaved in one run (an A/B table, perf/results/event_loop_ab.md; "
                        "RESULTS.md's section is left alone)")
    p.add_argument("--metricsd-data-dir", action="store_true",
                   help="the one-store metricsd keeps a WAL and snapshots (its data directory is measured, its "
                        "ingest CPU then includes the WAL's)")
    args = p.parse_args()
    if args.quick:
        args.scale, args.live_ticks = min(args.scale, 0.2), 30
    args.queries = args.queries or (60 if args.quick else 200)
    args.warmup = args.warmup if args.warmup is not None else (10 if args.quick else 20)
    ensure_installed()
    res = asyncio.run(run(args))
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "latest.json").write_text(json.dumps(res, indent=1))
    if res.get("failures"):
        print("ANSWERS DIFFER FROM PROMETHEUS; no timings reported:", file=sys.stderr)
        for f in res["failures"]:
            print("  " + f, file=sys.stderr)
        return 1
    latency_chart(res, out / "compare_latency.png")
    section = markdown(res)
    print(section)
    if res.get("event_loop_ab"):
        (out / "event_loop_ab.md").write_text("\n".join(res["event_loop_ab"]) + "\n")
        print("\n".join(res["event_loop_ab"]))
    elif not args.no_write:
        path = HERE / "RESULTS.md"
        path.write_text(replace_section(path.read_text(), section))
    return 0


if __name__ == "__main__":
    sys.exit(main())
