"""Sending data onward, measured: remote write out in CPU seconds per million samples (queueing
through the tee, the buffer, encoding, snappy and HTTP to a real VictoriaMetrics), and one hour of
the benchmark workload written as Parquet (CPU seconds, bytes per sample on disk).

    .venv/bin/python perf/bench_onward.py --rounds 1   # remote write: 80,400 series (10,000 pods);
                                                       # Parquet: 40,200 series (5,000 pods), 10 s interval
    .venv/bin/python perf/bench_onward.py --quick      # a tenth of the pods
    .venv/bin/python perf/bench_onward.py --only remote --ab 6eb9f36 --rounds 3
        # A/B: remote write out of the code at a git revision (A) and of this tree (B), interleaved
        # in one run (each measurement in its own process, A B A B ...), on the same machine load
    .venv/bin/python perf/bench_onward.py --only remote --protocol 2.0
        # remote write 2.0, to a `metricsd up` (VictoriaMetrics 1.79 takes 1.0 only)

CPU is this process's (time.process_time), so the receiver's own work is not counted; the store
write that precedes the tee in a real process is not counted either (it is the ingest benchmark's).
BENCH_PROFILE=1 prints a cProfile (CPU time) of the ticks after the first (BENCH_PROFILE_SORT=cumulative,
BENCH_PROFILE_LINES=40 to see more); BENCH_PYSPY=FILE records them with py-spy (native frames, raw stacks).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, os.environ.get("BENCH_CODE", sys.path[0]))  # --ab: the tree under test first

import numpy as np
from prometheus_client import CollectorRegistry

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.clock import SystemClock
from metricsd.onward.hourly import HOUR_MS, hour_files
from metricsd.onward.target import TargetConfig
from metricsd.onward.tee import Onward
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import matchers_from_pb
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

ROOT = Path(__file__).resolve().parents[1]
INTERVAL_MS = 10_000


def _sim(pods: int, start_ms: int) -> Simulator:
    return Simulator(SimConfig(pods=pods, workloads=11, nodes=max(1, pods // 100), seed=1, interval_ms=INTERVAL_MS,
                               big_workload_pods=pods // 2), start_ms)


def _receiver(protocol: str, tmp: Path, shape: str) -> tuple[subprocess.Popen[bytes], str]:
    """A real receiver on a free port: VictoriaMetrics for 1.0, `metricsd up` for 2.0."""
    port = _free_port()
    if protocol == "1.0":
        argv = ["victoria-metrics", f"-storageDataPath={tmp / ('vm-' + shape)}", f"-httpListenAddr=127.0.0.1:{port}"]
        health = "/health"
    else:
        argv = [sys.executable, "-m", "metricsd", "up", "--pods", "1", "--no-consumers", "--host", "127.0.0.1",
                "--http-port", str(port), "--grpc-port", str(_free_port())]
        health = "/api/v1/status/buildinfo"
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_http(f"http://127.0.0.1:{port}{health}")
    return proc, f"http://127.0.0.1:{port}/api/v1/write"


async def remote_write_out(pods: int, ticks: int, shape: str, tmp: Path, protocol: str = "1.0",
                           max_samples_per_send: int | None = None) -> dict[str, float]:
    """Queue ``ticks`` ticks of every series through the tee and send them to a real receiver;
    CPU per million samples. live: the sender keeps up, one tick a round (each series once a
    request); backlog: the first tick is sent, then the others are queued and sent at once (a
    receiver back after an outage: several samples a series a request). The first tick, where the
    tee and the sender learn every series' labels (a cost per series, once), is also reported
    apart: ``steady_cpu_s_per_million`` is the CPU of the other ticks per million of their samples.
    Waiting for the sender to drain polls every 20 ms (a poll is an event-loop wake-up, counted in
    the CPU: 2 ms polls cost about 0.2 CPU s per million samples in the live shape)."""
    vm, url = _receiver(protocol, tmp, shape)
    try:
        clock = SystemClock()
        target = TargetConfig(url=url, name="vm", protocol=protocol,
                              **({"max_samples_per_send": max_samples_per_send} if max_samples_per_send else {}))
        onward = Onward(tmp / f"onward-{shape}", [target], CollectorRegistry(), clock)
        now = clock.now_ms()
        sim = _sim(pods, now - ticks * INTERVAL_MS)
        reqs = []
        for i in range(ticks):  # as an agent sends: a series' labels in its first request only
            ts, values = sim.next_tick()
            reqs.append(write_requests(sim, ts, values, max_samples=2_000, send_labels_for=None if i == 0 else set()))
        total = sum(len(r.timestamps) for tick in reqs for r in tick)
        first_samples = sum(len(r.timestamps) for r in reqs[0])

        async def drained() -> None:
            while onward.buffer.pending("vm"):
                await asyncio.sleep(0.02)

        prof = cProfile.Profile(time.process_time) if os.environ.get("BENCH_PROFILE") else None  # CPU, not wall
        t0, w0 = time.process_time(), time.perf_counter()
        onward.start()
        for r in reqs[0]:
            _queue(onward, r)
        await drained()
        first = time.process_time() - t0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        if prof is not None:
            prof.enable()
        spy = _py_spy(os.environ.get("BENCH_PYSPY"))
        for tick in reqs[1:]:
            for r in tick:
                _queue(onward, r)
            if shape == "live":
                await drained()
        await drained()
        cpu, wall = time.process_time() - t0, time.perf_counter() - w0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait()
        if prof is not None:
            prof.disable()
            pstats.Stats(prof).sort_stats(os.environ.get("BENCH_PROFILE_SORT", "tottime")).print_stats(
                int(os.environ.get("BENCH_PROFILE_LINES", "15")))
        sent = onward.metrics.sent.labels("vm")._value.get()
        failed = onward.metrics.failed.labels("vm")._value.get()
        await onward.close()
        assert sent == total, (sent, failed, total)
        return {"samples": total, "cpu_s": cpu, "wall_s": wall, "cpu_s_per_million": cpu / total * 1e6,
                "first_tick_cpu_s": first,
                "steady_cpu_s_per_million": (cpu - first) / (total - first_samples) * 1e6,
                "steady_page_faults_per_million": faults / (total - first_samples) * 1e6}
    finally:
        vm.terminate()
        vm.wait()


def _py_spy(out: str | None) -> subprocess.Popen[bytes] | None:
    """BENCH_PYSPY=FILE: py-spy (native frames, raw stacks) records this process from here on
    (the ticks after the first), so the profile holds the steady part only."""
    if not out:
        return None
    spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-r", "250", "--native", "-f", "raw",
                            "-o", out, "--pid", str(os.getpid())], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # py-spy attaches before the measured work
    return spy


def _queue(onward: Onward, req: pb.WriteRequest) -> None:
    """What OnwardBackend.write does around the store's write: the labels handshake, then the queue."""
    if hasattr(onward, "admit"):
        admitted = onward.admit(req)
        assert not admitted.unknown
        onward.queue(req, admitted)
    else:  # --ab: the code before admit()
        assert not onward.unknown(req)
        onward.queue(req)


async def parquet_hour(pods: int, rounds: int = 1) -> list[dict[str, float | str]]:
    """One hour of ``pods`` pods written as Parquet, ``rounds`` times: CPU of ``hour_files``, and of
    its parts (the reads turned into columns, the two tables, the Parquet encoding). Where this
    code has a columnar read (hourly.ReadColumns), the hour is also built through an adapter over
    ``Store.read`` (NumPy arrays, no protobuf): what the read costs once the store answers columns."""
    from metricsd.onward import hourly  # the module whose steps are timed

    hour = (int(time.time() * 1000) // HOUR_MS - 2) * HOUR_MS
    store = Store()
    backend = LocalBackend(StoreAPI(store, "bench", SystemClock()))
    sim = _sim(pods, hour)
    while sim.next_timestamp_ms < hour + HOUR_MS:
        ts, values = sim.block(min(60, (hour + HOUR_MS - sim.next_timestamp_ms) // INTERVAL_MS))
        for req in write_requests(sim, ts, values, max_samples=60_000, send_labels_for=None):
            await backend.write(req)
    parts: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        def run(*a: Any, **k: Any) -> Any:
            t = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                parts[name] = parts.get(name, 0.0) + time.process_time() - t
        return run

    from metricsd.onward import parquet

    # The code before this work built the tables in hourly.py and encoded them in
    # parquet.to_parquet; now to_parquet builds and encodes a row group at a time.
    whole = hasattr(hourly, "samples_table")
    for name in ("samples_table", "rollups_table"):
        owner = hourly if whole else parquet
        setattr(owner, name, timed(name, getattr(owner, name)))
    hourly.to_parquet = timed("to_parquet", hourly.to_parquet)
    # A proxy's backend answers messages only (no read_columns of a store in its process): what
    # hour_files does with it is what a cluster's proxy-1 does (protobuf reads before 2026-11-27 session 33,
    # the Read's columnar flag since), over this process's store instead of the fan-out.
    messages = _MessagesOnly(backend)
    variants: list[tuple[str, Any]] = [("messages only, as proxy-1", None)]
    if hasattr(hourly, "backend_columns"):  # what `metricsd up` runs since 2026-11-27 session 33
        variants.append(("LocalBackend.read_columns, as metricsd up", "direct"))
    try:  # what `metricsd up` runs since 2026-11-27 session 35: the store's rows as columns, no selector
        from metricsd.store.hourread import StoreHour
        variants.append(("StoreHour, as metricsd up", StoreHour(backend.api)))
    except ImportError:
        pass
    if hasattr(hourly, "store_columns"):  # what `metricsd up` ran before: Store.read's arrays, per group
        columnar = hourly.store_columns(store)

        async def read_columns(req: pb.ReadRequest) -> Any:
            t = time.process_time()
            try:
                return await columnar(req)
            finally:
                parts["read_columns"] = parts.get("read_columns", 0.0) + time.process_time() - t
        variants.append(("columnar read (hourly.store_columns, as metricsd up before)", read_columns))
    elif hasattr(hourly, "ReadColumns"):
        async def read_columns(req: pb.ReadRequest) -> Any:
            t = time.process_time()
            got = [s for s in store.read(matchers_from_pb(req.matchers), req.start_ms, req.end_ms) if len(s.timestamps)]
            cols = hourly.SampleColumns([s.labels for s in got], np.array([len(s.timestamps) for s in got], np.int64),
                                        np.concatenate([s.timestamps for s in got]),
                                        np.concatenate([s.values for s in got]))
            parts["read_columns"] = parts.get("read_columns", 0.0) + time.process_time() - t
            return cols
        variants.append(("columnar read (Store.read adapter)", read_columns))
    out: list[dict[str, float | str]] = []
    for _ in range(rounds):
        for what, reader in variants:
            parts.clear()
            t0 = time.process_time()
            files = await (hour_files(messages, hour) if reader is None else hour_files(backend, hour) if
                           reader == "direct" else hour_files(backend, hour, source=reader) if
                           hasattr(reader, "read") else hour_files(backend, hour, reader))
            cpu = time.process_time() - t0
            samples = int(files.manifest["samples"])  # type: ignore[call-overload]
            out.append({"what": f"{pods} pods, {what}", "samples": samples,
                        "series": float(files.manifest["series"]), "cpu_s": cpu,  # type: ignore[arg-type]
                        **_parquet_parts(cpu, parts, whole),
                        "samples_bytes_per_sample": len(files.samples) / samples,
                        "all_bytes_per_sample": (len(files.samples) + len(files.rollups)) / samples,
                        "load": os.getloadavg()[0]})
    return out


class _MessagesOnly:
    """A backend's message methods alone, as a proxy offers them."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def read(self, req: pb.ReadRequest) -> pb.ReadResponse:
        return await self._inner.read(req)

    async def list_series(self, req: pb.ListSeriesRequest) -> pb.ListSeriesResponse:
        return await self._inner.list_series(req)

    async def rollups(self, req: pb.ReadRequest) -> pb.RollupsResponse:
        return await self._inner.rollups(req)


def _parquet_parts(cpu: float, parts: dict[str, float], whole: bool) -> dict[str, float]:
    """CPU of the hour's parts: the reads (and everything else), building the tables, encoding."""
    tables = parts.get("samples_table", 0.0) + parts.get("rollups_table", 0.0)
    writing = parts.get("to_parquet", 0.0) + (tables if whole else 0.0)
    out = {"reads_s": cpu - writing, "tables_s": tables, "encode_s": writing - tables}
    if "read_columns" in parts:
        out["of_which_read_columns_s"] = parts["read_columns"]
    return out


def _free_port() -> int:
    from metricsd.ports import free_port

    return free_port()


def _wait_http(url: str) -> None:
    import urllib.request

    for _ in range(200):
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer")


def _ab(rev: str, args: argparse.Namespace) -> None:
    """Remote write out of the code at ``rev`` (A) and of this tree (B), interleaved, each
    measurement in a fresh process (so neither warms the other's caches)."""
    with tempfile.TemporaryDirectory() as d:
        old = Path(d) / "a"
        old.mkdir()
        archive = subprocess.run(["git", "-C", args.repo, "archive", rev, "metricsd"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        subject = subprocess.run(["git", "-C", args.repo, "log", "-1", "--format=%h %s", rev], text=True,
                                 capture_output=True).stdout.strip()
        print(f"A: {subject[:100]}")
        print("B: this tree")
        steady: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            if args.only == "parquet":
                for name, code in (("A", old), ("B", ROOT)):
                    argv = [sys.executable, __file__, "--only", "parquet", "--rounds", "1", "--json",
                            "--parquet-pods", str(args.parquet_pods)] + (["--quick"] if args.quick else [])
                    out = subprocess.run(argv, env=os.environ | {"BENCH_CODE": str(code)}, check=True, text=True,
                                         capture_output=True).stdout
                    for line in out.strip().splitlines():
                        print(f"round {r + 1} parquet {name}: {line}", flush=True)
                continue
            for shape in ("live", "backlog"):
                for name, code in (("A", old), ("B", ROOT)):
                    argv = [sys.executable, __file__, "--only", "remote", "--shape", shape, "--rounds", "1",
                            "--protocol", args.protocol, "--json"] + (["--quick"] if args.quick else [])
                    if args.max_samples_per_send:
                        argv += ["--max-samples-per-send", str(args.max_samples_per_send)]
                    out = subprocess.run(argv, env=os.environ | {"BENCH_CODE": str(code)}, check=True, text=True,
                                         capture_output=True).stdout
                    got = json.loads(out.strip().splitlines()[-1])
                    steady.setdefault((shape, name), []).append(got.get("steady_cpu_s_per_million", float("nan")))
                    print(f"round {r + 1} {shape:7} {name}: {got['cpu_s_per_million']:.3f} CPU s per million, "
                          f"steady {got.get('steady_cpu_s_per_million', float('nan')):.3f} "
                          f"(first tick {got.get('first_tick_cpu_s', float('nan')):.2f} s; {got['samples']:,} "
                          f"samples, {got['cpu_s']:.2f} s CPU, {got['wall_s']:.1f} s wall) "
                          f"load {os.getloadavg()[0]:.1f}", flush=True)
        for shape in ("live", "backlog"):  # medians: a round on a loaded machine can be far off
            if (shape, "A") in steady:
                a, b = (float(np.median(steady[shape, n])) for n in ("A", "B"))
                print(f"median steady {shape:7}: A {a:.3f}, B {b:.3f} CPU s per million (B/A {b / a:.2f}, "
                      f"{args.rounds} rounds)")


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only", choices=("remote", "parquet"))
    p.add_argument("--shape", choices=("live", "backlog"))
    p.add_argument("--protocol", choices=("1.0", "2.0"), default="1.0")
    p.add_argument("--max-samples-per-send", type=int, help="the target's queue_config setting (default: its default)")
    p.add_argument("--parquet-pods", type=int, default=5_000, help="5,000 pods: 40,200 series, the default workload")
    p.add_argument("--ab", metavar="REV", help="A/B against the code at this git revision (remote write out, or "
                                               "with --only parquet the Parquet hour)")
    p.add_argument("--repo", default=str(ROOT), help="the git repository --ab takes the revision from")
    p.add_argument("--json", action="store_true", help="one JSON line per measurement (for --ab)")
    args = p.parse_args()
    if args.ab:
        print(f"load: {os.getloadavg()}")
        _ab(args.ab, args)
        print(f"load: {os.getloadavg()}")
        return
    pods = 1_000 if args.quick else 10_000
    say = (lambda what, got: print(json.dumps(got), flush=True)) if args.json else \
        (lambda what, got: print(f"{what}: {got}", flush=True))
    if not args.json:
        print(f"load: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.only in (None, "remote"):
            for r in range(args.rounds):
                # A round of its own directory: the buffer's watermark persists, and a second round in the
                # first one's directory would (rightly) drop the samples it overlaps as already sent.
                round_dir = tmp / f"round-{r + 1}"
                round_dir.mkdir()
                for shape, ticks in (("live", 30), ("backlog", 30)):
                    if args.shape in (None, shape):
                        say(f"round {r + 1} remote write out {args.protocol}, {shape}",
                            await remote_write_out(pods, ticks, shape, round_dir, args.protocol,
                                                   args.max_samples_per_send))
        if args.only in (None, "parquet"):
            ppods = args.parquet_pods // 10 if args.quick else args.parquet_pods
            for got in await parquet_hour(ppods, args.rounds) + await parquet_hour(200):
                say("parquet, one hour", got)
    if not args.json:
        print(f"load: {os.getloadavg()}")


if __name__ == "__main__":
    asyncio.run(main())
