"""CPU per dashboard question (a), (b), (c) in one store in this process (a documented command, not a test).

    PYTHONPATH=TREE .venv/bin/python perf/bench_questions_inproc.py TREE [SCALE] [N]

perf/compare_workload.py's seeded workload (1 h at 10 s, scaled by SCALE, default 0.2 = 8,000 series) is
written to a ``Store`` through a ``LocalBackend``; then each of compare_http.py's questions (a), (b), (c)
is asked through ``QueryRunner`` 20 times to warm up and N times (default 200) timed; prints JSON with
the ingest CPU seconds and the CPU milliseconds per question (``time.process_time``). TREE is the checkout
whose metricsd is on PYTHONPATH (its perf/ is used for the workload): run two trees alternately for an A/B.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path


def main() -> None:
    tree = Path(sys.argv[1])
    scale = float(sys.argv[2]) if len(sys.argv) > 2 else 0.2
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    sys.path.insert(0, str(tree / "perf"))
    sys.path.insert(0, str(tree))
    from compare_http import http_questions
    from compare_queries import Question
    from compare_workload import Workload, WorkloadConfig

    from metricsd.promql.queries import QueryRunner
    from metricsd.store.api import LocalBackend, StoreAPI
    from metricsd.store.engine import Store

    wl = Workload(WorkloadConfig(end_ms=1_790_000_000_000, ticks=360, live_ticks=10).scaled(scale))
    backend = LocalBackend(StoreAPI(Store()))
    runner = QueryRunner(backend)
    cfg = wl.config

    async def run() -> dict[str, float]:
        t0 = time.process_time()
        for live in (False, True):
            for ticks in wl.blocks(live):
                for b in wl.next_block(ticks, cfg.live_series if live else cfg.backfill_series):
                    await backend.write(b.grpc)
        out = {"ingest_s": round(time.process_time() - t0, 2)}
        big = next(p for p in wl.sim.pods() if p.workload == "big")
        for q in http_questions(wl.last_ms + 5_000, big.pod, "default"):
            if q.key not in ("a", "b", "c"):
                continue

            async def one(q: Question = q) -> None:
                if q.step_ms:
                    await runner.range(q.promql, q.start_ms, q.end_ms, q.step_ms)
                else:
                    await runner.instant(q.promql, q.end_ms)

            for _ in range(20):
                await one()
            t = time.process_time()
            for _ in range(n):
                await one()
            out[q.key] = round((time.process_time() - t) / n * 1e3, 3)
        return out

    print(json.dumps(asyncio.run(run())))


if __name__ == "__main__":
    main()
