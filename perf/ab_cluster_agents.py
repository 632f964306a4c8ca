"""A/B of two checkouts' clusters under the agents' live ingest, interleaved (a documented command,
not a test; never part of ``make bench``).

    .venv/bin/python perf/ab_cluster_agents.py /path/to/checkout-a /path/to/checkout-b
    .venv/bin/python perf/ab_cluster_agents.py A B --ticks 200 --scale 0.2 --rounds 6

Starts two ``metricsd cluster up --no-simulate --plaintext`` clusters (perf/compare_peers.py: etcd,
a config server, 3 stores RF 3, one proxy), arm A's processes on checkout A's code and B's on B's
(PYTHONPATH), and sends both the same batches of compare.py's live shape (perf/compare_workload.py:
2,000 series x 1 sample a request, 4 in flight, over one gRPC WriteStream each, as node agents do),
tick by tick with the arms' order alternating, so a loaded or noisy machine weighs on both alike.
Prints per round each arm's CPU seconds per million samples (all its processes, the proxy, the
stores; /proc) and samples/s, and B/A. Why it exists: a change to the proxy's per-batch path moves
compare.py's "cluster by gRPC agents" CPU by a few percent, below what two separate runs resolve.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import grpc_sender, send_block, wait_cluster_ready
from compare_peers import Processes
from compare_workload import Workload, WorkloadConfig
from procstat import cpu_seconds

from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import MetricsClient, StreamingBackend

ARMS = ("A", "B")


def cpu_by_role(pids: dict[str, list[int]]) -> dict[str, float]:
    return {role: sum(cpu_seconds(p) for p in ps) for role, ps in pids.items()}


async def run(args: argparse.Namespace) -> None:
    cfg = WorkloadConfig(ticks=args.ticks * args.rounds + 4, live_ticks=args.ticks * args.rounds + 3).scaled(args.scale)
    wl = Workload(cfg)
    warmup = [wl.next_block(1, cfg.live_series) for _ in range(4)]  # the first carries the labels
    with Processes() as procs:
        paths = dict(zip(ARMS, (args.a, args.b), strict=True))
        servers = {n: procs.start_metricsd_cluster(n, env={"PYTHONPATH": str(Path(p).resolve())})
                   for n, p in paths.items()}
        senders, pids, writers = {}, {}, []
        for n, s in servers.items():
            async with MetricsClient(s.grpc_address, timeout_s=120) as c:
                await wait_cluster_ready(c, n)
            w = StreamingBackend(open_channel(s.grpc_address), timeout_s=120)
            writers.append(w)
            senders[n] = grpc_sender(w, {}, n)
            for block in warmup:
                await send_block(senders[n], block)
            pids[n] = s.pids()
        for r in range(args.rounds):
            blocks = [wl.next_block(1, cfg.live_series) for _ in range(args.ticks)]
            samples = sum(b.samples for block in blocks for b in block)
            before = {n: cpu_by_role(pids[n]) for n in ARMS}
            wall = dict.fromkeys(ARMS, 0.0)
            for i, block in enumerate(blocks):
                for n in ARMS if i % 2 == 0 else ARMS[::-1]:
                    t0 = time.perf_counter()
                    await send_block(senders[n], block)
                    wall[n] += time.perf_counter() - t0
            await asyncio.sleep(2.0)  # work the writes caused lands in this round
            per_m = {}
            for n in ARMS:
                after = cpu_by_role(pids[n])
                d = {role: (after[role] - before[n][role]) / samples * 1e6 for role in after}
                per_m[n] = (sum(d.values()), d.get("proxy", 0.0), d.get("store", 0.0))
                print(f"round {r} {n}: all {per_m[n][0]:.3f}, proxy {per_m[n][1]:.3f}, stores {per_m[n][2]:.3f} "
                      f"CPU s per million; {samples / wall[n]:,.0f} samples/s", flush=True)
            load = Path("/proc/loadavg").read_text().split()[0]
            print(f"round {r}: B/A all {per_m['B'][0] / per_m['A'][0]:.3f}, proxy {per_m['B'][1] / per_m['A'][1]:.3f}, "
                  f"stores {per_m['B'][2] / per_m['A'][2]:.3f} (load {load})", flush=True)
        for w in writers:
            await w.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="checkout A (its metricsd package is imported by arm A's processes)")
    p.add_argument("b", help="checkout B")
    p.add_argument("--ticks", type=int, default=200, help="live ticks a round")
    p.add_argument("--scale", type=float, default=0.2, help="compare.py's workload scale (0.2: 8,000 series)")
    p.add_argument("--rounds", type=int, default=6)
    asyncio.run(run(p.parse_args()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
