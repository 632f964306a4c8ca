"""The live shape inside one cluster store, in process (a documented command, not a test):

    .venv/bin/python perf/bench_seal.py                  # both measurements
    PYTHONPATH=/tmp/base .venv/bin/python perf/bench_seal.py   # the same against a `git archive` of another commit

1. ``encode_blocks``: one block of 32 samples for each of 2,000 series whose chunks are open (what
   a store seals for one agent batch every 32 ticks), with regular timestamps and with 5% of them
   jittered by a few ms; median process CPU of ``--calls`` calls.
2. A store's write of the agents' live shape as a cluster store receives it: WriteParts messages
   of 4 parts (2,000 series x 1 sample, ids only) through MetricsServicer, OwnershipBackend (a
   member holding every slot, RF 3 of 3) and StoreAPI, after 180 ticks of 40,000 series; process
   CPU seconds per million samples. gRPC itself is not in it: this is the store's share.

Process CPU, not wall time, so a loaded machine skews it less; still run A and B alternately.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np

from metricsd.cluster.mapsource import StaticMapSource
from metricsd.cluster.shardmap import Member, ShardMap
from metricsd.codec.blocks import Chain, encode_blocks
from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.replica.ownership import OwnershipBackend, store_write_slots
from metricsd.rpc.servicer import MetricsServicer
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store


def encode(calls: int, jitter: float, k: int = 2000, n: int = 32) -> tuple[float, float]:
    """(median ms a call, bytes a sample) of encode_blocks on workload-like blocks."""
    rng = np.random.default_rng(1)
    t = 1_700_000_000_000 + 10_000 * np.arange(n)[None, :] + np.zeros((k, 1), np.int64)
    t = t + np.where(rng.random((k, n)) < jitter, rng.integers(-3, 4, (k, n)), 0)
    kind = rng.integers(0, 4, k)[:, None]
    base = rng.random((k, 1)) * 1000
    v = np.where(kind == 0, np.round(base, 0),  # constant: limits, requests
                 np.where(kind == 1, np.round(base + np.cumsum(rng.integers(0, 50, (k, n)), axis=1), 0),  # counters
                          np.where(kind == 2, np.round(base + rng.random((k, n)) * 10, 1),  # gauges, one decimal
                                   base * rng.random((k, n)))))  # any float
    chain = encode_blocks(t - 10_000 * n, v, Chain.empty(k), n).after
    times = []
    for _ in range(calls):
        c = time.process_time()
        enc = encode_blocks(t, v, chain, n)
        times.append(time.process_time() - c)
    return statistics.median(times) * 1e3, len(enc.data) / (k * n)


async def store_live(ticks: int, n: int = 40_000, per: int = 2_000, parts: int = 4) -> float:
    """CPU s per million samples of the store's side of the live shape."""
    members = {m: Member(m, f"127.0.0.1:{7000 + i}") for i, m in enumerate(("s1", "s2", "s3"))}
    smap = ShardMap(version=1, rf=3, slots=tuple(("s1", "s2", "s3") for _ in range(64)), members=members)
    store = Store()
    backend = OwnershipBackend(LocalBackend(StoreAPI(store, "s1")), "s1", StaticMapSource(smap),
                               store_write_slots(store))
    servicer = MetricsServicer(backend)
    labels = [make_labels("cpu", {"namespace": f"ns{i % 50}", "pod": f"pod-{i}"}) for i in range(n)]
    ids = np.array([series_id(lab) for lab in labels], np.uint64)
    t0 = (int(time.time() * 1000) // 10_000) * 10_000 - 10_000 * (180 + ticks)
    rng = np.random.default_rng(0)

    def request(lo: int, tick: int, with_labels: bool) -> pb.WriteRequest:
        r = pb.WriteRequest(ids=ids[lo:lo + per].tolist(), counts=[1] * per, timestamps=[t0 + 10_000 * tick] * per,
                            values=np.round(rng.random(per) * 100, 1).tolist())
        if with_labels:
            for i in range(lo, lo + per):
                r.series.add(id=int(ids[i])).labels.extend(labels_to_pb(labels[i]))
        return r

    for tick in range(180):  # the history: 180 ticks, labels with the first
        for lo in range(0, n, per):
            await backend.write(request(lo, tick, tick == 0))
    messages = []
    for tick in range(180, 180 + ticks):
        for lo in range(0, n, per * parts):
            m = pb.WritePartsRequest()
            m.parts.extend(request(lo + j * per, tick, False) for j in range(parts))
            messages.append(m)
    c = time.process_time()
    for m in messages:
        out = await servicer._write_parts(m)
        if any(r.response.samples_written != per for r in out.results):
            raise RuntimeError(f"unexpected answer {out.results[0]}")
    return (time.process_time() - c) / (ticks * n) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=100, help="encode_blocks calls a shape")
    ap.add_argument("--ticks", type=int, default=60, help="live ticks written to the store")
    args = ap.parse_args()
    for jitter in (0.0, 0.05):
        ms, bps = encode(args.calls, jitter)
        print(f"encode_blocks 2,000 x 32, {jitter:.0%} jittered timestamps: {ms:.2f} ms a call (median), "
              f"{bps:.3f} bytes a sample")
    print(f"store, live shape (WriteParts of 4 x 2,000 series): {asyncio.run(store_live(args.ticks)):.3f} "
          f"CPU s per million samples")


if __name__ == "__main__":
    main()
