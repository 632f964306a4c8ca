"""Benchmark of the Prometheus remote write receiver (``POST /api/v1/write``); a documented command,
not a test.

    .venv/bin/python perf/bench_remote_write.py                 # 1,000 pods (4,000 series)
    .venv/bin/python perf/bench_remote_write.py --pods 400      # quicker
    .venv/bin/python perf/bench_remote_write.py --profile       # plus a py-spy profile of the server

Starts a separate ``metricsd up --no-simulate --no-consumers`` process (one in-memory store, the
HTTP API on 127.0.0.1) and feeds it the remote write 1.0 bodies of perf/compare_workload.py
(snappy block of a ``prometheus.WriteRequest`` built with metricsd/proto/prometheus_remote_pb2,
labels with every series, as Prometheus sends them), 4 requests in flight, in both shapes:

- backfill: 1,000 series x 60 samples a request (``--backfill-ticks`` ticks of every series);
- live: 2,000 series x 1 sample a request (``--live-ticks`` ticks), the series already known.

Bodies are built before the clock starts, so the client's cost is not counted. Prints the server's
CPU seconds (utime + stime from /proc) per million samples and samples/s for each shape; the peers'
figures to compare with are in perf/RESULTS.md (Prometheus 0.70 / 6.59, VictoriaMetrics 0.49 / 2.22).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_peers import Processes, Server
from compare_workload import Workload, WorkloadConfig
from procstat import cpu_seconds, rss_bytes

RW_HEADERS = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
              "X-Prometheus-Remote-Write-Version": "0.1.0"}


async def _send_all(url: str, bodies: list[bytes], in_flight: int) -> None:
    queue = iter(bodies)
    async with aiohttp.ClientSession() as http:

        async def sender() -> None:
            for body in queue:
                async with http.post(url + "/api/v1/write", data=body, headers=RW_HEADERS) as resp:
                    if resp.status != 204:
                        raise RuntimeError(f"remote write answered {resp.status}: {await resp.text()}")

        await asyncio.gather(*(sender() for _ in range(in_flight)))


def _bodies(work: Workload, live: bool) -> tuple[list[bytes], int]:
    cfg = work.config
    out: list[bytes] = []
    samples = 0
    for ticks in work.blocks(live):
        for b in work.next_block(ticks, cfg.live_series if live else cfg.backfill_series):
            out.append(b.remote_write)
            samples += b.samples
    return out, samples


def _measure(server: Server, name: str, bodies: list[bytes], samples: int, in_flight: int) -> dict[str, float]:
    cpu0, t0 = cpu_seconds(server.proc.pid), time.perf_counter()
    asyncio.run(_send_all(server.url, bodies, in_flight))
    cpu1, t1 = cpu_seconds(server.proc.pid), time.perf_counter()
    row = {"requests": len(bodies), "samples": samples, "cpu_s": cpu1 - cpu0,
           "cpu_s_per_million": (cpu1 - cpu0) / samples * 1e6, "samples_per_s": samples / (t1 - t0)}
    print(f"{name:9} {len(bodies):5d} requests {samples:10,d} samples  {row['cpu_s']:7.2f} CPU s  "
          f"{row['cpu_s_per_million']:6.2f} CPU s per million  {row['samples_per_s']:12,.0f} samples/s", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=1000, help="simulated pods (4 series each)")
    ap.add_argument("--backfill-ticks", type=int, default=240, help="ticks sent in the backfill shape")
    ap.add_argument("--live-ticks", type=int, default=120, help="ticks sent in the live shape")
    ap.add_argument("--in-flight", type=int, default=4, help="requests in flight")
    ap.add_argument("--profile", action="store_true", help="record the server with py-spy (folded stacks)")
    args = ap.parse_args()
    base = WorkloadConfig()
    cfg = WorkloadConfig(big_pods=args.pods // 2, other_pods=args.pods - args.pods // 2,
                         other_workloads=max(1, args.pods // 100), nodes=max(1, args.pods // 100),
                         ticks=args.backfill_ticks + args.live_ticks, live_ticks=args.live_ticks,
                         backfill_ticks=min(base.backfill_ticks, args.backfill_ticks))
    work = Workload(cfg)
    print(f"building bodies for {len(work.series):,d} series ...", flush=True)
    backfill = _bodies(work, live=False)
    live = _bodies(work, live=True)
    with Processes() as procs:
        server = procs.start_metricsd()
        spy = None
        if args.profile:
            exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            out = Path(__file__).resolve().parent / "results" / "profiles" / "profile_bench_remote_write.txt"
            spy = subprocess.Popen([exe, "record", "--pid", str(server.proc.pid), "--rate", "200", "--format", "raw",
                                    "--nonblocking", "--output", str(out)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        _measure(server, "backfill", *backfill, args.in_flight)
        _measure(server, "live", *live, args.in_flight)
        print(f"server RSS {rss_bytes(server.proc.pid) / 2**20:.0f} MiB", flush=True)
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            spy.wait(timeout=60)
            print(f"profile: {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
