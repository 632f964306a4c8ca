"""Whole-process RSS of one store server on the side-by-side workload, without the hour-long
side-by-side run (a documented command, not a test).

    .venv/bin/python perf/bench_rss_server.py --scale 5 --vm --data-dir   # 200,000 series, ~20 min
    .venv/bin/python perf/bench_rss_server.py --scale 0.5                 # 20,000 series, ~2 min
    .venv/bin/python perf/bench_rss_server.py --scale 1 --data-dir --snapshot-every 60   # snapshots in the ingest

perf/compare.py measures RSS beside Prometheus and VictoriaMetrics, then times every question on
all of them (about an hour at ``--scale 5`` on a 2-core machine, most of it Prometheus' ingest
and the timings). This feeds the same seeded workload (perf/compare_workload.py), in the same
batches and shapes (backfill, then the agents' live shape), to a `metricsd up --no-simulate
--no-consumers` process and, with ``--vm``, to VictoriaMetrics by remote write, through
compare.py's own senders; then it reads each server's RSS every 15 s for ``--settle`` seconds
(the store trims its heap once a minute), and splits the store's resident memory by mapping
(/proc/<pid>/smaps: the heap, anonymous mappings such as the rings' arrays past the mmap
threshold, and shared libraries). Each reading also splits the RSS as the kernel does (RssAnon,
RssFile, RssShmem of /proc/<pid>/status): with a data directory the store's chunk slabs are file
pages (metricsd/store/slabfiles.py), reclaimable page cache as VictoriaMetrics' data files are,
so the files' size on disk and how much of them is in the page cache (fincore) are reported
beside each server's data directory size. With ``--questions N`` the HTTP questions of issue 23
(compare_http.py: 1, (b), (c), (a), (d)) are then asked N times each of the store, and the RSS
read right after (pages the reads faulted back in) and again after ``--after-questions`` seconds
(a retention pass drops them from the resident set again). bench_memory.py measures a Store in process; its figure at
large scales is not the server's (its generator's freed memory is reused by the store).
For an A/B, run it with another commit's package first on the path (``git archive <commit> |
tar -x -C /tmp/base``, then ``PYTHONPATH=/tmp/base .venv/bin/python perf/bench_rss_server.py``).
Writes ``--json`` (default perf/results/bench_rss_server.json) and prints what it measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
from bench_idle_rss import evict_libraries
from compare import Send, grpc_sender, idle_rss, ingest, remote_write_sender, server_rss, workload_config
from compare_http import http_questions
from compare_peers import Processes, Server
from compare_queries import promql_get
from compare_workload import Workload
from procstat import mappings_kib, status_kib

from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import MetricsClient, StreamingBackend

HERE = Path(__file__).resolve().parent
RSS_KINDS = ("RssAnon", "RssFile", "RssShmem")


def rss_split_mib(server: Server) -> dict[str, float]:
    """RssAnon, RssFile and RssShmem of the server's processes, MiB."""
    out = dict.fromkeys(RSS_KINDS, 0.0)
    for pids in server.pids().values():
        for pid in pids:
            for key, kib in status_kib(pid, RSS_KINDS).items():
                out[key] += kib / 1024
    return out


def tree_mib(where: Path) -> dict[str, float]:
    """A directory's files: apparent size and blocks allocated on disk, MiB (0 if missing)."""
    size = blocks = 0
    if where.is_dir():
        for f in where.rglob("*"):
            if f.is_file():
                st = f.stat()
                size, blocks = size + st.st_size, blocks + st.st_blocks * 512
    return {"size": size / 2**20, "on_disk": blocks / 2**20}


def cached_mib(where: Path) -> float:
    """How much of the files under ``where`` is in the page cache (util-linux fincore), MiB; -1 without it."""
    files = [str(f) for f in where.rglob("*") if f.is_file()] if where.is_dir() else []
    if not files:
        return 0.0
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", *files],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return -1.0
    return sum(int(x) for x in out.split()) / 2**20


def disk_report(servers: dict[str, Server]) -> dict[str, Any]:
    """Each server's data directory (size, on disk, in the page cache) and metricsd's chunk files."""
    out: dict[str, Any] = {}
    for n, s in servers.items():
        out[n] = {"data_dir_mib": tree_mib(s.data_dir), "data_dir_cached_mib": cached_mib(s.data_dir)}
    chunks = servers["metricsd"].data_dir / "chunks"
    out["metricsd"]["chunk_files_mib"] = tree_mib(chunks)
    out["metricsd"]["chunk_files_cached_mib"] = cached_mib(chunks)
    out["metricsd"]["files_mib"] = files_mib(servers["metricsd"].data_dir)
    return out


def files_mib(where: Path) -> dict[str, Any]:
    """The store's data directory part by part: each WAL segment and snapshot (name: MiB), the chunk files summed."""
    out: dict[str, Any] = {}
    for part in ("wal", "snapshots"):
        d = where / part
        out[part] = {f.name: round(f.stat().st_size / 2**20, 1) for f in sorted(d.iterdir())} if d.is_dir() else {}
        out[f"{part}_mib"] = round(sum(out[part].values()), 1)
    d = where / "chunks"
    slabs = [f.stat().st_size for f in d.iterdir()] if d.is_dir() else []
    out["chunk_files"], out["chunk_files_mib"] = len(slabs), round(sum(slabs) / 2**20, 1)
    return out


def reading(servers: dict[str, Server]) -> dict[str, Any]:
    return {n: {"rss": server_rss(s) / 2**20, **rss_split_mib(s)} for n, s in servers.items()}


def show(r: dict[str, Any]) -> str:
    return str({n: {k: round(v, 1) for k, v in x.items()} for n, x in r.items()})


async def ask_questions(wl: Workload, server: Server, times: int) -> dict[str, float]:
    """Issue 23's HTTP questions, ``times`` each, of one server; seconds each took in all."""
    qs = http_questions(wl.last_ms + 5_000, *wl.question_targets())
    took: dict[str, float] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        for q in qs:
            t0 = time.perf_counter()
            for _ in range(times):
                await promql_get(http, server.url, q)
            took[q.key] = time.perf_counter() - t0
    return took


async def run(a: argparse.Namespace) -> dict[str, Any]:
    wl = Workload(workload_config(a))
    out: dict[str, Any] = {"scale": a.scale, "series": len(wl.series), "samples": wl.samples,
                           "data_dir": a.data_dir, "snapshot_every_s": a.snapshot_every}
    with Processes() as procs:
        servers = {"metricsd": procs.start_metricsd(data_dir=a.data_dir, snapshot_every_s=a.snapshot_every)}
        if a.vm:
            servers["victoriametrics"] = procs.start_victoria_metrics()
        await asyncio.sleep(3)
        out["idle_mib"] = {n: v / 2**20 for n, v in idle_rss(servers).items()}
        print("idle RSS, MiB", out["idle_mib"], flush=True)
        writer = StreamingBackend(open_channel(servers["metricsd"].grpc_address), timeout_s=120)
        try:
            async with aiohttp.ClientSession() as http:
                senders: dict[str, Send] = {"metricsd": grpc_sender(writer, {}, "metricsd")}
                if a.vm:
                    senders["victoriametrics"] = remote_write_sender(http, servers["victoriametrics"])
                for shape, live in (("backfill", False), ("live", True)):
                    out[shape] = await ingest(wl, live, senders, servers)
                    out[f"rss_after_{shape}_mib"] = {n: server_rss(s) / 2**20 for n, s in servers.items()}
                    print(shape, "CPU s / M", {n: round(v["cpu_s_per_million"], 3) for n, v in out[shape].items()},
                          "RSS, MiB", out[f"rss_after_{shape}_mib"], flush=True)
        finally:
            await writer.close()
        out["peak_rss_mib"] = {n: server_rss(s, peak=True) / 2**20 for n, s in servers.items()}
        trace = []
        for i in range(a.settle // 15 + 1):
            if i:
                await asyncio.sleep(15)
            trace.append(reading(servers))
            print(f"+{i * 15} s RSS, MiB", show(trace[-1]), flush=True)
        out["rss_trace_mib"] = trace
        out["disk"] = disk_report(servers)
        print("disk, MiB", out["disk"], flush=True)
        maps = mappings_kib(servers["metricsd"].pid)
        out["metricsd_mappings_mib"] = [(n, kib / 1024) for n, kib in maps[:16]]
        out["metricsd_anon_heap_mib"] = sum(k for n, k in maps if n in ("[anon]", "[heap]")) / 1024
        print("store mappings (largest), MiB", [(n, round(k / 1024)) for n, k in maps[:12]], flush=True)
        async with MetricsClient(servers["metricsd"].grpc_address) as client:
            st = await client.stats()
            out["chunk_bytes_per_sample"] = st.bytes_per_sample
        if a.questions:
            out["questions_s"] = await ask_questions(wl, servers["metricsd"], a.questions)
            out["rss_after_questions_mib"] = reading(servers)
            out["disk_after_questions"] = disk_report(servers)
            print("questions, s", out["questions_s"], "RSS, MiB", show(out["rss_after_questions_mib"]), flush=True)
            await asyncio.sleep(a.after_questions)
            out["rss_after_questions_later_mib"] = reading(servers)
            print(f"+{a.after_questions} s RSS, MiB", show(out["rss_after_questions_later_mib"]), flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=5.0, help="compare.py's --scale (5: 200,000 series)")
    p.add_argument("--hours", type=float, default=2.0)
    p.add_argument("--live-ticks", type=int, default=60)
    p.add_argument("--vm", action="store_true", help="VictoriaMetrics beside it, fed by remote write")
    p.add_argument("--data-dir", action="store_true", help="the store keeps a WAL and snapshots")
    p.add_argument("--snapshot-every", type=float, default=None, metavar="SECONDS",
                   help="with --data-dir, the store's snapshot interval (default its own, 10 minutes: at --scale "
                        "1 the ingest is over before the first; the peak is then the ingest's)")
    p.add_argument("--settle", type=int, default=90, help="seconds of RSS readings after the ingest")
    p.add_argument("--questions", type=int, default=0, metavar="N",
                   help="after the settle, ask issue 23's HTTP questions N times each of the store, RSS read after")
    p.add_argument("--after-questions", type=int, default=75, metavar="SECONDS",
                   help="with --questions, the RSS read again this long after (a retention pass in it)")
    p.add_argument("--json", type=Path, default=HERE / "results" / "bench_rss_server.json")
    p.add_argument("--evict-libraries", action="store_true",
                   help="drop this venv's shared objects from the page cache first: a venv installed minutes "
                        "before maps them as large folios, +13 MiB of RssFile (perf/bench_idle_rss.py)")
    a = p.parse_args()
    if a.evict_libraries:
        print(evict_libraries(), "shared objects dropped from the page cache", flush=True)
    started = time.monotonic()
    out = asyncio.run(run(a))
    out["evicted_libraries"] = a.evict_libraries
    out["wall_s"] = time.monotonic() - started
    a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
