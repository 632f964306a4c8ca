"""Where every MiB of a loaded store goes: a heap breakdown in process (a documented command, not a test).

    .venv/bin/python perf/bench_heap.py                          # 200,000 series x 2 h (~5 min, ~1 GB free)
    .venv/bin/python perf/bench_heap.py --series 40000 --trace   # with a tracemalloc table

Feeds perf/compare.py's seeded workload (perf/compare_workload.py, scaled to ``--series``) to one Store
in this process, in the server's shapes (backfill: 1,000 series x 60 ticks a write; the last
``--live-ticks`` ticks: 2,000 series x 1 sample), generating one block at a time so that nothing
of the generator stays resident but its per-series state. Then, after a garbage collection and
the store's own ``malloc_trim`` (what the retention loop does once a minute):

- (two retention passes first, as a server makes in two minutes)
- every object reachable from the store, walked once (``gc.get_referents``; an ndarray counted by
  the bytes it owns, ``nbytes``, plus its header), credited to the first named owner that
  reaches it: each label column of the index, each column of the head and the chunks, the
  chunks' bytes objects (payload and object headers apart), the rollups, the rest of the store;
- glibc's own account (``mallinfo2``: bytes in use, free inside the heap, mmapped);
- RSS growth minus the walked sum: what neither owner accounts for (allocator slack, pymalloc's
  free pools, the generator's per-series state).

``--trace`` also records the ingest with tracemalloc and prints the top allocation sites still
alive (file:line), and the live objects by type (slow: tracemalloc doubles the ingest's CPU).
Writes ``--json`` (default perf/results/bench_heap.json) and prints Markdown tables.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import sys
import time
import types
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare_workload import Workload, WorkloadConfig  # noqa: E402
from procstat import rss_bytes  # noqa: E402

from metricsd.memory import release_free_memory, tune_malloc  # noqa: E402
from metricsd.store.engine import Store  # noqa: E402
from metricsd.store.settings import StoreSettings  # noqa: E402

MiB = 2**20


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


def mallinfo() -> dict[str, float]:
    """glibc's totals over every arena, MiB: in use, free inside the heaps, mmapped blocks."""
    try:
        f = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return {}
    f.restype = _Mallinfo2
    m = f()
    return {"heap_mib": m.arena / MiB, "in_use_mib": m.uordblks / MiB, "free_in_heap_mib": m.fordblks / MiB,
            "mmapped_mib": m.hblkhd / MiB, "mmapped_blocks": float(m.hblks)}


def _fresh(labels: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """New string and tuple objects, as a server decoding a request has (bench_memory.py's)."""
    return tuple((k.encode().decode(), v.encode().decode()) for k, v in labels)


def workload(scale: float, hours: float, live_ticks: int) -> Workload:
    """The generator, made (and its first block drawn and dropped) before the RSS baseline: its
    series' labels and per-series state are not the store's."""
    return Workload(WorkloadConfig(ticks=round(hours * 360), live_ticks=live_ticks).scaled(scale))


def load(wl: Workload, settings: StoreSettings, gc_every: int = 0) -> tuple[Store, int, float, float]:
    """The workload in a fresh store: (store, samples, ingest CPU s, retention passes' CPU s). With
    ``gc_every``, a retention pass every that many live ticks, as the server's once a minute."""
    ticks, live_ticks = wl.config.ticks, wl.config.live_ticks
    labels, ids = wl.series, wl.source.series_ids.astype(np.uint64)
    n = len(labels)
    store = Store(settings)
    cpu = gc_cpu = 0.0
    sent, first = 0, True
    while sent < ticks:
        live = sent >= ticks - live_ticks
        k = 1 if live else min(60, ticks - live_ticks - sent)
        per = 2000 if live else 1000
        stamps, values = wl.sim.block(k)
        stamps = np.asarray(stamps, np.int64)
        block = np.ascontiguousarray(values[:, wl.source.cols].T)
        del values
        t0 = time.process_time()
        for s0 in range(0, n, per):
            s1 = min(s0 + per, n)
            sid = ids[s0:s1]
            new = {int(i): _fresh(labels[j]) for j, i in zip(range(s0, s1), sid.tolist(), strict=True)} \
                if first else None
            store.write(sid, np.full(s1 - s0, k), np.tile(stamps, s1 - s0), block[s0:s1].reshape(-1), new)
        cpu += time.process_time() - t0
        first = False
        sent += k
        del block
        if live and gc_every and (ticks - sent) % gc_every == 0:
            t0 = time.process_time()
            store.gc()
            gc_cpu += time.process_time() - t0
    return store, n * ticks, cpu, gc_cpu


_SKIP = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


class Walk:
    """Deep sizes of object graphs, each object counted once (for the first owner that reaches it)."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.types: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()

    def size(self, *roots: Any) -> int:
        total = 0
        stack = list(roots)
        while stack:
            o = stack.pop()
            if id(o) in self.seen or isinstance(o, _SKIP):
                continue
            self.seen.add(id(o))
            if isinstance(o, np.ndarray):
                s = sys.getsizeof(o)  # with the data it owns; a view's header alone
                if o.base is not None:
                    stack.append(o.base)
            else:
                s = sys.getsizeof(o)
                stack.extend(gc.get_referents(o))
            name = type(o).__name__
            self.types[name] += s
            self.counts[name] += 1
            total += s
        return total


def breakdown(store: Store) -> list[tuple[str, float, str]]:
    """(owner, MiB, note) for everything reachable from the store."""
    w = Walk()
    rows: list[tuple[str, float, str]] = []
    ix = store.index
    for name, col in sorted(ix.columns.items()):
        vals = w.size(col.values, col.ids)
        rows.append((f"index: label {name!r} values + dict ({len(col.values):,} distinct)", vals / MiB, "Python"))
        rows.append((f"index: label {name!r} codes + postings", w.size(col.codes, col.post_rows, col.post_start) / MiB,
                     "NumPy"))
    rows.append(("index: id, pod hash, alive, sorted ids/rows", w.size(ix.id_column, ix.pod_hash, ix.alive,
                                                                       ix._sorted_ids, ix._sorted_rows) / MiB, "NumPy"))
    rows.append(("index: batch row cache, seen hashes, pending", w.size(ix._batch_rows, ix._batch_seen,
                                                                        ix._pending) / MiB, "mixed"))
    rows.append(("index: selections and match tables", w.size(ix._selected, ix._tables) / MiB, "mixed"))
    h = store.head
    for name in ("vals", "flat", "varying", "base", "step", "wide", "wide_ts", "pos", "filled", "unsealed",
                 "last_ts", "expiry_floor"):
        a = getattr(h, name)
        rows.append((f"head: {name} {a.dtype} {a.shape}", w.size(a) / MiB, "NumPy"))
    c = store.chunks
    if isinstance(c.data, list):  # one bytes object a series (before session 40): for A/Bs
        payload = sum(len(b) for b in c.data) + sum(len(b) for b in c.open)
        objs = w.size(c.data, c.open)
        rows.append(("chunks: closed + open payload bytes", payload / MiB, "bytes objects"))
        rows.append(("chunks: bytes objects' headers + the two lists", (objs - payload) / MiB, "Python"))
        return _chunk_columns(w, store, rows)
    arenas = (c.data, c.open)
    payload = sum(a.live_bytes for a in arenas)
    held = sum(a.held_bytes for a in arenas)
    cols = w.size(*(a.at for a in arenas), *(a.size for a in arenas))
    objs = w.size(*arenas)
    n_slabs = sum(1 for a in arenas for sl in a.slabs if sl is not None)
    rows.append(("chunks: closed + open payload bytes", payload / MiB, f"{n_slabs:,} arena slabs"))
    rows.append(("chunks: arena slabs' dead and unused bytes (held - live)", (held - payload) / MiB,
                 "NumPy, unused tail not resident"))
    # the slabs are mmaps, which the walk sizes by their headers only: cols + objs is all but the slabs
    rows.append(("chunks: arena columns (at int64, size int32), slab lists", (cols + objs) / MiB, "NumPy"))
    return _chunk_columns(w, store, rows)


def _chunk_columns(w: Walk, store: Store, rows: list[tuple[str, float, str]]) -> list[tuple[str, float, str]]:
    c = store.chunks
    for name in ("n_closed", "max_ts", "samples", "open_min", "open_count", "open_hash", "t2", "v1", "v2", "shift",
                 "family"):
        a = getattr(c, name)
        rows.append((f"chunks: {name} {a.dtype}", w.size(a) / MiB, "NumPy"))
    rows.append(("rollups", w.size(store.rollups) / MiB, "mixed"))
    rows.append(("store: the rest", w.size(store) / MiB, "mixed"))
    return rows


def trace_top(snapshot: Any, n: int = 25) -> list[tuple[str, float, int]]:
    stats = snapshot.statistics("lineno")
    return [(f"{s.traceback[0].filename.split('/metricsd/')[-1]}:{s.traceback[0].lineno}", s.size / MiB, s.count)
            for s in stats[:n]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--series", type=int, default=200_000, help="compare.py's workload scaled to this many series")
    p.add_argument("--hours", type=float, default=2.0, help="of samples at 10 s; the last --live-ticks live")
    p.add_argument("--live-ticks", type=int, default=60)
    p.add_argument("--head-keep", type=int, default=StoreSettings().head_keep,
                   help="samples a block and a ring (default: the store's); an A/B of the ring's size")
    p.add_argument("--live-gc-every", type=int, default=0,
                   help="a retention pass every N live ticks (6: the server's once a minute at 10 s)")
    p.add_argument("--trace", action="store_true", help="tracemalloc the ingest (slow)")
    p.add_argument("--json", type=Path, default=HERE / "results" / "bench_heap.json")
    a = p.parse_args()
    tune_malloc()
    wl = workload(a.series / 40_000, a.hours, a.live_ticks)
    gc.collect()
    release_free_memory()
    rss0 = rss_bytes(os.getpid())
    m0 = mallinfo()
    if a.trace:
        import tracemalloc

        tracemalloc.start()
    store, samples, cpu, gc_cpu = load(wl, StoreSettings(retention_ms=round(a.hours * 3600_000) * 2,
                                                         head_keep=a.head_keep), a.live_gc_every)
    gc.collect()
    rss_live = rss_bytes(os.getpid())  # as the writes left it, before the settling passes
    store.gc()  # two retention passes, as the server's loop makes a minute apart: the newest closed
    store.gc()  # hour of rollups is packed by the second
    gc.collect()
    release_free_memory()
    rss = rss_bytes(os.getpid())
    m1 = mallinfo()
    out: dict[str, Any] = {"scale": a.series / 40_000, "series": store.index.n_alive, "samples": samples,
                           "ingest_cpu_s_per_million": cpu / samples * 1e6, "live_gc_cpu_s": gc_cpu,
                           "rss_live_mib": rss_live / MiB, "rss_before_mib": rss0 / MiB,
                           "rss_mib": rss / MiB, "growth_mib": (rss - rss0) / MiB, "mallinfo_before": m0,
                           "mallinfo_after": m1}
    if a.trace:
        snap = tracemalloc.take_snapshot()
        tracemalloc.stop()
        out["trace_top"] = trace_top(snap)
    rows = breakdown(store)
    walked = sum(r[1] for r in rows)
    out["rows"] = rows
    out["walked_mib"] = walked
    print(f"{out['series']:,} series, {samples:,} samples; ingest {out['ingest_cpu_s_per_million']:.3f} CPU s / M")
    print(f"retention passes during the live ticks: {gc_cpu:.3f} CPU s; RSS before the settling passes "
          f"{rss_live / MiB:.1f} MiB (growth {(rss_live - rss0) / MiB:.1f})")
    print(f"process RSS before {rss0 / MiB:.1f} MiB, after {rss / MiB:.1f}: growth {(rss - rss0) / MiB:.1f} MiB")
    print("mallinfo2 before", {k: round(v, 1) for k, v in m0.items()})
    print("mallinfo2 after ", {k: round(v, 1) for k, v in m1.items()})
    print("\n| owner | MiB | bytes / series | kind |\n| --- | --- | --- | --- |")
    n = max(out["series"], 1)
    for name, mib, note in sorted(rows, key=lambda r: -r[1]):
        if mib >= 0.05:
            print(f"| {name} | {mib:.1f} | {mib * MiB / n:.0f} | {note} |")
    print(f"| **walked from the store** | **{walked:.1f}** | {walked * MiB / n:.0f} | |")
    print(f"| RSS growth not walked (allocator, pymalloc pools, generator state) | "
          f"{(rss - rss0) / MiB - walked:.1f} | {((rss - rss0) / MiB - walked) * MiB / n:.0f} | |")
    if a.trace:
        print("\n| tracemalloc: live at the end, by site | MiB | blocks |\n| --- | --- | --- |")
        for site, mib, count in out["trace_top"]:
            print(f"| {site} | {mib:.1f} | {count:,} |")
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
