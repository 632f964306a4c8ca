"""Sending data onward, measured: remote write out in CPU seconds per million samples (queueing
through the tee, the buffer, encoding, snappy and HTTP to a real VictoriaMetrics), and one hour of
the benchmark workload written as Parquet (CPU seconds, bytes per sample on disk).

    .venv/bin/python perf/bench_onward.py            # 40,000 series (10,000 pods), 10 s interval
    .venv/bin/python perf/bench_onward.py --quick    # a tenth of the pods

CPU is this process's (time.process_time), so VictoriaMetrics' own work is not counted; the store
write that precedes the tee in a real process is not counted either (it is the ingest benchmark's).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from prometheus_client import CollectorRegistry

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.clock import SystemClock
from metricsd.onward.hourly import HOUR_MS, hour_files
from metricsd.onward.target import TargetConfig
from metricsd.onward.tee import Onward
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

INTERVAL_MS = 10_000


def _sim(pods: int, start_ms: int) -> Simulator:
    return Simulator(SimConfig(pods=pods, workloads=11, nodes=max(1, pods // 100), seed=1, interval_ms=INTERVAL_MS,
                               big_workload_pods=pods // 2), start_ms)


async def remote_write_out(pods: int, ticks: int, shape: str, tmp: Path) -> dict[str, float]:
    """Queue ``ticks`` ticks of every series through the tee and send them to a real
    VictoriaMetrics; CPU per million samples. live: the sender keeps up, one tick a round (each
    series once a request); backlog: everything is queued first, then sent (a receiver back after
    an outage: several samples a series a request)."""
    port = _free_port()
    vm = subprocess.Popen(["victoria-metrics", f"-storageDataPath={tmp / ('vm-' + shape)}",
                           f"-httpListenAddr=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_http(f"http://127.0.0.1:{port}/health")
        clock = SystemClock()
        target = TargetConfig(url=f"http://127.0.0.1:{port}/api/v1/write", name="vm", protocol="1.0")
        onward = Onward(tmp / f"onward-{shape}", [target], CollectorRegistry(), clock)
        now = clock.now_ms()
        sim = _sim(pods, now - ticks * INTERVAL_MS)
        reqs = []
        for i in range(ticks):  # as an agent sends: a series' labels in its first request only
            ts, values = sim.next_tick()
            reqs.append(write_requests(sim, ts, values, max_samples=2_000, send_labels_for=None if i == 0 else set()))
        total = sum(len(r.timestamps) for tick in reqs for r in tick)
        prof = cProfile.Profile() if os.environ.get("BENCH_PROFILE") else None
        if prof is not None:
            prof.enable()
        t0, w0 = time.process_time(), time.perf_counter()
        if shape == "backlog":
            for tick in reqs:
                for r in tick:
                    onward.queue(r)
            onward.start()
            while onward.buffer.pending("vm"):
                await asyncio.sleep(0.01)
        else:
            onward.start()
            for tick in reqs:
                for r in tick:
                    onward.queue(r)
                while onward.buffer.pending("vm"):
                    await asyncio.sleep(0.002)
        cpu, wall = time.process_time() - t0, time.perf_counter() - w0
        if prof is not None:
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)
        sent = onward.metrics.sent.labels("vm")._value.get()
        await onward.close()
        assert sent == total, (sent, total)
        return {"samples": total, "cpu_s": cpu, "wall_s": wall, "cpu_s_per_million": cpu / total * 1e6}
    finally:
        vm.terminate()
        vm.wait()


async def parquet_hour(pods: int, tmp: Path) -> dict[str, float]:
    hour = (int(time.time() * 1000) // HOUR_MS - 2) * HOUR_MS
    backend = LocalBackend(StoreAPI(Store(), "bench", SystemClock()))
    sim = _sim(pods, hour)
    while sim.next_timestamp_ms < hour + HOUR_MS:
        ts, values = sim.block(min(60, (hour + HOUR_MS - sim.next_timestamp_ms) // INTERVAL_MS))
        for req in write_requests(sim, ts, values, max_samples=60_000, send_labels_for=None):
            await backend.write(req)
    t0 = time.process_time()
    files = await hour_files(backend, hour)
    cpu = time.process_time() - t0
    samples = int(files.manifest["samples"])  # type: ignore[call-overload]
    return {"samples": samples, "series": float(files.manifest["series"]), "cpu_s": cpu,  # type: ignore[arg-type]
            "samples_bytes_per_sample": len(files.samples) / samples,
            "all_bytes_per_sample": (len(files.samples) + len(files.rollups)) / samples}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str) -> None:
    import urllib.request

    for _ in range(200):
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer")


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    pods = 1_000 if args.quick else 10_000
    print(f"load: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for r in range(args.rounds):
            for shape, ticks in (("live", 30), ("backlog", 30)):
                print(f"round {r + 1} remote write out, {shape}: {await remote_write_out(pods, ticks, shape, tmp)}",
                      flush=True)
        print(f"parquet, one hour of {pods} pods: {await parquet_hour(pods, tmp)}", flush=True)
        print(f"parquet, one hour of metricsd up's 200 pods: {await parquet_hour(200, tmp)}", flush=True)
    print(f"load: {os.getloadavg()}")


if __name__ == "__main__":
    asyncio.run(main())
