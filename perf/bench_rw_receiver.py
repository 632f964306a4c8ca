"""One store's remote-write receiver in process: process CPU a live request, decode to stored (a
documented command, not a test).

    .venv/bin/python perf/bench_rw_receiver.py                         # this tree
    PYTHONPATH=/tmp/base .venv/bin/python perf/bench_rw_receiver.py    # a `git archive` of another commit

Builds perf/compare_workload.py's pod workload (``--pods``, 4 series a pod), feeds a store in this
process (Store, StoreAPI, LocalBackend, RemoteWriteReceiver: no HTTP, no socket) its backfill
bodies (timing each: the first block learns the series, the second reads cached ones), then times
``RemoteWriteReceiver.ingest`` of each live body (``--live-series`` series x 1
sample, the bodies Prometheus sends) with ``time.process_time``: min and median per request and
the total per million samples, split into decode (snappy, scan) and the rest (prepare, store
write) for the live phase. Process CPU, not wall time; run A and B alternately on a loaded machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_workload import Workload, WorkloadConfig
from prometheus_client import CollectorRegistry

from metricsd.http.remote_write import RemoteWriteReceiver, decode_body
from metricsd.http.selfmetrics import SelfMetrics
from metricsd.http.settings import HttpSettings
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store


async def run(args: argparse.Namespace) -> None:
    pods = args.pods
    end = (time.time_ns() // 1_000_000 // 10_000) * 10_000 - 10_000
    cfg = WorkloadConfig(big_pods=pods // 2, other_pods=pods - pods // 2, other_workloads=max(1, min(100, pods // 100)),
                         nodes=max(1, pods // 100), ticks=args.backfill_ticks + args.live_ticks,
                         live_ticks=args.live_ticks, end_ms=end)
    wl = Workload(cfg)
    rx = RemoteWriteReceiver(LocalBackend(StoreAPI(Store())), HttpSettings(access_log=False),
                             SelfMetrics(CollectorRegistry()))
    back: list[float] = []
    for ticks in wl.blocks(False):
        for b in wl.next_block(ticks, cfg.backfill_series):
            t0 = time.process_time()
            await rx.ingest(b.remote_write)
            back.append(time.process_time() - t0)
    half = len(back) // 2  # the first block learns every series, the second reads cached ones
    print(f"backfill: {len(back)} requests of {cfg.backfill_series} series x {cfg.backfill_ticks} samples; "
          f"first block median {statistics.median(back[:half]) * 1e3:.2f} ms, the rest median "
          f"{statistics.median(back[half:]) * 1e3:.2f} ms a request", flush=True)
    bodies = [b.remote_write for ticks in wl.blocks(True) for b in wl.next_block(ticks, args.live_series)]
    samples = args.live_series * len(bodies)
    per: list[float] = []
    decode: list[float] = []
    for body in bodies:
        t0 = time.process_time()
        decode_body(body, rx.settings.max_decompressed_bytes, rx.settings.request_limits, rx.cache)
        t1 = time.process_time()
        await rx.ingest(body)
        t2 = time.process_time()
        decode.append(t1 - t0)
        per.append(t2 - t1)
    print(f"live: {len(bodies)} requests of {args.live_series} series; ingest min {min(per) * 1e3:.3f} median "
          f"{statistics.median(per) * 1e3:.3f} ms a request, {sum(per) / samples * 1e6:.3f} CPU s per million; "
          f"decode alone min {min(decode) * 1e3:.3f} median {statistics.median(decode) * 1e3:.3f} ms", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=10_000)
    ap.add_argument("--backfill-ticks", type=int, default=120, help="two blocks of 60")
    ap.add_argument("--live-ticks", type=int, default=30)
    ap.add_argument("--live-series", type=int, default=2000)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
