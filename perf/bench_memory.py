"""Where a store's memory goes, per series and per sample (a documented command, not a test).

    .venv/bin/python perf/bench_memory.py              # 10,000 series: 2 h and a day at 10 s
    .venv/bin/python perf/bench_memory.py --series 40000 --hours 2

Each case runs in a fresh process: it generates the side-by-side workload's samples
(perf/compare_workload.py, scaled to ``--series``) first, then feeds them to a Store in memory in
the backfill shape (1,000 series x 60 samples a batch), so that the RSS it reports grew with the
store alone: no gRPC buffers, no interpreter start-up. It splits that growth into the head's
arrays (the rings of raw samples and the per-series columns of the chunks), the compressed
chunks' bytes and the rest (index, labels, rollups, per-series objects, allocator slack), and
counts live Python objects. It reports the growth right after ingest and once more after
``malloc_trim`` (settled: what a running store holds after its retention loop's once-a-minute
trim; the pages each block's copy of its open chunk frees stay resident until then).
perf/compare.py measures the whole server process beside
Prometheus and VictoriaMetrics; this is the tool for changing the layout.
Writes perf/results/bench_memory.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _rss() -> int:
    from procstat import rss_bytes

    return rss_bytes(os.getpid())


def _fresh(labels: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """New string and tuple objects, as a server decoding a request has: the workload's own
    objects would otherwise be shared with the store and not counted."""
    return tuple((k.encode().decode(), v.encode().decode()) for k, v in labels)


def one_case(series: int, ticks: int, chunk_samples: int, head_keep: int) -> dict[str, Any]:
    """Runs in the child: build the store, measure, return the figures."""
    import numpy as np
    from compare_workload import Workload, WorkloadConfig

    from metricsd.memory import tune_malloc
    from metricsd.store.engine import Store
    from metricsd.store.settings import StoreSettings

    tune_malloc()  # as every metricsd process does
    wl = Workload(WorkloadConfig(ticks=ticks, live_ticks=0).scaled(series / 40_000))
    labels = wl.series
    ids = wl.source.series_ids.astype(np.uint64)
    n = len(labels)
    blocks = []
    sent = 0
    while sent < ticks:
        k = min(60, ticks - sent)
        stamps, values = wl.sim.block(k)
        blocks.append((k, np.asarray(stamps, np.int64), np.ascontiguousarray(values[:, wl.source.cols].T)))
        sent += k
    store = Store(StoreSettings(chunk_samples=chunk_samples, head_keep=head_keep,
                                retention_ms=max(ticks, 1) * 10_000 * 2))
    gc.collect()
    objects0 = len(gc.get_objects())
    rss0 = _rss()
    cpu0 = time.process_time()
    first = True
    for k, stamps, values in blocks:
        for s0 in range(0, n, 1000):
            s1 = min(s0 + 1000, n)
            sid = ids[s0:s1]
            new = {int(i): _fresh(labels[j]) for j, i in zip(range(s0, s1), sid.tolist(), strict=True)} \
                if first else None
            store.write(sid, np.full(s1 - s0, k), np.tile(stamps, s1 - s0), values[s0:s1].reshape(-1), new)
        first = False
    cpu = time.process_time() - cpu0
    gc.collect()
    grown = _rss() - rss0  # the generated blocks are still held: they were in rss0 too
    # Every store process hands its heap's free pages back to the kernel once a minute, after its
    # retention pass (metricsd/store/api.py gc_loop): what is left is what a running store holds.
    # Until then, the pages freed by each block's copy of its open chunk stay resident.
    from metricsd.memory import release_free_memory

    release_free_memory()
    settled = _rss() - rss0
    samples = n * ticks
    c = store.chunks
    head_bytes = store.head.nbytes + sum(a.nbytes for a in (c.max_ts, c.samples, c.open_min, c.open_count,
                                                             c.open_hash, c.t2, c.v1, c.v2, c.shift, c.family))
    st = store.stats()
    return {
        "series": n, "ticks": ticks, "samples": samples, "chunk_samples": chunk_samples, "head_keep": head_keep,
        "ingest_cpu_s_per_million": cpu / samples * 1e6,
        "rss_growth_mib": grown / 2**20,
        "bytes_per_sample": grown / samples,
        "bytes_per_series": grown / n,
        "settled_rss_growth_mib": settled / 2**20,
        "settled_bytes_per_sample": settled / samples,
        "settled_bytes_per_series": settled / n,
        "head_bytes_per_series": head_bytes / n,
        "chunk_bytes_per_sample": float(st["chunk_bytes"]) / samples,
        "other_bytes_per_series": (grown - head_bytes - float(st["chunk_bytes"])) / n,
        "python_objects_per_series": (len(gc.get_objects()) - objects0) / n,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    out = ["| series x samples | RSS growth, MiB | bytes / sample | bytes / series | settled (after malloc_trim): "
           "bytes / sample | bytes / series | head / series | chunks, bytes / sample | rest / series "
           "| Python objects / series | ingest CPU s / M |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['series']:,} x {r['ticks']:,} | {r['rss_growth_mib']:.1f} | {r['bytes_per_sample']:.2f} | "
                   f"{r['bytes_per_series']:,.0f} | {r['settled_bytes_per_sample']:.2f} | "
                   f"{r['settled_bytes_per_series']:,.0f} | {r['head_bytes_per_series']:,.0f} | "
                   f"{r['chunk_bytes_per_sample']:.2f} | {r['other_bytes_per_series']:,.0f} | "
                   f"{r['python_objects_per_series']:.1f} | {r['ingest_cpu_s_per_million']:.2f} |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--series", type=int, default=10_000)
    p.add_argument("--hours", type=float, nargs="*", default=[2.0, 24.0], help="one case per value")
    from metricsd.store.settings import StoreSettings

    defaults = StoreSettings()
    p.add_argument("--chunk-samples", type=int, default=defaults.chunk_samples, help="default: the store's")
    p.add_argument("--head-keep", type=int, default=defaults.head_keep, help="default: the store's")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=HERE / "results" / "bench_memory.json")
    args = p.parse_args()
    if args.child:
        ticks = int(args.hours[0] * 360)
        print(json.dumps(one_case(args.series, ticks, args.chunk_samples, args.head_keep)))
        return 0
    rows = []
    for hours in args.hours:
        cmd = [sys.executable, __file__, "--child", "--series", str(args.series), "--hours", str(hours),
               "--chunk-samples", str(args.chunk_samples), "--head-keep", str(args.head_keep)]
        print(f"{args.series} series x {hours} h ...", flush=True)
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    table = markdown(rows)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": " ".join(["perf/bench_memory.py", *sys.argv[1:]]),
                                    "machine": platform.platform(), "cases": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
