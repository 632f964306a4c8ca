"""The scale curve of one store: cost per series from 10,000 to 1,000,000 series (a documented
command, not a test).

    .venv/bin/python perf/bench_scale.py                       # 10k, 100k, 300k, 1M series (about 25 min)
    .venv/bin/python perf/bench_scale.py --points 10000,30000  # any points

For each point, a fresh `metricsd up --no-simulate --no-consumers` process (series limits off, so
the curve is not cut by the defaults sized to this machine) is fed one hour of simulated pod
metrics at 10 s (metricsd/agent/simulate.py; 8 series per pod, pods spread over 50 workloads
and one Deployment `big` of 5,000 pods, or half the pods where there are fewer than 10,000):
the first 50 minutes in the backfill shape (1,000 series x 60 samples a request), the last 10
in the agents' live shape (1,000 series x 1 sample a request). Then it measures:
- RSS per series and per sample (settled: after the store's retention loop had a chance to run);
- live-shape ingest: server CPU seconds per million samples;
- the HPA question, the average CPU rate of Deployment `big` over 1 minute: p50 / p99 at
  concurrency 1 (200 queries);
- with ``--windows``, the same question over longer windows (e.g. 300000,3600000: windows that
  reach past the head's ring of raw samples into the compressed chunks).
Writes perf/results/bench_scale.json (or ``--json``) and perf/results/scale_curve.png, and prints
the table. For an A/B against another commit, run the same script with that commit's package
first on the path (``git archive <commit> | tar -x -C /tmp/base``, then
``PYTHONPATH=/tmp/base .venv/bin/python perf/bench_scale.py ... --json /tmp/a.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_store import BIN, StoreProcess, _agg_request, _free_port, ingest, latency
from procstat import peak_rss_bytes, rss_bytes

from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.rpc.client import MetricsClient

HERE = Path(__file__).resolve().parent
SERIES_PER_POD = 8
BIG = 5000


def _command(port: int) -> list[str]:
    return [str(BIN), "--log-level", "WARNING", "up", "--no-simulate", "--no-consumers", "--grpc-port", str(port),
            "--http-port", str(_free_port()), "--max-series", "0", "--max-new-series-per-minute", "0"]


async def point(series: int, ticks: int, live_ticks: int, queries: int, windows: tuple[int, ...] = ()
                ) -> dict[str, Any]:
    pods = series // SERIES_PER_POD
    big = min(BIG, pods // 2)
    store = StoreProcess(_command)
    try:
        async with MetricsClient(store.addr, timeout_s=300) as client:
            await store.wait_ready(client)
            idle = rss_bytes(store.proc.pid)
            sim = Simulator(SimConfig(pods=pods, workloads=50, nodes=max(5, pods // 50), seed=4,
                                      big_workload_pods=big), 1_700_000_000_000)
            n_series = len(sim.series)
            t0 = time.monotonic()
            backfill = await ingest(client, store.proc.pid, sim, ticks - live_ticks, 60, 1000, first=True)
            live = await ingest(client, store.proc.pid, sim, live_ticks, 1, 1000, first=False)
            ingest_s = time.monotonic() - t0
            await asyncio.sleep(5.0)  # the retention loop gives freed memory back (malloc_trim)
            st = await client.stats()
            rss = rss_bytes(store.proc.pid)
            at = sim.next_timestamp_ms - 1
            hpa = await latency(client, _agg_request(False, at), queries, 1, min_series=big, warmup=10, exact=True)
            by_window = {}
            for w in windows:
                req = _agg_request(False, at)
                req.query.window_ms = w
                by_window[str(w)] = await latency(client, req, queries, 1, min_series=big, warmup=10, exact=True)
            peak = peak_rss_bytes(store.proc.pid)
    finally:
        store.stop()
    samples = backfill["samples"] + live["samples"]
    return {"series": n_series, "pods": pods, "big_pods": big, "samples": samples, "ingest_wall_s": ingest_s,
            "idle_rss_mib": idle / 2**20, "rss_mib": rss / 2**20, "peak_rss_mib": peak / 2**20,
            "rss_bytes_per_series": rss / n_series, "rss_bytes_per_sample": rss / samples,
            "chunk_bytes_per_sample": st.bytes_per_sample,
            "backfill_cpu_s_per_million": backfill["server_cpu_s_per_million"],
            "live_cpu_s_per_million": live["server_cpu_s_per_million"],
            "hpa_p50_ms": hpa["p50_ms"], "hpa_p99_ms": hpa["p99_ms"],
            "by_window_ms": {w: {"p50_ms": q["p50_ms"], "p99_ms": q["p99_ms"]} for w, q in by_window.items()}}


def markdown(r: dict[str, Any]) -> str:
    rows = ["| series | pods (in `big`) | samples | RSS, MiB | RSS per series, bytes | of which above the idle process "
            "| RSS per sample, bytes | live ingest, CPU s per million | backfill ingest, CPU s per million "
            "| HPA question over `big`, c1 p50 / p99 |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in r["points"]:
        above = (p["rss_mib"] - p["idle_rss_mib"]) * 2**20 / p["series"]
        rows.append(f"| {p['series']:,} | {p['pods']:,} ({p['big_pods']:,}) | {p['samples']:,} | {p['rss_mib']:,.0f} | "
                    f"{p['rss_bytes_per_series']:,.0f} | {above:,.0f} | {p['rss_bytes_per_sample']:.2f} | "
                    f"{p['live_cpu_s_per_million']:.2f} | {p['backfill_cpu_s_per_million']:.2f} | "
                    f"{p['hpa_p50_ms']:.1f} / {p['hpa_p99_ms']:.1f} ms |")
    return "\n".join(rows)


def plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = r["points"]
    xs = [p["series"] for p in pts]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = [("rss_bytes_per_series", "RSS per series, bytes"),
              ("live_cpu_s_per_million", "live-shape ingest, CPU s per million samples"),
              ("hpa_p50_ms", "HPA question over Deployment big, ms")]
    for ax, (key, title) in zip(axes, panels, strict=True):
        label = {"hpa_p50_ms": "p50", "rss_bytes_per_series": "whole process"}.get(key)
        ax.plot(xs, [p[key] for p in pts], marker="o", color="#1b7837", label=label)
        if key == "rss_bytes_per_series":
            ax.plot(xs, [(p["rss_mib"] - p["idle_rss_mib"]) * 2**20 / p["series"] for p in pts], marker="o",
                    color="#7fbf7b", label="above the idle process")
            ax.legend(fontsize=8)
        if key == "hpa_p50_ms":
            ax.plot(xs, [p["hpa_p99_ms"] for p in pts], marker="_", color="black", linestyle="--", label="p99")
            ax.legend(fontsize=8)
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("series in the store")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle(f"One store, an hour of data at 10 s ({r['cores']} cores)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--points", default="10000,100000,300000,1000000", help="series per point, comma-separated")
    p.add_argument("--minutes", type=int, default=60, help="minutes of data at 10 s")
    p.add_argument("--live-minutes", type=int, default=10, help="of which the last go in the live shape")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--windows", default="", help="also time the HPA question over these windows, ms, comma-separated")
    p.add_argument("--json", type=Path, default=HERE / "results" / "bench_scale.json", help="where the results go")
    p.add_argument("--report", action="store_true", help="print the table and redraw the plot from the last JSON")
    args = p.parse_args()
    out = HERE / "results"
    windows = tuple(int(x) for x in args.windows.split(",") if x.strip())
    if args.report:
        saved = json.loads(args.json.read_text())
        plot(saved, out / "scale_curve.png")
        print(f"command: {saved['command']}  (cores: {saved['cores']}, Python {saved['python']})")
        print(markdown(saved))
        return
    points = [int(x) for x in args.points.split(",") if x.strip()]
    r: dict[str, Any] = {"command": " ".join([".venv/bin/python", "perf/bench_scale.py", *sys.argv[1:]]),
                         "cores": os.cpu_count(), "python": platform.python_version(), "points": []}
    for n in points:
        print(f"{n:,} series ...", flush=True)
        r["points"].append(asyncio.run(point(n, args.minutes * 6, args.live_minutes * 6, args.queries, windows)))
        print(markdown({"points": r["points"][-1:]}).splitlines()[-1], flush=True)
        for w, q in r["points"][-1]["by_window_ms"].items():
            print(f"  window {int(w) // 1000} s: c1 p50 / p99 {q['p50_ms']:.1f} / {q['p99_ms']:.1f} ms", flush=True)
    args.json.parent.mkdir(exist_ok=True, parents=True)
    args.json.write_text(json.dumps(r, indent=2))
    if args.json == HERE / "results" / "bench_scale.json":
        plot(r, out / "scale_curve.png")
    print(f"command: {r['command']}  (cores: {r['cores']}, Python {r['python']})")
    print(markdown(r))


if __name__ == "__main__":
    main()
