"""Chunk slabs in files against anonymous memory, in one process, interleaved (a documented command,
not a test): the ingest's CPU and a read's latency with the file slabs' pages dropped from the
resident set before every read (the worst case: a retention pass, which drops them, right before
each question) and with them resident (the next reads).

    .venv/bin/python perf/bench_chunk_files.py --series 20000 --rounds 15

Two durable stores (metricsd/store/durable.py) in temporary data directories, one with
``chunks_on_disk`` off: the same batches (``--per-write`` samples of every series at a time, 2 h at
10 s) go to both, alternately, each write's CPU time (time.process_time) counted to its store.
Then ``--rounds`` times, alternately: settle the chunk arenas (madvise DONTNEED of every file slab
but the tails; nothing for the anonymous store) and read ``--read-series`` series' last hour
(``Store.series_samples``, what a query's selection decodes), then read them again.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from metricsd.model import make_labels, series_id
from metricsd.rpc.columns import WriteColumns
from metricsd.store.durable import Durability, open_store
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings
from metricsd.store.wal import FsyncPolicy


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--series", type=int, default=20_000)
    p.add_argument("--hours", type=float, default=2.0)
    p.add_argument("--per-write", type=int, default=60, help="samples of each series a write")
    p.add_argument("--read-series", type=int, default=2_000)
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args()
    labels = [make_labels("container_cpu_usage_seconds_total", {"namespace": f"ns{i % 50}", "pod": f"p{i}"})
              for i in range(a.series)]
    ids = np.array([series_id(lab) for lab in labels], np.uint64)
    ticks = round(a.hours * 360)
    t0 = (int(time.time() * 1000) // 10_000) * 10_000 - ticks * 10_000
    rng = np.random.default_rng(0)
    level = rng.random(a.series) * 100
    out: dict[str, dict[str, float | list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        arms: dict[str, tuple[Store, Durability]] = {
            "anonymous": open_store(Path(tmp) / "anon", settings=StoreSettings(chunks_on_disk=False),
                                    fsync=FsyncPolicy.NEVER),
            "files": open_store(Path(tmp) / "files", fsync=FsyncPolicy.NEVER)}
        cpu = dict.fromkeys(arms, 0.0)
        for k in range(0, ticks, a.per_write):
            n = min(a.per_write, ticks - k)
            ts = np.tile(t0 + (k + np.arange(n, dtype=np.int64)) * 10_000, a.series)
            vals = np.repeat(level, n) + np.round(rng.random(a.series * n), 2)
            batch = WriteColumns(ids, np.full(a.series, n, np.int64), ts, vals,
                                 dict(zip(ids.tolist(), labels, strict=True)) if k == 0 else {})
            for name in (list(arms) if (k // a.per_write) % 2 == 0 else list(reversed(arms))):
                c0 = time.process_time()
                arms[name][1].write_columns(batch)
                cpu[name] += time.process_time() - c0
        samples = a.series * ticks
        rows = {name: s.index.rows_of(ids[:: max(1, a.series // a.read_series)]) for name, (s, _) in arms.items()}
        end = t0 + ticks * 10_000
        cold = {name: [] for name in arms}
        warm = {name: [] for name in arms}
        for r in range(a.rounds):
            for name in (list(arms) if r % 2 == 0 else list(reversed(arms))):
                store = arms[name][0]
                store.chunks.settle()
                for times in (cold[name], warm[name]):
                    w0 = time.perf_counter()
                    got = sum(len(store.series_samples(row, end - 3_600_000, end)[0]) for row in rows[name].tolist())
                    times.append((time.perf_counter() - w0) * 1000)
                assert got > 0
        for name, (_, d) in arms.items():
            out[name] = {"ingest_cpu_s_per_million": cpu[name] / samples * 1e6,
                         "read_cold_ms_median": statistics.median(cold[name]),
                         "read_warm_ms_median": statistics.median(warm[name]),
                         "read_cold_ms": cold[name], "read_warm_ms": warm[name],
                         "chunk_file_bytes": d.stats()["chunk_file_bytes"]}
            print(name, {k: round(v, 3) for k, v in out[name].items() if not isinstance(v, list)}, flush=True)
            d.close(snapshot=False)
    print(json.dumps({"args": vars(a), "results": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
