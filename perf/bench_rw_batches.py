"""One store's remote-write receiver in process, fed bodies cut as a real Prometheus cuts them (a
documented command, not a test).

    .venv/bin/python perf/bench_rw_batches.py                          # this tree
    PYTHONPATH=/tmp/base .venv/bin/python perf/bench_rw_batches.py     # a `git archive` of another commit

perf/bench_rw_receiver.py's live bodies repeat a layout (the receiver's layout memo hits them); a
Prometheus' shards cut their batches by count, so no body repeats (perf/RESULTS.md, issue 24 session
37). Here ``--series`` series (perf/bench_rw_prometheus.py's labels: namespace, pod, container, node,
4 metrics a pod) are all learnt once, then every tick each series gets one sample and the tick's
samples go out in bodies of ``--per-send`` series, cut at an offset that moves each tick (so the
bodies never repeat). Times ``RemoteWriteReceiver.ingest`` of each body with ``time.process_time``
(process CPU, not wall): the median per request and the total per million samples. Run A and B
alternately on a loaded machine.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time

import cramjam
from prometheus_client import CollectorRegistry

from metricsd.http.remote_write import RemoteWriteReceiver
from metricsd.http.selfmetrics import SelfMetrics
from metricsd.http.settings import HttpSettings
from metricsd.proto import prometheus_remote_pb2 as prom
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

METRICS = ("container_cpu_usage_seconds_total", "container_memory_working_set_bytes",
           "container_network_receive_bytes_total", "kube_pod_container_resource_requests")


def labels(i: int) -> list[tuple[str, str]]:
    pod, metric = divmod(i, 4)
    target = pod // 1000
    return [("__name__", METRICS[metric]), ("container", "app"), ("instance", f"127.0.0.1:{9000 + target}"),
            ("job", "pods"), ("namespace", f"ns-{pod % 50}"), ("node", f"node-{pod % 100}"),
            ("pod", f"pod-{target}-{pod % 1000}")]


def body(series: list[list[tuple[str, str]]], idx: range, t_ms: int) -> bytes:
    req = prom.WriteRequest()
    for i in idx:
        ts = req.timeseries.add()
        for k, v in series[i]:
            ts.labels.add(name=k, value=v)
        ts.samples.add(value=float(i % 97 + 1) * t_ms / 1e3, timestamp=t_ms)
    return bytes(cramjam.snappy.compress_raw(req.SerializeToString()))


async def run(args: argparse.Namespace) -> None:
    n = args.series
    series = [labels(i) for i in range(n)]
    t0 = int(time.time() * 1000) - 600_000
    store = Store()
    rx = RemoteWriteReceiver(LocalBackend(StoreAPI(store)), HttpSettings(access_log=False),
                             SelfMetrics(CollectorRegistry()))
    for start in range(0, n, args.per_send):  # learn every series
        await rx.ingest(body(series, range(start, min(n, start + args.per_send)), t0))
    ticks = []
    for tick in range(1, args.ticks + 1):
        shift = (tick * 137) % args.per_send  # the cut moves: no body repeats
        cuts = [0, *range(shift or args.per_send, n, args.per_send), n]
        ticks.append([body(series, range(a, b), t0 + tick * 15_000) for a, b in itertools.pairwise(cuts) if b > a])
    total = []
    samples = 0
    for bodies in ticks:
        for b in bodies:
            c0 = time.process_time()
            samples += await rx.ingest(b)
            total.append(time.process_time() - c0)
    print(f"{len(total)} requests, {samples:,} samples: median ingest {statistics.median(total) * 1e6:.0f} us a "
          f"request; {sum(total) / samples * 1e6:.2f} CPU s per million samples; layout memo "
          f"{rx.cache.layouts.hits} hits, {rx.cache.layouts.misses} misses")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=int, default=40_000)
    ap.add_argument("--per-send", type=int, default=500, help="series a body (Prometheus' max_samples_per_send)")
    ap.add_argument("--ticks", type=int, default=10)
    asyncio.run(run(ap.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
