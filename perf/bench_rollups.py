"""What a read of hourly rollups costs, in process: the consumers' and the Parquet writer's shapes.

A store of ``--series`` series of the side-by-side workload (10 s samples, written in the backfill
shape as bench_memory writes them) over ``--hours`` hours with raw retention ``--retention-hours``
(a retention pass after each hour, so the older hours are past the raw chunks), then
``Store.rollup_points`` timed for:

- ``one pod, an hour a day ago``: the HPA's "same hour yesterday" (the pod's series, one hour);
- ``one pod, every hour``: the overcommit advisor's weekly peaks of one pod;
- ``a workload, every hour``: the same over the `big` Deployment's CPU series;
- ``everything, the newest closed hour``: the hourly Parquet writer;
- ``everything, every hour``: a whole-store weekly read.

The process CPU of the first read and the median of the ``--repeat`` - 1 after it, and the
rollups' resident bytes. Run the
same command under another checkout's ``PYTHONPATH`` for an A/B (perf/RESULTS.md, "Issue 25: a
day, 200,000 series, and the read path").

    .venv/bin/python perf/bench_rollups.py --series 10000 --hours 48 --retention-hours 24
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

HOUR_MS = 3_600_000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--series", type=int, default=10_000)
    p.add_argument("--hours", type=int, default=48)
    p.add_argument("--retention-hours", type=float, default=24.0)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()

    import numpy as np
    from compare_workload import Workload, WorkloadConfig

    from metricsd.selector import Matcher, MatchOp
    from metricsd.store.engine import Store
    from metricsd.store.settings import StoreSettings

    ticks = args.hours * 360
    wl = Workload(WorkloadConfig(ticks=ticks, live_ticks=0).scaled(args.series / 40_000))
    labels = wl.series
    ids = wl.source.series_ids.astype(np.uint64)
    n = len(labels)
    store = Store(StoreSettings(retention_ms=int(args.retention_hours * HOUR_MS)))
    sent = 0
    first = True
    cpu0 = time.process_time()
    while sent < ticks:
        k = min(60, ticks - sent)
        stamps, values = wl.sim.block(k)
        stamps = np.asarray(stamps, np.int64)
        values = np.ascontiguousarray(values[:, wl.source.cols].T)
        for s0 in range(0, n, 1000):
            s1 = min(s0 + 1000, n)
            new = {int(i): labels[j] for j, i in zip(range(s0, s1), ids[s0:s1].tolist(), strict=True)} \
                if first else None
            store.write(ids[s0:s1], np.full(s1 - s0, k), np.tile(stamps, s1 - s0), values[s0:s1].reshape(-1), new)
        first = False
        sent += k
        if sent % 360 == 0:
            store.gc()
    ingest = time.process_time() - cpu0
    print(f"ingested in {ingest:.1f} CPU s", file=sys.stderr, flush=True)
    newest = int(store.max_ts)
    closed = newest // HOUR_MS * HOUR_MS - HOUR_MS
    pod = dict(labels[0])
    one_pod = [Matcher.eq("namespace", pod["namespace"]), Matcher.eq("pod", pod["pod"])]
    cpu_big = [Matcher.eq("__name__", "container_cpu_usage_seconds_total"), Matcher.eq("workload", "big")]
    every = [Matcher(MatchOp.RE, "pod", ".+")]
    cases = [
        ("one pod, an hour a day ago", one_pod, closed - 24 * HOUR_MS, closed - 24 * HOUR_MS),
        ("one pod, every hour", one_pod, 0, newest),
        ("a workload (big, cpu), every hour", cpu_big, 0, newest),
        ("everything, the newest closed hour", every, closed, closed),
        ("everything, every hour", every, 0, newest),
    ]
    out = []
    for name, matchers, start, end in cases:
        times = []
        for _ in range(args.repeat):
            c0 = time.process_time()
            got = store.rollup_points(matchers, start, end)
            times.append(time.process_time() - c0)
        points = sum(len(p.hour) for _, _, p in got)
        out.append({"case": name, "series": len(got), "points": points, "first_cpu_ms": times[0] * 1e3,
                    "cpu_ms": statistics.median(times[1:] or times) * 1e3})
        print(f"  {name}: {out[-1]['first_cpu_ms']:,.1f} / {out[-1]['cpu_ms']:,.1f} ms", file=sys.stderr, flush=True)
    stored = store.rollups.nbytes
    print(f"{n:,} series x {args.hours} h (raw retention {args.retention_hours} h): ingest "
          f"{ingest / (n * ticks) * 1e6:.2f} CPU s / M in process, rollups hold {stored / n:,.0f} bytes a series")
    print("| read | series | points | CPU ms, first read | CPU ms, median of the later ones |\n|---|---|---|---|---|")
    for r in out:
        print(f"| {r['case']} | {r['series']:,} | {r['points']:,} | {r['first_cpu_ms']:,.1f} | {r['cpu_ms']:,.1f} |")
    print(json.dumps({"rollup_bytes_per_series": stored / n, "cases": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
