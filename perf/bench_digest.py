"""Anti-entropy digest benchmark: CPU seconds of a store's digests, by cached chunk sums and by
decoding every chunk (what every digest did before the sums were kept).

Run: ``.venv/bin/python perf/bench_digest.py`` (about a minute on 2 cores, one core busy;
``--series N --samples M`` to change the size, default 10,000 series x 720 samples = 2 h at 10 s;
``--repeat K`` timed repetitions, the median reported; ``--build-only`` just builds the store and
reports the ingest CPU, so the same command run against an older checkout compares ingest).

The store is built through Store.write, 60 samples per series a write (the backfill shape), with
a per-container mix of a CPU counter, a working-set gauge and a constant request (fixed seed).
Timed with time.process_time, in process, nothing else running in it:

  reference     SlotSamples without the cache, then digest_series: every chunk decoded and every
                sample hashed (the digest before chunk sums were cached)
  slot digest   store_digest of all 64 slots over the whole range, no buckets (an anti-entropy
                round's first request: replicas that agree stop here)
  round         store_digest of 16 of the 64 slots from 24 h before the newest sample to 10 s
                before it (what ReplicaSync asks each interval by default)
  cut round     the same from 50 s after the oldest sample: the window's start cuts every
                series' oldest chunk, as it does with a full day of data under retention
  per series    store_digest per series with 10-minute buckets (asked for slots that differ;
                20-minute chunks straddle 10-minute buckets, so most chunks are decoded)
  after restore the slot digest right after a snapshot restore (sums not known yet: decoded and
                learnt), then again
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from metricsd.model import make_labels, series_id
from metricsd.proto import metricsd_pb2 as pb
from metricsd.replica.digest import SlotSamples, digest_request, digest_response, store_digest
from metricsd.store.engine import Store
from metricsd.store.snapshot import capture, restore
from metricsd.store.wal.log import WalPosition

T0 = 1_700_000_000_000
INTERVAL_MS = 10_000
SLOTS = 64
BATCH = 60


def build(n_series: int, n_samples: int) -> tuple[Store, float]:
    """A store holding ``n_series`` x ``n_samples``; and the CPU seconds the writes took."""
    rng = np.random.default_rng(7)
    labels = []
    for i in range(n_series):
        pod = {"namespace": f"ns{i % 20}", "pod": f"pod-{i // 4}", "container": "app"}
        name = ("container_cpu_usage_seconds_total", "container_memory_working_set_bytes",
                "kube_pod_container_resource_requests", "container_memory_rss")[i % 4]
        labels.append(make_labels(name, pod))
    ids = np.array([series_id(lab) for lab in labels], dtype=np.uint64)
    kind = np.arange(n_series) % 4
    level = rng.uniform(1e7, 5e8, n_series).round()  # bytes
    counter = np.zeros(n_series)
    store = Store()
    new = {int(i): lab for i, lab in zip(ids, labels, strict=True)}
    cpu = 0.0
    for start in range(0, n_samples, BATCH):
        k = min(BATCH, n_samples - start)
        ts = T0 + (start + np.arange(k, dtype=np.int64)) * INTERVAL_MS
        vals = np.empty((n_series, k))
        steps = rng.gamma(2.0, 0.05, (n_series, k)).round(6)
        vals[kind == 0] = (counter[kind == 0, None] + np.cumsum(steps[kind == 0], axis=1)).round(6)
        counter[kind == 0] = vals[kind == 0, -1]
        wobble = rng.normal(0, 4096 * 50, (n_series, k))
        vals[kind % 2 == 1] = ((level[kind % 2 == 1, None] + wobble[kind % 2 == 1]) // 4096) * 4096
        vals[kind == 2] = 0.25
        c0 = time.process_time()
        store.write(ids, np.full(n_series, k), np.tile(ts, n_series), vals.reshape(-1), new)
        cpu += time.process_time() - c0
        new = {}
    return store, cpu


def reference(store: Store, request: pb.DigestRequest) -> pb.DigestResponse:
    slot_count, slots = digest_request(request)
    samples = SlotSamples(store, slot_count, slots, request.start_ms, request.end_ms)
    samples.read(len(samples.rows))
    return digest_response(request, slots, samples)


def timed(fn: Callable[[], pb.DigestResponse], repeat: int) -> tuple[float, pb.DigestResponse]:
    runs = []
    out = pb.DigestResponse()
    for _ in range(repeat):
        c0 = time.process_time()
        out = fn()
        runs.append(time.process_time() - c0)
    return statistics.median(runs), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--series", type=int, default=10_000)
    ap.add_argument("--samples", type=int, default=720)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args()
    store, ingest = build(args.series, args.samples)
    total = args.series * args.samples
    print(f"store: {args.series:,} series x {args.samples} samples = {total / 1e6:.2f} M samples; "
          f"ingest {ingest:.2f} CPU s ({ingest / total * 1e6:.2f} per million samples)")
    if args.build_only:
        return
    newest = int(store.max_ts)
    everything = pb.DigestRequest(slots=pb.SlotFilter(slot_count=SLOTS, slots=list(range(SLOTS))), start_ms=T0,
                                  end_ms=newest)
    per_series = pb.DigestRequest(slots=everything.slots, start_ms=T0, end_ms=newest, bucket_ms=600_000,
                                  per_series=True)
    round_req = pb.DigestRequest(slots=pb.SlotFilter(slot_count=SLOTS, slots=list(range(16))),
                                 start_ms=newest - 24 * 3600 * 1000, end_ms=newest - 10_000)
    cut_req = pb.DigestRequest(slots=round_req.slots, start_ms=T0 + 50_000, end_ms=newest - 10_000)
    rows: list[tuple[str, float, float]] = []
    cases = [("slot digest, all 64 slots, whole range", everything),
             ("round: 16 slots, 24 h to 10 s before the newest", round_req),
             ("cut round: the same, the start cutting each oldest chunk", cut_req),
             ("per series, 10-minute buckets, all 64 slots", per_series)]
    for name, req in cases:
        ref_s, want = timed(lambda r=req: reference(store, r), args.repeat)
        got_s, got = timed(lambda r=req: store_digest(store, r), args.repeat)
        assert got == want, f"cached digest differs from the reference: {name}"
        rows.append((name, ref_s, got_s))
    restored = restore(capture(store, WalPosition(1, 0)), store.settings)
    c0 = time.process_time()
    first = store_digest(restored, everything)
    first_s = time.process_time() - c0
    again_s, again = timed(lambda: store_digest(restored, everything), args.repeat)
    assert first == again == reference(store, everything)
    rows.append(("after a snapshot restore: first slot digest / the next", first_s, again_s))
    chunks = sum(store.chunks.n_chunks(r) for r in range(store.index.n_rows))
    print(f"{chunks:,} sealed chunks; their hash sums take {8 * chunks / 1024:.0f} KiB (8 bytes a chunk)")
    print(f"{'digest':<56} {'decode all, CPU s':>18} {'cached sums, CPU s':>19} {'ratio':>7}")
    for name, a, b in rows:
        print(f"{name:<56} {a:>18.3f} {b:>19.3f} {a / b if b else float('inf'):>6.1f}x")


if __name__ == "__main__":
    main()
