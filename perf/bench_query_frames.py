"""What a store spends on a whole query's QUERY frame (issue 23 through the cluster), asked the two
ways a proxy may ask: the same store every time, or the three stores in turn. A cluster (``metricsd
cluster up --plaintext``: 3 stores, RF 3) is fed perf/compare_workload.py's seeded workload, then
(b), rate() of one pod's counter over an hour at a 30 s step, is sent as QUERY frames straight to
the stores' read ports (no proxy, no HTTP), one after another, the two ways alternated for several
rounds; each row is the stores' CPU per frame (all three summed, from /proc) and the wall per frame.

    .venv/bin/python perf/bench_query_frames.py                  # 500 pods x 1 h, 2,000 frames, 3 rounds
    .venv/bin/python perf/bench_query_frames.py --frames 5000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import grpc_sender, ingest, wait_cluster_ready
from compare_http import http_questions
from compare_peers import Processes
from compare_workload import Workload, WorkloadConfig
from procstat import cpu_seconds

from metricsd.promql.limits import QueryLimits
from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import MetricsClient, StreamingBackend
from metricsd.rpc.frames import Method
from metricsd.rpc.readport_client import ReadPortClient
from metricsd.rpc.wholequery import LIMIT_NAMES, QueryFrame, RunnerSettings, encode_request


def _grpc_port(pid: int) -> int:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return int(argv[argv.index("--grpc-port") + 1])


async def run(args: argparse.Namespace) -> dict[str, Any]:
    end = (time.time_ns() // 1_000_000 // 10_000) * 10_000 - 10_000
    wl = Workload(WorkloadConfig(end_ms=end, ticks=round(args.hours * 360), live_ticks=10).scaled(args.scale))
    out: dict[str, Any] = {"command": " ".join(["perf/bench_query_frames.py", *sys.argv[1:]]),
                           "load_before": os.getloadavg(), "rows": []}
    with Processes() as procs:
        cluster = procs.start_metricsd_cluster()
        async with MetricsClient(cluster.grpc_address) as c:
            await wait_cluster_ready(c, cluster.name)
        writer = StreamingBackend(open_channel(cluster.grpc_address), timeout_s=120)
        try:
            senders = {cluster.name: grpc_sender(writer, {}, cluster.name)}
            print(f"feeding {wl.samples:,} samples of {len(wl.series):,} series ...", flush=True)
            await ingest(wl, False, senders, {cluster.name: cluster})
            await ingest(wl, True, senders, {cluster.name: cluster})
        finally:
            await writer.close()
        at = wl.last_ms + 5_000
        q = next(q for q in http_questions(at, *wl.question_targets()) if q.key == "b")
        limits = QueryLimits()
        settings = RunnerSettings(300_000, 50_000_000, True, 120.0,
                                  tuple((k, int(getattr(limits, k))) for k in LIMIT_NAMES))
        body = encode_request(QueryFrame(q.promql, False, q.start_ms, q.end_ms, q.step_ms, 120.0, 64, None, settings))
        pids = cluster.pids()["store"]
        clients: list[ReadPortClient] = []
        for pid in pids:
            async with MetricsClient(f"127.0.0.1:{_grpc_port(pid)}") as c:
                health = await c.health()
            clients.append(ReadPortClient("127.0.0.1", health.read_port))
        try:
            for rc in clients:  # each store answers (and parses the query) before any timing
                assert (await rc.call_raw(Method.QUERY, body))[:1] == b"\x00"
            for r in range(args.rounds):
                for mode in ("same store", "in turn"):
                    before = [cpu_seconds(p) for p in pids]
                    t0 = time.perf_counter()
                    for i in range(args.frames):
                        await clients[0 if mode == "same store" else i % len(clients)].call_raw(Method.QUERY, body)
                    wall = time.perf_counter() - t0
                    spent = [cpu_seconds(p) - b for p, b in zip(pids, before, strict=True)]
                    row = {"round": r, "mode": mode, "wall_ms": wall / args.frames * 1000,
                           "store_cpu_ms": sum(spent) / args.frames * 1000,
                           "per_store_cpu_ms": [s / args.frames * 1000 for s in spent]}
                    out["rows"].append(row)
                    print(json.dumps(row), flush=True)
        finally:
            for rc in clients:
                await rc.close()
    out["load_after"] = os.getloadavg()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=0.05, help="of compare.py's 10,000 pods (default 0.05)")
    p.add_argument("--hours", type=float, default=1.0)
    p.add_argument("--frames", type=int, default=2000, help="per way and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "bench_query_frames.json"))
    args = p.parse_args()
    res = asyncio.run(run(args))
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"load average before {res['load_before']}, after {res['load_after']}")
    for mode in ("same store", "in turn"):
        rows = [r for r in res["rows"] if r["mode"] == mode]
        cpu = ", ".join(f"{r['store_cpu_ms']:.2f}" for r in rows)
        wall = ", ".join(f"{r['wall_ms']:.2f}" for r in rows)
        print(f"{mode:10}: store CPU ms a frame {cpu}; wall ms {wall}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
