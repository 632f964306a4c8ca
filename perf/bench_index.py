"""The series index alone: its bytes per series and the time of its selections, at scale (a
documented command, not a test).

    .venv/bin/python perf/bench_index.py                    # 1,000,000 series (125,000 pods x 8)
    .venv/bin/python perf/bench_index.py --series 200000

Builds a ``SeriesIndex`` of the simulator's pod series (bench_scale.py's shape: 8 series a pod, 50
workloads), in a fresh process, and reports:
- the process's RSS growth per series while the index was built (and, with ``--tracemalloc``, the
  bytes the index holds by tracemalloc's count: the Python heap and NumPy's arrays);
- the time of a few selections (median of ``--rounds``), each made afresh (not remembered).
Prints one JSON object; perf/RESULTS.md keeps the figures with the command.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procstat import rss_bytes

from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.selector import Matcher, MatchOp
from metricsd.store.index import SeriesIndex

SELECTIONS = {
    "cpu": [Matcher(MatchOp.EQ, "__name__", "container_cpu_usage_seconds_total")],
    "cpu, absent label !=": [Matcher(MatchOp.EQ, "__name__", "container_cpu_usage_seconds_total"),
                             Matcher(MatchOp.NEQ, "peer_bench_poll", "7")],
    'cpu, container!=""': [Matcher(MatchOp.EQ, "__name__", "container_cpu_usage_seconds_total"),
                           Matcher(MatchOp.NEQ, "container", "")],
    'cpu, pod=~"w1.*"': [Matcher(MatchOp.EQ, "__name__", "container_cpu_usage_seconds_total"),
                         Matcher(MatchOp.RE, "pod", "w1.*")],
    'namespace!~"ns-1.*" only': [Matcher(MatchOp.NRE, "namespace", "ns-1.*")],
    "one pod": [Matcher(MatchOp.EQ, "namespace", "default"), Matcher(MatchOp.EQ, "pod", "")],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--series", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tracemalloc", action="store_true",
                   help="count the heap's bytes with tracemalloc (slower; RSS then includes its own bookkeeping)")
    args = p.parse_args()
    sim = Simulator(SimConfig(pods=args.series // 8, workloads=50, nodes=max(5, args.series // 400), seed=4,
                              big_workload_pods=min(5000, args.series // 16)), 1_700_000_000_000)
    series, ids = sim.series, sim.series_ids
    one = dict(series[len(series) // 2])
    SELECTIONS["one pod"] = [Matcher(MatchOp.EQ, "namespace", one["namespace"]), Matcher(MatchOp.EQ, "pod", one["pod"])]
    gc.collect()
    rss0 = rss_bytes(os.getpid())
    if args.tracemalloc:
        tracemalloc.start()
    t0 = time.perf_counter()
    index = SeriesIndex()
    for sid, labels in zip(ids.tolist(), series, strict=True):
        index.add(sid, labels)
    index.rows_of(ids[:1000])  # the sorted id column, as a first write would build it
    build_s = time.perf_counter() - t0
    gc.collect()
    heap = tracemalloc.get_traced_memory()[0] if args.tracemalloc else 0
    tracemalloc.stop()
    rss = rss_bytes(os.getpid()) - rss0
    n = len(series)
    out: dict[str, object] = {"command": " ".join([".venv/bin/python", "perf/bench_index.py", *sys.argv[1:]]),
                              "series": n, "pods": len(sim.pods()), "build_s": build_s,
                              "heap_bytes_per_series": heap / n if heap else None,
                              "rss_bytes_per_series": rss / n, "select_ms": {}}
    for name, matchers in SELECTIONS.items():
        times = []
        got = 0
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            got = len(index.select(matchers))
            times.append(time.perf_counter() - t0)
        out["select_ms"][name] = {"rows": got, "median_ms": float(np.median(times)) * 1000}  # type: ignore[index]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
