"""The cluster's background CPU, process by process (issue 24): ``metricsd cluster up --plaintext``
(etcd, one config server, 3 stores RF 3, one proxy: perf/compare_peers.py's cluster) fed the
seeded workload (perf/compare_workload.py), then left alone; each process's CPU milliseconds a
second over ``--windows`` windows of ``--window`` seconds, the median per process.

With ``--base DIR`` a second cluster runs the code of checkout DIR (``git archive main | tar -x -C
DIR``) beside this checkout's: both are fed, settled and measured in the same windows (the same
load for both arms), which is how a change to a timer is measured on a loaded machine. The first
cluster started tends to read higher (its processes are older, its pages warmer): ``--swap``
starts the base first.

    .venv/bin/python perf/bench_idle_cluster.py --base /tmp/main --windows 6 --window 10
    .venv/bin/python perf/bench_idle_cluster.py --profile 30     # py-spy of each process, idle
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_peers
from compare import grpc_senders, ingest, wait_cluster_ready
from compare_peers import Processes, Server
from compare_workload import Workload, WorkloadConfig

from metricsd.rpc.client import MetricsClient

HERE = Path(__file__).resolve().parent


def process_names(server: Server) -> dict[str, int]:
    """Every process of a cluster by a readable name: ``launcher``, ``etcd``, ``config-server-1``,
    ``store-1``..., ``proxy-1`` (from each child's command line)."""
    out = {"launcher": server.pid}
    for role, pids in server.pids().items():
        for pid in pids:
            if pid == server.pid:
                continue
            try:
                words = [w.decode(errors="replace") for w in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
            except OSError:
                continue
            if Path(words[0]).name == "etcd":
                out["etcd"] = pid
                continue
            name = next((words[i + 1] for i, w in enumerate(words) if w in ("--member-id", "--id")), None)
            out[name or f"{role}-{sum(k.startswith(role) for k in out) + 1}"] = pid
    return out


def start_cluster(procs: Processes, name: str, code: Path | None) -> Server:
    """A cluster of this checkout, or of ``code``: its processes start as ``python -m metricsd``,
    which puts the working directory first on sys.path, so both PYTHONPATH and the directory change."""
    if code is None:
        return procs.start_metricsd_cluster(name)
    saved, cwd = os.environ.get("PYTHONPATH"), os.getcwd()
    os.environ["PYTHONPATH"] = str(code)
    os.chdir(code)
    try:
        return procs.start_metricsd_cluster(name)
    finally:
        os.chdir(cwd)
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def cpu_seconds(pid: int) -> float:
    """CPU seconds of every thread of ``pid`` from /proc/PID/task/*/schedstat (nanoseconds: a
    10 s window of a process that spends 2 ms a second is resolved, which clock ticks are not)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total / 1e9


async def windows(named: dict[str, dict[str, int]], n: int, seconds: float) -> dict[str, dict[str, list[float]]]:
    """CPU ms a second of every process of every cluster, ``n`` windows of ``seconds``, all
    clusters read in the same windows."""
    out: dict[str, dict[str, list[float]]] = {c: {p: [] for p in procs} for c, procs in named.items()}
    for w in range(n):
        before = {c: {p: cpu_seconds(pid) for p, pid in procs.items()} for c, procs in named.items()}
        t0 = time.monotonic()
        await asyncio.sleep(seconds)
        took = time.monotonic() - t0
        for c, procs in named.items():
            row = {p: (cpu_seconds(pid) - before[c][p]) / took * 1000 for p, pid in procs.items()}
            for p, v in row.items():
                out[c][p].append(v)
            print(f"window {w} {c}: all {sum(row.values()):.1f} ms/s " +
                  json.dumps({p: round(v, 1) for p, v in row.items()}), flush=True)
    return out


def profile(named: dict[str, dict[str, int]], seconds: float, folder: Path) -> None:
    """py-spy record (raw, native frames off, non-idle samples only) of every process but etcd and
    the launcher, all at once for ``seconds``."""
    folder.mkdir(parents=True, exist_ok=True)
    rate = os.environ.get("METRICSD_PYSPY_RATE", "100")
    running = []
    for c, procs in named.items():
        for p, pid in procs.items():
            if p in ("etcd",):
                continue
            path = folder / f"idle_{c}_{p}.txt"
            running.append(subprocess.Popen(
                [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid), "--duration",
                 str(int(seconds)), "--rate", rate, "--format", "raw", "--output", str(path), "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    for r in running:
        r.wait()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    end = (time.time_ns() // 1_000_000 // 10_000) * 10_000 - 10_000
    wl = Workload(WorkloadConfig(end_ms=end, ticks=round(args.hours * 360), live_ticks=10).scaled(args.scale))
    out: dict[str, Any] = {"command": " ".join(["perf/bench_idle_cluster.py", *sys.argv[1:]]),
                           "load_before": os.getloadavg(), "series": len(wl.series)}
    arms: list[tuple[str, Path | None]] = [("head", None)]
    if args.base is not None:
        arms = [("base", args.base), *arms] if args.swap else [*arms, ("base", args.base)]
    with Processes() as procs:
        servers = {name: start_cluster(procs, name, code) for name, code in arms}
        async with AsyncExitStack() as stack:
            for n, s in servers.items():
                async with MetricsClient(s.grpc_address) as c:
                    await wait_cluster_ready(c, n)
            senders = grpc_senders(stack, servers, {})
            print(f"feeding {wl.samples:,} samples of {len(wl.series):,} series ...", flush=True)
            await ingest(wl, False, senders, servers)
            await ingest(wl, True, senders, servers)
        await asyncio.sleep(args.settle)
        named = {n: process_names(s) for n, s in servers.items()}
        print(json.dumps(named), flush=True)
        res = await windows(named, args.windows, args.window)
        out["windows"] = res
        Path(args.out).write_text(json.dumps(out, indent=1))
        if args.profile:
            profile(named, args.profile, Path(args.profile_dir))
    out["load_after"] = os.getloadavg()
    return out


def summary(res: dict[str, Any]) -> list[str]:
    """Median ms/s per process (and of the sum over processes), per cluster; B/A when two."""
    cols = list(res["windows"])
    lines = ["| process | " + " | ".join(f"{c} ms/s" for c in cols) + (" | head/base |" if len(cols) == 2 else " |"),
             "| --- " * (len(cols) + 1 + (len(cols) == 2)) + "|"]
    procs = sorted({p for c in cols for p in res["windows"][c]})
    for p in [*procs, "all"]:
        meds = []
        for c in cols:
            ws = res["windows"][c]
            vals = [sum(v) for v in zip(*ws.values(), strict=True)] if p == "all" else ws.get(p, [])
            meds.append(statistics.median(vals) if vals else float("nan"))
        base = meds[cols.index("base")] if "base" in cols else 0.0
        ratio = "" if len(cols) != 2 else f" | {meds[cols.index('head')] / base:.2f}" if base else " | -"
        lines.append(f"| {p} | " + " | ".join(f"{m:.2f}" for m in meds) + ratio + " |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=0.2, help="of compare.py's 10,000 pods (default 0.2)")
    p.add_argument("--hours", type=float, default=0.5)
    p.add_argument("--settle", type=float, default=10.0, help="seconds after feeding before the first window")
    p.add_argument("--windows", type=int, default=6)
    p.add_argument("--window", type=float, default=10.0, help="seconds")
    p.add_argument("--base", type=Path, default=None, help="a second cluster running this checkout's code")
    p.add_argument("--swap", action="store_true", help="start the base cluster first")
    p.add_argument("--profile", type=float, default=0.0, metavar="SECONDS",
                   help="after the windows, py-spy every metricsd process for SECONDS")
    p.add_argument("--profile-dir", default=str(HERE / "results" / "profiles"))
    p.add_argument("--out", default=str(HERE / "results" / "bench_idle_cluster.json"))
    args = p.parse_args()
    compare_peers.ensure_installed()
    res = asyncio.run(run(args))
    Path(args.out).write_text(json.dumps(res, indent=1))
    print("\n".join([*summary(res), f"(loaded: load average {res['load_before']} before, {res['load_after']} after)"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
