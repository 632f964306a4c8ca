"""A/B of the live-write admission check (--max-future and the too-old horizon, metricsd/store/admission.py).

    .venv/bin/python perf/bench_admission.py            # 7 interleaved rounds, both shapes
    .venv/bin/python perf/bench_admission.py --rounds 3

Every live write now passes through ``split_refused`` before validation: a min and a max over the
timestamps the store converts for the write anyway. This measures what that costs on the store's write path, in
one process (no gRPC, so the difference is not lost in the noise of the transport): the same
simulated batches written into two fresh stores, one with the check (the default, ``max_future_ms``
10 min) and one without (``max_future_ms=None`` and no horizon), interleaved round by round, in the
agents' live shape (1,000 series x 1 sample a request) and the backfill shape (1,000 x 60). Prints
microseconds per request and CPU seconds per million samples for A and B and their ratio, and the
check alone (split_refused on a batch with nothing to refuse).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.clock import ManualClock
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.admission import split_refused
from metricsd.store import admission
from metricsd.store import api as store_api
from metricsd.store.api import StoreAPI
from metricsd.store.engine import Store
from metricsd.store.recovery import request_arrays

T0 = 1_700_000_000_000


def _batches(ticks: int, ticks_per_req: int, pods: int) -> list[pb.WriteRequest]:
    sim = Simulator(SimConfig(pods=pods, workloads=20, nodes=10, seed=1), T0)
    out: list[pb.WriteRequest] = []
    first = True
    for _ in range(0, ticks, ticks_per_req):
        ts, values = sim.block(ticks_per_req)
        out += write_requests(sim, ts, values, max_samples=1000 * ticks_per_req,
                              send_labels_for=None if first else set())
        first = False
    return out


def _no_admission(store: Store, request: pb.WriteRequest, now_ms: int, timestamps: object = None
                  ) -> tuple[pb.WriteRequest, None]:
    return request, None


def _run(reqs: list[pb.WriteRequest], check: bool, clock: ManualClock) -> float:
    """CPU seconds to write ``reqs`` into a fresh store, with the admission check (A) or without (B)."""
    api = StoreAPI(Store(), clock=clock)
    store_api.admit = admission.admit if check else _no_admission  # type: ignore[assignment]
    t0 = time.process_time()
    try:
        for r in reqs:
            api.write(r)
    finally:
        store_api.admit = admission.admit  # type: ignore[assignment]
    return time.process_time() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--pods", type=int, default=125, help="8 series a pod (default: 1,000 series)")
    args = p.parse_args()
    clock = ManualClock(T0 + 30 * 86_400_000)
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} (1/5/15 min), "
          f"{args.rounds} rounds, {args.pods * 8} series")
    for shape, ticks, per in (("live (1 sample a series a request)", 120, 1), ("backfill (60 a series)", 720, 60)):
        reqs = _batches(ticks, per, args.pods)
        samples = sum(len(r.timestamps) for r in reqs)
        a, b = [], []
        for _ in range(args.rounds):
            a.append(_run(reqs, True, clock))
            b.append(_run(reqs, False, clock))
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"{shape}: {len(reqs)} requests, {samples:,} samples")
        print(f"  A with the check: {ma / len(reqs) * 1e6:8.1f} us a request, {ma / samples * 1e6:.3f} CPU s per "
              f"million samples (median of {args.rounds})")
        print(f"  B without:        {mb / len(reqs) * 1e6:8.1f} us a request, {mb / samples * 1e6:.3f} CPU s per "
              f"million samples")
        print(f"  A / B = {ma / mb:.3f}")
        t0 = time.perf_counter()
        n = 0
        stamps = [request_arrays(r)[2] for r in reqs[:50]]
        while time.perf_counter() - t0 < 1.0:
            for r, ts in zip(reqs[:50], stamps, strict=True):
                split_refused(r, clock.now_ms(), 600_000, T0 - 86_400_000, timestamps=ts)
                n += 1
        per_call = (time.perf_counter() - t0) / n
        print(f"  split_refused alone (nothing to refuse, timestamps given): {per_call * 1e6:.1f} us a request")


if __name__ == "__main__":
    main()
