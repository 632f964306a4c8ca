"""Benchmark of the store's durability (a documented command, not a test).

    .venv/bin/python perf/bench_durability.py            # 10 M samples restart; ingest with and without WAL
    .venv/bin/python perf/bench_durability.py --quick    # 2 M samples, shorter ingest runs

Measures, on simulated pod metrics (metricsd/agent/simulate.py, seeded):
1. restart of a store holding ~10 M samples (1,250 pods = 10,100 series, 990 ticks of 10 s), in
   this process: (a) replaying the whole WAL with no snapshot; (b) loading a snapshot with nothing
   to replay; plus the snapshot's write time and size, and the WAL's bytes per sample;
2. the WAL's cost on ingest over gRPC: a plain store (`metricsd up --no-simulate`) against a
   durable one (`metricsd store --data-dir`) under each fsync policy, in the backfill shape
   (1,000 series x 60 samples a request) and the agents' live shape (1,000 series x 1 sample):
   samples/s and server CPU seconds per million samples (from /proc).
Prints a Markdown table to paste into perf/RESULTS.md and writes perf/results/bench_durability.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_store import BIN, StoreProcess, ingest
from procstat import cpu_seconds

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.rpc.client import MetricsClient
from metricsd.store.durable import open_store

HERE = Path(__file__).resolve().parent
T0 = 1_700_000_000_000


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def restart(pods: int, ticks: int, work: Path) -> dict[str, float]:
    data = work / "restart"
    sim = Simulator(SimConfig(pods=pods, workloads=50, nodes=max(5, pods // 50), seed=1), T0)
    store, d = open_store(data, fsync="never")
    t0, c0 = time.perf_counter(), time.process_time()
    first, done, sent = True, 0, 0
    while done < ticks:
        n = min(60, ticks - done)
        ts, values = sim.block(n)
        for req in write_requests(sim, ts, values, max_samples=60 * 1000, send_labels_for=None if first else set()):
            d.write(req)
            sent += len(req.values)
        first, done = False, done + n
    build_s, build_cpu = time.perf_counter() - t0, time.process_time() - c0
    want = store.stats()
    d.close(snapshot=False)
    wal_bytes = _dir_bytes(data / "wal")
    del store, d
    # (a) the whole WAL, no snapshot
    c0 = time.process_time()
    store, d = open_store(data, fsync="never")
    replay_cpu = time.process_time() - c0
    assert store.stats() == want, (store.stats(), want)
    replay_s = d.recovery.wal_replay_s
    t0 = time.perf_counter()
    snap = d.snapshot_now()
    snap_write_s = time.perf_counter() - t0
    snap_bytes = snap.stat().st_size
    d.close(snapshot=False)
    del store, d
    # (b) the snapshot, nothing to replay
    c0 = time.process_time()
    store, d = open_store(data, fsync="never")
    load_cpu = time.process_time() - c0
    assert store.stats() == want and d.recovery.wal_records == 0
    out = {"series": int(want["series"]), "samples": int(want["samples"]), "samples_sent": sent,
           "ingest_in_process_s": build_s, "ingest_in_process_cpu_s_per_million": build_cpu / sent * 1e6,
           "wal_bytes": wal_bytes, "wal_bytes_per_sample": wal_bytes / sent,
           "wal_replay_s": replay_s, "wal_replay_cpu_s": replay_cpu, "wal_replay_samples_per_s": sent / replay_s,
           "snapshot_write_s": snap_write_s, "snapshot_bytes": snap_bytes,
           "snapshot_bytes_per_sample": snap_bytes / int(want["samples"]),
           "snapshot_load_s": d.recovery.snapshot_load_s, "snapshot_load_cpu_s": load_cpu}
    d.close(snapshot=False)
    return out


def _feed(write: object, sim: Simulator, ticks: int, per_req: int, first: bool) -> tuple[int, float, float]:
    """Feed ``ticks`` ticks, ``per_req`` ticks x 1,000 series a request; (samples, wall s, CPU s)."""
    sent, done = 0, 0
    wall = cpu = 0.0
    while done < ticks:
        n = min(per_req, ticks - done)
        ts, values = sim.block(n)
        reqs = write_requests(sim, ts, values, max_samples=n * 1000, send_labels_for=None if first else set())
        t0, c0 = time.perf_counter(), time.process_time()
        for req in reqs:
            write(req)  # type: ignore[operator]
        wall += time.perf_counter() - t0
        cpu += time.process_time() - c0
        sent += values.size
        first, done = False, done + n
    return sent, wall, cpu


def wal_cost_in_process(pods: int, backfill_ticks: int, live_ticks: int, work: Path) -> dict[str, object]:
    """The same batches into a plain Store (through StoreAPI) and a durable one: CPU s per million."""
    from metricsd.store.api import StoreAPI
    from metricsd.store.engine import Store

    out: dict[str, object] = {}
    for kind in ("none", "never", "always"):
        sim = Simulator(SimConfig(pods=pods, workloads=50, nodes=max(5, pods // 50), seed=1), T0)
        if kind == "none":
            write = StoreAPI(Store()).write
            d = None
        else:
            _, d = open_store(work / f"inproc-{kind}", fsync=kind)
            write = d.api().write
        n1, w1, c1 = _feed(write, sim, backfill_ticks, 60, True)
        n2, w2, c2 = _feed(write, sim, live_ticks, 1, False)
        out[kind] = {"backfill_cpu_s_per_million": c1 / n1 * 1e6, "backfill_samples_per_s": n1 / w1,
                     "live_cpu_s_per_million": c2 / n2 * 1e6, "live_samples_per_s": n2 / w2}
        if d is not None:
            d.close(snapshot=False)
            shutil.rmtree(work / f"inproc-{kind}")
    return out


class Server(StoreProcess):
    """A store process without a WAL (``none``) or a durable one with the given fsync policy."""

    def __init__(self, kind: str, work: Path) -> None:
        self.data = work / f"ingest-{kind}"

        def command(port: int) -> list[str]:
            if kind == "none":
                return [str(BIN), "--log-level", "WARNING", "up", "--no-simulate", "--no-consumers", "--grpc-port",
                        str(port)]
            return [sys.executable, "-m", "metricsd", "--log-level", "WARNING", "store", "--data-dir",
                    str(self.data), "--grpc-port", str(port), "--wal-fsync", kind, "--snapshot-every", "86400"]

        super().__init__(command)


async def ingest_cost(kind: str, pods: int, backfill_ticks: int, live_ticks: int, work: Path) -> dict[str, object]:
    server = Server(kind, work)
    async with MetricsClient(server.addr, timeout_s=60) as client:
        await server.wait_ready(client)
        sim = Simulator(SimConfig(pods=pods, workloads=50, nodes=max(5, pods // 50), seed=1), T0)
        c0 = cpu_seconds(server.proc.pid)
        backfill = await ingest(client, server.proc.pid, sim, backfill_ticks, 60, 1000, first=True)
        live = await ingest(client, server.proc.pid, sim, live_ticks, 1, 1000, first=False)
        total_cpu = cpu_seconds(server.proc.pid) - c0
    server.stop()
    wal = _dir_bytes(server.data / "wal") if server.data.exists() else 0
    return {"backfill_shape": backfill, "live_shape": live, "server_cpu_s": total_cpu, "wal_bytes": wal}


async def main_async(args: argparse.Namespace, work: Path) -> dict[str, object]:
    out: dict[str, object] = {"command": " ".join([".venv/bin/python", "perf/bench_durability.py", *sys.argv[1:]]),
                              "cores": os.cpu_count(), "python": platform.python_version()}
    out["restart"] = restart(args.pods, args.ticks, work)
    shutil.rmtree(work / "restart")
    out["in_process"] = wal_cost_in_process(args.pods, args.backfill_ticks, args.live_ticks, work)
    # over gRPC: each kind twice, in alternating order, keeping the cheaper run (the machine is shared)
    runs: dict[str, dict[str, object]] = {}
    kinds = ["none", "never", "interval", "always"]
    for rep in range(args.repeat):
        for kind in kinds if rep % 2 == 0 else kinds[::-1]:
            r = await ingest_cost(kind, args.pods, args.backfill_ticks, args.live_ticks, work)
            if kind not in runs or r["server_cpu_s"] < runs[kind]["server_cpu_s"]:  # type: ignore[operator]
                runs[kind] = r
            shutil.rmtree(work / f"ingest-{kind}", ignore_errors=True)
    out["ingest"] = {k: runs[k] for k in kinds}
    return out


def markdown(r: dict) -> str:
    rs = r["restart"]
    head = ["| store | backfill shape: samples/s; CPU s/M | live shape: samples/s; CPU s/M |", "| --- | --- | --- |"]
    rows = [
        f"Restart of a store holding {rs['samples']:,} samples ({rs['series']:,} series):",
        "",
        "| measure | figure |",
        "| --- | --- |",
        f"| WAL replay, no snapshot (all {rs['samples_sent']:,} samples) | {rs['wal_replay_s']:.2f} s "
        f"({rs['wal_replay_samples_per_s']:,.0f} samples/s) |",
        f"| snapshot load, nothing to replay | {rs['snapshot_load_s']:.2f} s |",
        f"| snapshot write (capture + file + fsync) | {rs['snapshot_write_s']:.2f} s, "
        f"{rs['snapshot_bytes'] / 2**20:.0f} MiB ({rs['snapshot_bytes_per_sample']:.2f} bytes/sample) |",
        f"| WAL on disk | {rs['wal_bytes_per_sample']:.2f} bytes/sample |",
        "",
        "The same batches in process (no gRPC), the WAL's own cost:",
        "",
        *head,
    ]
    names = {"none": "no WAL (StoreAPI)", "never": "WAL, fsync never", "always": "WAL, fsync always"}
    for kind, v in r["in_process"].items():
        rows.append(f"| {names[kind]} | {v['backfill_samples_per_s']:,.0f}; {v['backfill_cpu_s_per_million']:.2f} | "
                    f"{v['live_samples_per_s']:,.0f}; {v['live_cpu_s_per_million']:.2f} |")
    rows += ["", "Ingest over gRPC, one store process (server CPU from /proc):", "", *head]
    names = {"none": "no WAL (`metricsd up`)", "never": "WAL, fsync never", "interval": "WAL, fsync interval (1 s)",
             "always": "WAL, fsync always"}
    for kind, v in r["ingest"].items():
        b, li = v["backfill_shape"], v["live_shape"]
        rows.append(f"| {names[kind]} | {b['samples_per_s']:,.0f}; {b['server_cpu_s_per_million']:.2f} | "
                    f"{li['samples_per_s']:,.0f}; {li['server_cpu_s_per_million']:.2f} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="~2 M samples for the restart, shorter ingest runs")
    p.add_argument("--pods", type=int, default=1250, help="pods (8 series each)")
    p.add_argument("--ticks", type=int, default=990, help="ticks of 10 s in the restart store")
    p.add_argument("--backfill-ticks", type=int, default=360)
    p.add_argument("--live-ticks", type=int, default=30)
    p.add_argument("--repeat", type=int, default=2, help="gRPC ingest runs per store kind (the cheapest is kept)")
    args = p.parse_args()
    if args.quick:
        args.ticks, args.backfill_ticks, args.live_ticks, args.repeat = 200, 120, 10, 1
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="bench-durability-") as tmp:
        r = asyncio.run(main_async(args, Path(tmp)))
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "bench_durability.json").write_text(json.dumps(r, indent=2))
    print(f"command: {r['command']}  (cores: {r['cores']}, Python {r['python']})")
    print(markdown(r))


if __name__ == "__main__":
    main()
