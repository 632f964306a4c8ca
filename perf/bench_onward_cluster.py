"""The cluster's hourly Parquet, measured end to end: one hour of the default workload written by a
real ``metricsd cluster up`` (etcd, stores, config servers, proxies), and the CPU every process of
the cluster spent on it.

    .venv/bin/python perf/bench_onward_cluster.py             # 5,000 pods: 40,200 series, 14.47 M samples
    .venv/bin/python perf/bench_onward_cluster.py --pods 500  # a tenth
    .venv/bin/python perf/bench_onward_cluster.py --py-spy /tmp/spy  # and where the time goes

What it does: starts ``metricsd cluster up --plaintext --no-simulate --parquet-dir D
--parquet-check 0.5 --parquet-clock-file C`` (the defaults otherwise: 3 stores, RF 3, W 2, R 2,
2 proxies, 2 config servers); writes one hour H (two hours ago) of the simulated pods at a 10 s
interval through proxy-1's gRPC Write; marks the 23 hours before H in the writer's lookback as
written (their ``_SUCCESS``), so that the window holds H alone; measures every process's CPU
(``/proc/<pid>/stat``: utime + stime of each process ``cluster up`` started, and its own) over an
idle window first, then moves the writers' clock file past H's close and measures again until
H's ``_SUCCESS`` appears. Reported: each process's CPU in the window, the total, the total less
the idle window's rate over the same wall time (the cluster's own background: leases, map
watches, the config servers' checks), bytes per sample of the files.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc

from metricsd.agent.batches import write_requests
from metricsd.cmd.ports import free_range
from metricsd.onward.hourly import HOUR_MS
from metricsd.onward.parquet import hour_dir
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.rpc.client import GrpcBackend

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onward import INTERVAL_MS, _sim

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")
DELAY_MS = 600_000  # the writer's: an hour is written ten minutes after it ends


def _descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def _name(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return str(pid)
    words = [a.decode(errors="replace") for a in argv if a]
    if "--member-id" in words:
        return words[words.index("--member-id") + 1]
    if "metricsd" in words:
        sub = [w for w in words[words.index("metricsd") + 1:] if w not in ("--log-level", "INFO", "WARNING", "DEBUG")]
        port = f" :{words[words.index('--grpc-port') + 1]}" if "--grpc-port" in words else ""
        return (sub[0] if sub else "metricsd") + (" " + sub[1] if sub[:1] == ["cluster"] else port)
    return Path(words[0]).name if words else str(pid)


def _cpu(pids: list[int]) -> dict[int, float]:
    out = {}
    for p in pids:
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[p] = (int(f[11]) + int(f[12])) / TICK
    return out


async def _ingest(addr: str, pods: int, hour: int) -> int:
    """One hour of ``pods`` pods through proxy-1's Write; returns the samples acknowledged."""
    channel = grpc.aio.insecure_channel(addr, options=[("grpc.max_send_message_length", 64 << 20),
                                                       ("grpc.max_receive_message_length", 64 << 20)])
    backend = GrpcBackend(pb_grpc.MetricsStub(channel), timeout_s=60)
    for _ in range(300):  # the map is published a moment after the processes are up
        try:
            await backend.health()
            break
        except Exception:
            await asyncio.sleep(0.2)
    sim = _sim(pods, hour)
    written = 0
    sem = asyncio.Semaphore(4)

    async def send(req: object) -> None:
        nonlocal written
        async with sem:
            for attempt in range(100):
                try:
                    resp = await backend.write(req)  # type: ignore[arg-type]
                    break
                except Exception as e:  # not ready yet (no quorum while the stores join)
                    if attempt == 99:
                        raise
                    print(f"write: {e}; again", file=sys.stderr)
                    await asyncio.sleep(0.5)
            assert not resp.unknown_ids, "labels are sent with every request"
            written += resp.samples_written

    while sim.next_timestamp_ms < hour + HOUR_MS:
        ts, values = sim.block(min(60, (hour + HOUR_MS - sim.next_timestamp_ms) // INTERVAL_MS))
        await asyncio.gather(*(send(r) for r in write_requests(sim, ts, values, max_samples=20_000,
                                                                 send_labels_for=None)))
    await channel.close()
    return written


def _window(pids: list[int], until: object, poll_s: float = 0.5) -> tuple[dict[int, float], float]:
    a, w0 = _cpu(pids), time.perf_counter()
    while not until():  # type: ignore[operator]
        time.sleep(poll_s)
    b, w = _cpu(pids), time.perf_counter() - w0
    return {p: b[p] - a[p] for p in a if p in b}, w


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, default=5_000)
    p.add_argument("--idle-s", type=float, default=20.0, help="the idle window measured first")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, files)")
    p.add_argument("--py-spy", type=Path, default=None, metavar="DIR",
                   help="record the proxies and store-1 with py-spy over the window (raw stacks, one file each)")
    args = p.parse_args()
    print(f"load: {os.getloadavg()}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-onward-cluster-"))
    out, clock, data = tmp / "pq", tmp / "clock", tmp / "cluster"
    clock.write_text("0\n")  # no hour closed yet
    hour = (int(time.time() * 1000) // HOUR_MS - 2) * HOUR_MS
    for i in range(1, 24):  # the lookback's earlier hours: marked written, so the window holds H alone
        marker = out / hour_dir("samples", hour - i * HOUR_MS) / "_SUCCESS"
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("{}")
    base = free_range("127.0.0.1", 200)
    up = subprocess.Popen([sys.executable, "-m", "metricsd", "cluster", "up", "--plaintext", "--no-simulate",
                           "--base-port", str(base), "--data-dir", str(data), "--parquet-dir", str(out),
                           "--parquet-check", "0.5", "--parquet-clock-file", str(clock)],
                          cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          env=os.environ | {"PYTHONUNBUFFERED": "1"})
    try:
        t = time.perf_counter()
        written = asyncio.run(_ingest(f"127.0.0.1:{base + 1}", args.pods, hour))
        print(f"ingested {written:,} samples through proxy-1 in {time.perf_counter() - t:.0f} s; "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
        time.sleep(5)  # the writes' tails settle (the third replica, hinted hand-off)
        pids = _descendants(up.pid)
        names = {p: _name(p) for p in pids}
        stop = time.perf_counter() + args.idle_s
        idle, idle_wall = _window(pids, lambda: time.perf_counter() >= stop)
        marker = out / hour_dir("samples", hour) / "_SUCCESS"
        spies = []
        if args.py_spy:  # py-spy of the proxies and store-1 over the window
            args.py_spy.mkdir(parents=True, exist_ok=True)
            for p_, n in names.items():
                if n.startswith("proxy") or n == "store-1":
                    out_file = args.py_spy / f"{n.replace(' :', '-')}.txt"
                    spies.append(subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-r", "100",
                                                   "-f", "raw", "-o", str(out_file), "--pid", str(p_)],
                                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(1.0)
        clock.write_text(f"{hour + HOUR_MS + DELAY_MS + 1}\n")
        load0 = os.getloadavg()[0]
        spent, wall = _window(pids, marker.exists, 0.2)
        for spy in spies:
            spy.send_signal(signal.SIGINT)
            spy.wait()
        manifest = json.loads(marker.read_text())
        idle_rate = sum(idle.values()) / idle_wall
        total = sum(spent.values())
        files = [f for f in out.rglob("*.parquet") if hour_dir("samples", hour).split("/", 1)[1] in str(f)]
        size = {f.parent.parent.parent.name: f.stat().st_size for f in files}
        samples = int(manifest["samples"])
        got = {"pods": args.pods, "samples": samples, "series": manifest["series"], "writer": manifest.get("writer"),
               "wall_s": round(wall, 2), "cpu_s_all_processes": round(total, 2),
               "idle_cpu_s_per_s": round(idle_rate, 3),
               "cpu_s_less_idle": round(total - idle_rate * wall, 2),
               "by_process": {f"{names[p]} ({p})": round(c, 2) for p, c in sorted(spent.items(), key=lambda x: -x[1])
                              if c},
               "bytes_per_sample": {k: round(v / samples, 3) for k, v in size.items()},
               "load": [load0, os.getloadavg()[0]]}
        print(json.dumps(got, indent=1), flush=True)
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
        if not args.keep:
            subprocess.run(["rm", "-rf", str(tmp)], check=False)
        else:
            print(f"kept {tmp}")


if __name__ == "__main__":
    main()
