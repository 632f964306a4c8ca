"""The memory a snapshot takes above the store it writes, and the time to write and load it (a
documented command, not a test).

    .venv/bin/python perf/bench_snapshot_peak.py --series 40000 --ticks 720     # 2 h at 10 s
    .venv/bin/python perf/bench_snapshot_peak.py --series 40000 --tracemalloc   # where it goes
    .venv/bin/python perf/bench_snapshot_peak.py --load FILE   # the time to load a file kept with --keep

Builds a Store in process from the seeded side-by-side workload (perf/compare_workload.py, as
bench_memory.py does), trims the heap, then resets the kernel's high-water mark
(/proc/self/clear_refs "5") and takes a snapshot as a durable store does (capture, then
write_snapshot), and reads VmHWM: the peak above the settled RSS is what the snapshot cost. Then
it loads the file back (read_snapshot + restore) in a child process and times it. With
``--tracemalloc`` it also prints the Python allocations' peak during capture and during the write,
and the largest allocation sites. The server's figure is perf/bench_rss_server.py ``--data-dir``;
this isolates the snapshot. For an A/B, run it with another commit's package first on the path
(``PYTHONPATH=/tmp/base``).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
from compare_workload import Workload, WorkloadConfig
from procstat import peak_rss_bytes, rss_bytes

from metricsd.memory import release_free_memory, tune_malloc
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings
from metricsd.store.snapshot import read_snapshot, restore, write_snapshot

try:  # what a durable store captures (metricsd/store/durable.py); before it, the whole image
    from metricsd.store.snapshot_write import capture_lean as capture
except ImportError:
    from metricsd.store.snapshot import capture  # type: ignore[assignment]
from metricsd.store.wal.log import WalPosition

MIB = 2**20


def build(series: int, ticks: int) -> Store:
    wl = Workload(WorkloadConfig(ticks=ticks, live_ticks=0).scaled(series / 40_000))
    labels = wl.series
    ids = wl.source.series_ids.astype(np.uint64)
    n = len(labels)
    store = Store(StoreSettings(retention_ms=ticks * 10_000 * 2))
    sent, first = 0, True
    while sent < ticks:
        k = min(60, ticks - sent)
        stamps, values = wl.sim.block(k)
        values = np.ascontiguousarray(np.asarray(values)[:, wl.source.cols].T)
        for s0 in range(0, n, 1000):
            s1 = min(s0 + 1000, n)
            sid = ids[s0:s1]
            new = {int(i): tuple((a.encode().decode(), b.encode().decode()) for a, b in labels[j])
                   for j, i in zip(range(s0, s1), sid.tolist(), strict=True)} if first else None
            store.write(sid, np.full(s1 - s0, k), np.tile(np.asarray(stamps, np.int64), s1 - s0),
                        values[s0:s1].reshape(-1), new)
        sent += k
        first = False
    return store


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def load(path: str) -> None:
    """In the child: time read_snapshot + restore, print JSON."""
    c0 = time.process_time()
    t0 = time.perf_counter()
    img = read_snapshot(Path(path))
    t1 = time.perf_counter()
    restore(img, StoreSettings())
    t2 = time.perf_counter()
    print(json.dumps({"read_s": t1 - t0, "restore_s": t2 - t1, "load_cpu_s": time.process_time() - c0,
                      "load_peak_mib": peak_rss_bytes_self() / MIB}))


def peak_rss_bytes_self() -> int:
    import os

    return peak_rss_bytes(os.getpid())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--series", type=int, default=40_000)
    p.add_argument("--ticks", type=int, default=720, help="samples a series (720: 2 h at 10 s)")
    p.add_argument("--tracemalloc", action="store_true")
    p.add_argument("--keep", type=Path, help="copy the snapshot file here")
    p.add_argument("--load", help="only time loading this snapshot file (read_snapshot + restore)")
    a = p.parse_args()
    if a.load:
        load(a.load)
        return 0
    import os

    tune_malloc()
    pid = os.getpid()
    store = build(a.series, a.ticks)
    gc.collect()
    release_free_memory()
    settled = rss_bytes(pid)
    out: dict[str, Any] = {"series": a.series, "ticks": a.ticks, "settled_mib": settled / MIB}
    with tempfile.TemporaryDirectory() as tmp:
        if a.tracemalloc:
            tracemalloc.start(5)
        reset_peak()
        t0 = time.perf_counter()
        img = capture(store, WalPosition(1, 0))
        t1 = time.perf_counter()
        out["capture_peak_mib"] = (peak_rss_bytes(pid) - settled) / MIB
        if a.tracemalloc:
            out["capture_traced_peak_mib"] = tracemalloc.get_traced_memory()[1] / MIB
            snap_c = tracemalloc.take_snapshot()
            tracemalloc.reset_peak()
        path, size = write_snapshot(Path(tmp), img)
        t2 = time.perf_counter()
        out["peak_over_settled_mib"] = (peak_rss_bytes(pid) - settled) / MIB
        out["peak_over_settled"] = peak_rss_bytes(pid) / settled
        out["capture_s"], out["write_s"], out["file_mib"] = t1 - t0, t2 - t1, size / MIB
        if a.tracemalloc:
            out["write_traced_peak_mib"] = tracemalloc.get_traced_memory()[1] / MIB
            tracemalloc.stop()
            print("capture: largest live allocations")
            for st in snap_c.statistics("lineno")[:8]:
                print("  ", st)
        del img
        if a.keep:
            shutil.copyfile(path, a.keep)
        child = subprocess.run([sys.executable, __file__, "--load", str(path)], capture_output=True, text=True,
                               check=True)
        out.update(json.loads(child.stdout))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
