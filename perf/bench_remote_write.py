"""Remote-write ingest side by side: one store, a cluster and VictoriaMetrics in one run (a
documented command, not a test).

    .venv/bin/python perf/bench_remote_write.py                      # 10,000 pods x 2 h, all three systems
    .venv/bin/python perf/bench_remote_write.py --pods 2000 --hours 0.5
    .venv/bin/python perf/bench_remote_write.py --systems store,victoriametrics
    .venv/bin/python perf/bench_remote_write.py --profile            # plus py-spy of every metricsd process
    BENCH_PYSPY_NATIVE=1 .venv/bin/python perf/bench_remote_write.py --profile   # with C frames (gRPC core)

Starts, on 127.0.0.1 with temporary data directories (perf/compare_peers.py):
- ``store``: ``metricsd up --no-simulate --no-consumers`` (one process, in memory);
- ``cluster``: ``metricsd cluster up --plaintext --no-simulate`` with one proxy, one config server
  and 3 stores (RF 3, W 2, R 2; the stores in memory, as the command runs them), etcd;
- ``victoriametrics``: VictoriaMetrics 1.79 (Debian's package).

and feeds them the seeded pod workload of perf/compare_workload.py (4 series a pod) as Prometheus
remote write 1.0 bodies (snappy block, labels with every series, as Prometheus sends them), the
systems' order rotating block by block, ``--in-flight`` requests at once (4 senders):

1. backfill: 1,000 series x 60 samples a request (every tick but the last ``--live-ticks``);
2. live: 2,000 series x 1 sample a request. The store and VictoriaMetrics get remote write; the
   cluster gets the agents' columnar gRPC Write on one WriteStream (perf/compare.py's live shape),
   with the series-id handshake (labels resent for ids the proxy reports unknown).

Reported per system and phase: samples/s while it was being fed, server CPU seconds per million
samples counting every process of the system (the cluster's proxy and stores also apart; etcd and
the config server in "control", which is also split by process), the proxy's counters of client
writes and of the messages and parts it sent the stores (how much its coalescing merged), and RSS:
the peak sampled during ingest (5 Hz, summed over the system's processes) against the settled RSS
3 s after the last phase. Bodies are built between
blocks, outside the timed sends; the client runs on the same 2 cores, as for every system.

Prints a Markdown table (with ``uptime``'s load) and writes perf/results/bench_remote_write.json;
``--profile`` writes one py-spy folded-stack file per metricsd process and phase to
perf/results/profiles/ (py-spy slows what it samples: profile runs are not timing runs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import RW_HEADERS, server_cpu, server_rss, wait_cluster_ready
from compare_peers import Processes, Server, ensure_installed, package_version
from compare_workload import Batch, Workload, WorkloadConfig
from procstat import cpu_seconds

from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import MetricsClient, StreamingBackend

HERE = Path(__file__).resolve().parent
SYSTEMS = ("store", "cluster", "victoriametrics")
Send = Callable[[Batch], Awaitable[None]]


def remote_write(http: aiohttp.ClientSession, server: Server) -> Send:
    async def send(b: Batch) -> None:
        async with http.post(server.url + "/api/v1/write", data=b.remote_write, headers=RW_HEADERS) as resp:
            if resp.status >= 300:
                raise RuntimeError(f"{server.name}: remote write answered {resp.status}: {(await resp.text())[:300]}")
    return send


def grpc_agent(client: StreamingBackend, labels_of: dict[int, list[pb.Label]]) -> Send:
    """An agent's Write: ids only, labels resent for the ids the receiver does not know."""
    async def send(b: Batch) -> None:
        resp = await client.write(b.grpc)
        if resp.unknown_ids:
            retry = pb.WriteRequest()
            retry.CopyFrom(b.grpc)
            for sid in resp.unknown_ids:
                retry.series.add(id=sid).labels.extend(labels_of[sid])
            resp = await client.write(retry)
        if resp.unknown_ids or resp.rejected_too_old or resp.samples_written + resp.rejected_duplicate != b.samples:
            raise RuntimeError(f"gRPC write: unexpected response {resp}")
    return send


async def send_block(send: Send, batches: list[Batch], in_flight: int) -> None:
    """The block's requests, ``in_flight`` at a time (each holds other series)."""
    sem = asyncio.Semaphore(in_flight)

    async def one(b: Batch) -> None:
        async with sem:
            await send(b)

    await asyncio.gather(*(one(b) for b in batches))


class RssPeaks:
    """Samples the summed RSS of each system's processes at 5 Hz on a thread; ``peak[name]`` is the
    largest seen while ``active`` names it."""

    def __init__(self, servers: dict[str, Server]) -> None:
        self.servers = servers
        self.peak = dict.fromkeys(servers, 0)
        self.active: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for name in list(self.active):
                with contextlib.suppress(OSError):  # a process of the tree just ended
                    self.peak[name] = max(self.peak[name], server_rss(self.servers[name]))

    def __enter__(self) -> RssPeaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def profiled(servers: dict[str, Server], folder: Path | None, phase: str) -> Iterator[None]:
    """py-spy records every metricsd process (a cluster's proxy and stores each) while inside."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if folder is None or not Path(spy).exists():
        yield
        return
    procs = []
    # C frames too (gRPC core, NumPy): py-spy then stops each process for every sample
    native = ["--native"] if os.environ.get("BENCH_PYSPY_NATIVE") else ["--nonblocking"]
    for name, s in servers.items():
        if name == "victoriametrics":
            continue
        for role, pids in s.pids().items():
            for i, pid in enumerate(pids):  # control: the parent, the config server (etcd is not Python)
                out = folder / f"profile_rw_{phase}_{name}_{role}{i if len(pids) > 1 else ''}.txt"
                procs.append(subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "100", "--format", "raw",
                                               *native, "-o", str(out)],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(1.0)
    try:
        yield
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        for p in procs:
            p.wait(timeout=60)


async def ingest(wl: Workload, live: bool, senders: dict[str, Send], servers: dict[str, Server], peaks: RssPeaks,
                 in_flight: int) -> dict[str, Any]:
    cfg = wl.config
    per_req = cfg.live_series if live else cfg.backfill_series
    cpu0 = {n: server_cpu(servers[n]) for n in senders}
    control0 = {n: control_cpu(servers[n]) for n in senders}
    wall = dict.fromkeys(senders, 0.0)
    samples = requests = 0
    names = list(senders)
    for i, ticks in enumerate(wl.blocks(live)):
        batches = wl.next_block(ticks, per_req)
        samples += sum(b.samples for b in batches)
        requests += len(batches)
        for name in names[i % len(names):] + names[:i % len(names)]:
            peaks.active.add(name)
            t0 = time.perf_counter()
            await send_block(senders[name], batches, in_flight)
            wall[name] += time.perf_counter() - t0
            peaks.active.discard(name)
    peaks.active.update(senders)
    await asyncio.sleep(3.0)  # background work the writes caused (flushes, merges) lands in this phase
    peaks.active.clear()
    out: dict[str, Any] = {}
    for n in senders:
        cpu = {role: v - cpu0[n].get(role, 0.0) for role, v in server_cpu(servers[n]).items()}
        out[n] = {"samples": samples, "requests": requests, "wall_s": wall[n], "samples_per_s": samples / wall[n],
                  "cpu_s": cpu["all"], "cpu_s_per_million": cpu["all"] / samples * 1e6,
                  "by_role": {r: v / samples * 1e6 for r, v in cpu.items() if r != "all"} if servers[n].tree else {}}
        if servers[n].tree:  # which control process burns CPU: the parent, the config server or etcd
            out[n]["control"] = {k: (v - control0[n].get(k, 0.0)) / samples * 1e6
                                 for k, v in control_cpu(servers[n]).items()}
    return out


async def proxy_calls(client: MetricsClient) -> dict[str, int]:
    """The proxy's counters of client writes and of the messages (calls, parts) it sent the stores."""
    st = await client.stats()
    return {k: int(st.rejected.get(f"proxy_{k}", 0)) for k in ("writes", "member_write_calls", "member_write_parts")}


def control_cpu(server: Server) -> dict[str, float]:
    """CPU seconds so far of a cluster's control processes, by what each runs (etcd, config, the parent)."""
    out: dict[str, float] = {}
    for pid in server.pids().get("control", []) if server.tree else []:
        with contextlib.suppress(OSError):
            argv = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
            name = "etcd" if any(a.endswith("etcd") for a in argv[:1]) else " ".join(argv[1:4])[:40] or str(pid)
            out[f"{name} ({pid})"] = cpu_seconds(pid)
    return out


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def markdown(res: dict[str, Any]) -> str:
    vm = "victoriametrics"
    lines = [f"Command: `{res['command']}` ({res['date']}, {res['cores']} cores; load before / after "
             f"{res['load_before']} / {res['load_after']}). Workload: {res['workload']}.", "",
             "| phase | system | samples/s | CPU s per million samples | of which | CPU / VictoriaMetrics | "
             "samples/s / VictoriaMetrics |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for phase in ("backfill", "live"):
        rows = res.get(phase, {})
        ref = rows.get(vm)
        for name, r in rows.items():
            label = res["labels"][phase].get(name, name)
            roles = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["by_role"].items())) or "-"
            cpu_ratio = f"{r['cpu_s_per_million'] / ref['cpu_s_per_million']:.2f}" if ref and name != vm else "-"
            rate_ratio = f"{r['samples_per_s'] / ref['samples_per_s']:.2f}" if ref and name != vm else "-"
            lines.append(f"| {phase} | {label} | {r['samples_per_s']:,.0f} | {r['cpu_s_per_million']:.2f} | {roles} | "
                         f"{cpu_ratio} | {rate_ratio} |")
    lines += ["", "| system | peak RSS during ingest, MiB | settled RSS, MiB | peak / settled |",
              "| --- | --- | --- | --- |"]
    for name, m in res["rss"].items():
        lines.append(f"| {name} | {m['peak'] / 2**20:,.0f} | {m['settled'] / 2**20:,.0f} | "
                     f"{m['peak'] / max(1, m['settled']):.2f} |")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    end = (time.time_ns() // 1_000_000 // 10_000) * 10_000 - 10_000
    pods = args.pods
    cfg = WorkloadConfig(big_pods=pods // 2, other_pods=pods - pods // 2, other_workloads=max(1, min(100, pods // 100)),
                         nodes=max(1, pods // 100), ticks=round(args.hours * 360), live_ticks=args.live_ticks,
                         end_ms=end)
    wl = Workload(cfg)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if unknown := set(systems) - set(SYSTEMS):
        raise SystemExit(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    res: dict[str, Any] = {
        "command": " ".join(["perf/bench_remote_write.py", *sys.argv[1:]]), "cores": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"), "load_before": _load(), "in_flight": args.in_flight,
        "workload": f"{pods:,d} pods, {len(wl.series):,d} series, {cfg.ticks} ticks at 10 s "
                    f"({wl.samples:,d} samples; the last {cfg.live_ticks} ticks in the live shape)",
        "versions": {"victoriametrics": package_version("victoria-metrics")} if "victoriametrics" in systems else {},
        "labels": {"backfill": {"store": "one store (remote write)", "cluster": "cluster RF 3 (remote write)",
                                "victoriametrics": "VictoriaMetrics (remote write)"},
                   "live": {"store": "one store (remote write)", "cluster": "cluster RF 3 (gRPC agents)",
                            "victoriametrics": "VictoriaMetrics (remote write)"}},
    }
    prof = HERE / "results" / "profiles" if args.profile else None
    if prof is not None:
        prof.mkdir(parents=True, exist_ok=True)
    labels_of = {int(sid): [pb.Label(name=k, value=v) for k, v in labels]
                 for sid, labels in zip(wl.source.series_ids.tolist(), wl.series, strict=True)}
    with Processes() as procs:
        servers: dict[str, Server] = {}
        for name in systems:  # VictoriaMetrics first, then the clock of the others' start-up
            servers[name] = {"store": procs.start_metricsd, "cluster": procs.start_metricsd_cluster,
                             "victoriametrics": procs.start_victoria_metrics}[name]()
        async with AsyncExitStack() as stack:
            http = await stack.enter_async_context(aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64), timeout=aiohttp.ClientTimeout(total=300)))
            rw = {n: remote_write(http, s) for n, s in servers.items()}
            live = dict(rw)
            if "cluster" in servers:
                probe = await stack.enter_async_context(MetricsClient(servers["cluster"].grpc_address, timeout_s=60))
                await wait_cluster_ready(probe, "cluster")
                writer = StreamingBackend(open_channel(servers["cluster"].grpc_address), timeout_s=120)
                stack.push_async_callback(writer.close)
                live["cluster"] = grpc_agent(writer, labels_of)
            with RssPeaks(servers) as peaks:
                for phase, is_live, senders in (("backfill", False, rw), ("live", True, live)):
                    if is_live and not cfg.live_ticks:
                        continue
                    print(f"{phase} ...", flush=True)
                    calls0 = await proxy_calls(probe) if "cluster" in servers else {}
                    with profiled(servers, prof, phase):
                        res[phase] = await ingest(wl, is_live, senders, servers, peaks, args.in_flight)
                    if "cluster" in servers:  # how many client batches a message to a store carried
                        calls1 = await proxy_calls(probe)
                        res[phase]["cluster"]["proxy"] = {k: v - calls0.get(k, 0) for k, v in calls1.items()}
                    if "cluster" in servers:
                        print(f"    proxy: {res[phase]['cluster']['proxy']}")
                    for n, r in res[phase].items():
                        print(f"  {n:16} {r['samples_per_s']:12,.0f} samples/s  {r['cpu_s_per_million']:6.2f} CPU s "
                              f"per million  {r['by_role'] or ''}", flush=True)
                        if r.get("control"):
                            print("    control: " + ", ".join(f"{k} {v:.2f}" for k, v in r["control"].items()))
            res["rss"] = {n: {"peak": peaks.peak[n], "settled": server_rss(s)} for n, s in servers.items()}
    res["load_after"] = _load()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=10_000, help="simulated pods (4 series each)")
    ap.add_argument("--hours", type=float, default=2.0, help="hours of data at 10 s")
    ap.add_argument("--live-ticks", type=int, default=60, help="the last ticks go in the live shape (0: none)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated, of: " + ", ".join(SYSTEMS))
    ap.add_argument("--in-flight", type=int, default=4, help="requests in flight (senders)")
    ap.add_argument("--profile", action="store_true", help="py-spy every metricsd process (not a timing run)")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "bench_remote_write.json")
    args = ap.parse_args()
    if "victoriametrics" in args.systems:
        ensure_installed()
    res = asyncio.run(run(args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=1))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
