"""Benchmark of the node agent (a documented command, not a test).

    .venv/bin/python perf/bench_agent.py                  # 100 pods, 30 passes at 1 s, a local `metricsd up`
    .venv/bin/python perf/bench_agent.py --pods 300 --passes 60

Builds a cgroup v2 tree (systemd layout, real file formats) of ``--pods`` pods with two containers
and a sandbox each, plus the matching kubelet pod list, in a temporary directory; starts a
``metricsd up --no-simulate`` store process; then measures:

1. collector + pusher CPU per pass, in a tight loop with no waiting (``collect`` then
   ``push_samples`` into a buffer): what one interval costs the agent, scaled per 100 pods;
2. the whole agent (``run_agent``: collection loop, pusher, gRPC, HTTP endpoint) at a 1 s
   interval against the store for ``--passes`` passes: its process CPU per pass (per 100 pods)
   and the delay from read to acknowledged (median, p99), as the agent itself measures it.

Prints a Markdown table and writes perf/results/bench_agent.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from random import Random

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "agent"))  # the fixture tree builder the tests use

from cgroup_fixture_tree import (  # type: ignore[import-not-found, unused-ignore]  # noqa: E402
    FixturePod,
    Stats,
    build_proc,
    build_tree,
)

from metricsd.agent.buffer import BufferSettings, PushBuffer  # noqa: E402
from metricsd.agent.collect import Collector, CollectorSettings  # noqa: E402
from metricsd.agent.pods import load_pod_list  # noqa: E402
from metricsd.agent.pusher import Pusher  # noqa: E402
from metricsd.clock import SystemClock  # noqa: E402
from metricsd.cmd.agent import AgentOptions, run_agent  # noqa: E402
from metricsd.ports import free_port as _free_port  # noqa: E402
from metricsd.store.api import LocalBackend, StoreAPI  # noqa: E402
from metricsd.store.engine import Store  # noqa: E402

BIN = Path(sys.executable).parent / "metricsd"
NODE = "bench-node"




def build_node(base: Path, pods: int, seed: int = 1) -> tuple[Path, Path, Path]:
    """A cgroup tree, /proc and a pod list for ``pods`` pods; returns (cgroup root, proc, pods.json)."""
    rng = Random(seed)
    fixture: list[FixturePod] = []
    items = []
    for p in range(pods):
        uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        qos = ("guaranteed", "burstable", "besteffort")[p % 3]
        ids = {name: f"{rng.getrandbits(256):064x}" for name in ("app", "sidecar", "sandbox")}
        fixture.append(FixturePod(uid, qos, {
            cid: Stats(usage_usec=rng.randrange(10**6, 10**10), nr_throttled=rng.randrange(100),
                       throttled_usec=rng.randrange(10**6), memory_current=rng.randrange(10**7, 10**9),
                       anon=rng.randrange(10**6, 10**7), inactive_file=rng.randrange(10**6), oom_kill=0)
            for cid in ids.values()}))
        workload = f"svc-{p % 20}"
        items.append({
            "metadata": {"name": f"{workload}-7d4b9c8f6d-{p:05d}", "namespace": f"team-{p % 5}", "uid": uid,
                         "ownerReferences": [{"kind": "ReplicaSet", "name": f"{workload}-7d4b9c8f6d",
                                              "controller": True, "apiVersion": "apps/v1", "uid": "x"}]},
            "spec": {"nodeName": NODE, "containers": [
                {"name": c, "resources": {"requests": {"cpu": "250m", "memory": "256Mi"},
                                          "limits": {"cpu": "1", "memory": "512Mi"}}}
                for c in ("app", "sidecar")]},
            "status": {"phase": "Running", "qosClass": qos.capitalize() if qos != "besteffort" else "BestEffort",
                       "containerStatuses": [{"name": c, "containerID": f"containerd://{ids[c]}",
                                              "ready": True, "restartCount": 0} for c in ("app", "sidecar")]},
        })
    root, proc, pods_json = base / "cgroup", base / "proc", base / "pods.json"
    build_tree(root, "systemd", fixture)
    build_proc(proc)
    pods_json.write_text(json.dumps({"kind": "PodList", "apiVersion": "v1", "items": items}))
    return root, proc, pods_json


def tight_loop(root: Path, proc: Path, pods_json: Path, passes: int) -> dict[str, float]:
    """Collector + pusher CPU per pass with no waiting and nothing sent (sending is in part 2)."""
    collector = Collector(CollectorSettings(node_name=NODE, cgroup_base=root, proc_root=proc))
    clock = SystemClock()
    pusher = Pusher(PushBuffer(BufferSettings(max_bytes=1 << 30)), [("none", LocalBackend(StoreAPI(Store())))],
                    clock)
    index = load_pod_list(pods_json)
    collector.collect(clock.now_ms(), index)  # warm caches, as a long-running agent has them
    collect_cpu = push_cpu = 0.0
    samples = 0
    for _ in range(passes):
        ts = clock.now_ms()
        t0 = time.process_time()
        c = collector.collect(ts, index)
        t1 = time.process_time()
        samples += pusher.push_samples(ts, c.samples)
        t2 = time.process_time()
        collect_cpu += t1 - t0
        push_cpu += t2 - t1
    mapped = collector.status.pods_mapped if collector.status else 0
    return {"collect_ms": collect_cpu / passes * 1000, "push_ms": push_cpu / passes * 1000,
            "samples_per_pass": samples / passes, "pods_mapped": mapped}


async def live(root: Path, proc: Path, pods_json: Path, addr: str, passes: int) -> dict[str, float]:
    opts = AgentOptions(targets=(addr,), interval_ms=1000, node_name=NODE, cgroup_root=root, proc_root=proc,
                        pods_file=pods_json, metrics_port=0)
    t0 = time.process_time()
    summary = await run_agent(opts, max_passes=passes)
    cpu = time.process_time() - t0
    return {**summary, "agent_cpu_ms_per_pass": cpu / passes * 1000}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--pods", type=int, default=100)
    ap.add_argument("--passes", type=int, default=30, help="passes at a 1 s interval against the store")
    ap.add_argument("--tight-passes", type=int, default=200, help="passes of the no-wait loop")
    ap.add_argument("--out", type=Path, default=ROOT / "perf" / "results" / "bench_agent.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    port = _free_port()
    store = subprocess.Popen([str(BIN), "--log-level", "WARNING", "up", "--no-simulate", "--grpc-port", str(port)],
                             stdout=subprocess.DEVNULL)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root, proc, pods_json = build_node(Path(tmp), args.pods)
            tight = tight_loop(root, proc, pods_json, args.tight_passes)
            time.sleep(1.0)  # the store is up by now
            res = asyncio.run(live(root, proc, pods_json, f"127.0.0.1:{port}", args.passes))
    finally:
        store.terminate()
        store.wait(10)
    per100 = 100.0 / args.pods
    out = {
        "pods": args.pods, "series_per_pass": tight["samples_per_pass"], "pods_mapped": tight["pods_mapped"],
        "tight_collect_ms_per_pass": round(tight["collect_ms"], 2),
        "tight_push_ms_per_pass": round(tight["push_ms"], 2),
        "tight_cpu_ms_per_100_pods": round((tight["collect_ms"] + tight["push_ms"]) * per100, 2),
        "agent_cpu_ms_per_pass": round(res["agent_cpu_ms_per_pass"], 2),
        "agent_cpu_ms_per_100_pods": round(res["agent_cpu_ms_per_pass"] * per100, 2),
        "delay_median_ms": res["delay_median_ms"], "delay_p99_ms": res["delay_p99_ms"],
        "pass_ms_mean": res["pass_ms_mean"],
        "sent_samples": res["sent_samples"], "collected_samples": res["collected_samples"],
        "passes": res["passes"], "machine": f"{platform.machine()} {platform.python_version()}",
        "command": " ".join(["perf/bench_agent.py", *sys.argv[1:]]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"| measure ({args.pods} pods, {int(out['series_per_pass'])} series a pass) | value |")
    print("| --- | --- |")
    print(f"| collector CPU per pass, tight loop | {out['tight_collect_ms_per_pass']} ms |")
    print(f"| pusher batching CPU per pass, tight loop | {out['tight_push_ms_per_pass']} ms |")
    print(f"| collector + pusher CPU per 100 pods per interval, tight loop | {out['tight_cpu_ms_per_100_pods']} ms |")
    print(f"| whole agent process CPU per 100 pods per interval (1 s, {res['passes']:.0f} passes, gRPC to a "
          f"local store) | {out['agent_cpu_ms_per_100_pods']} ms |")
    print(f"| delay from read to acknowledged, median / p99 | {out['delay_median_ms']} ms / {out['delay_p99_ms']} ms |")
    print(f"| of which the collection pass itself (mean wall time, in its thread) | {out['pass_ms_mean']} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
