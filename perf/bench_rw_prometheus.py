"""A real Prometheus as the remote-write sender: one store and VictoriaMetrics fed the same samples
by one Prometheus, side by side (a documented command, not a test).

    .venv/bin/python perf/bench_rw_prometheus.py                        # 10 targets x 1,000 pods, 2 s scrapes
    .venv/bin/python perf/bench_rw_prometheus.py --targets 5 --pods 500 --seconds 60
    .venv/bin/python perf/bench_rw_prometheus.py --max-samples-per-send 2000 --shards 4
    .venv/bin/python perf/bench_rw_prometheus.py --profile              # plus py-spy of the stores and the proxy
    .venv/bin/python perf/bench_rw_prometheus.py --cluster              # a third queue: a cluster's proxy
    .venv/bin/python perf/bench_rw_prometheus.py --base /tmp/main       # an A/B: a second store from that code
    .venv/bin/python perf/bench_rw_prometheus.py --cluster --cluster-b="--no-writes-on-read-port"  # two clusters
    .venv/bin/python perf/bench_rw_prometheus.py --cluster --cluster-base /tmp/main  # two clusters, two checkouts

perf/bench_remote_write.py builds its remote-write bodies itself, each series in the same request
slot every time: the best case of the receiver's layout memo (metricsd/http/remote_write_layout.py).
Here the sender is Debian's Prometheus 2.42 in agent mode (``--enable-feature=agent``: scrape and
remote write, no local queries), as a user would run it:

- ``--targets`` HTTP targets on 127.0.0.1 (aiohttp, in this process), each serving ``--pods`` pods
  x 4 series (``container_cpu_usage_seconds_total``, ``container_memory_working_set_bytes``,
  ``container_network_receive_bytes_total``, ``kube_pod_container_resource_requests``; labels
  namespace, pod, container, node) in the text format, values moving every scrape;
- Prometheus scrapes them every ``--interval`` and remote-writes every sample to two queues: a
  ``metricsd up --no-simulate --no-consumers`` (one process, in memory) and VictoriaMetrics 1.79,
  with the queue settings given (Prometheus' defaults unless ``--max-samples-per-send``,
  ``--shards``); with ``--cluster`` a third queue to ``metricsd cluster up --plaintext`` (RF 3, a
  proxy and 3 stores, etcd, a config server: every process counted).

After ``--warmup`` seconds (the series are new, then learnt), a window of ``--seconds``: the CPU
seconds of each receiver's process over the window, less its idle rate measured before Prometheus
started (``--idle`` seconds) and the raw figure too, per million samples the receiver counted as
written in the window (metricsd's ``metricsd_samples_ingested_total{path="remote_write"}``,
VictoriaMetrics' ``vm_rows_inserted_total{type="promremotewrite"}``); metricsd's write requests
and the layout memo's hits and misses in the window (``metricsd_remote_write_layout_*``), and
Prometheus' samples pending at the end (a receiver that fell behind). Prometheus, the targets and
this script run on the same cores and are not counted. Prints a Markdown table with ``uptime``'s
load; writes perf/results/bench_rw_prometheus.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import server_cpu, wait_cluster_ready
from compare_peers import Processes, Server, ensure_installed, package_version

from metricsd.cluster.etcd_server import free_port
from metricsd.rpc.client import MetricsClient

HERE = Path(__file__).resolve().parent
METRICS = (("container_cpu_usage_seconds_total", "counter"), ("container_memory_working_set_bytes", "gauge"),
           ("container_network_receive_bytes_total", "counter"), ("kube_pod_container_resource_requests", "gauge"))


class Target:
    """One scrape target: ``pods`` pods x 4 series, their lines' label parts built once; a scrape
    formats the values of the moment (counters grow, gauges wander). ``zero_share`` of the series
    (spread evenly) stay at 0, as an error counter that never moved does: a sample whose value
    protobuf leaves out, 9 bytes shorter than the others."""

    def __init__(self, index: int, pods: int, zero_share: float = 0.0) -> None:
        self.prefixes: list[str] = []
        self.rates: list[float] = []
        self.counter: list[bool] = []
        every = round(1 / zero_share) if zero_share > 0 else 0
        for p in range(pods):
            labels = (f'namespace="ns-{(index * pods + p) % 50}",pod="pod-{index}-{p}",container="app",'
                      f'node="node-{(index * pods + p) % 100}"')
            for j, (name, kind) in enumerate(METRICS):
                self.prefixes.append(f"{name}{{{labels}}} ")
                zero = every > 0 and (p * len(METRICS) + j) % every == 0
                self.rates.append(0.0 if zero else 0.001 * (1 + (p * 7 + j) % 97))
                self.counter.append(kind == "counter")
        head = "".join(f"# TYPE {name} {kind}\n" for name, kind in METRICS)
        self.head = head
        self.t0 = time.monotonic()

    async def handle(self, request: web.Request) -> web.Response:
        t = time.monotonic() - self.t0
        lines = [self.head]
        for prefix, rate, counter in zip(self.prefixes, self.rates, self.counter, strict=True):
            v = rate * t * 1000 if counter or not rate else 1e6 * (2 + math.sin(rate * t))
            lines.append(f"{prefix}{v:.6g}\n")
        return web.Response(text="".join(lines), content_type="text/plain")


async def serve_targets(n: int, pods: int, zero_share: float = 0.0) -> tuple[list[web.AppRunner], list[int]]:
    runners, ports = [], []
    for i in range(n):
        app = web.Application()
        app.router.add_get("/metrics", Target(i, pods, zero_share).handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        ports.append(port)
    return runners, ports


def prometheus_config(ports: list[int], interval: float, receivers: dict[str, str], queue: dict[str, int]) -> str:
    targets = ", ".join(f"'127.0.0.1:{p}'" for p in ports)
    lines = ["global:", f"  scrape_interval: {interval:g}s", f"  scrape_timeout: {min(interval, 10):g}s",
             "scrape_configs:", "  - job_name: pods", f"    static_configs: [{{targets: [{targets}]}}]",
             "remote_write:"]
    for name, url in receivers.items():
        lines += [f"  - url: {url}/api/v1/write", f"    name: {name}"]
        if queue:
            lines.append("    queue_config:")
            lines += [f"      {k}: {v}" for k, v in queue.items()]
    return "\n".join(lines) + "\n"


def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return str(r.read().decode())


def counter(text: str, name: str, labels: str = "") -> float:
    """The sum of a metric's samples whose label text contains ``labels`` (0 when absent)."""
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE):
        if labels in (m.group(1) or ""):
            total += float(m.group(2))
    return total


def metricsd_counts(url: str) -> dict[str, float]:
    text = scrape(url)
    return {"samples": counter(text, "metricsd_samples_ingested_total", 'path="remote_write"'),
            "requests": counter(text, "metricsd_http_requests_total", 'handler="/api/v1/write"'),
            "hits": counter(text, "metricsd_remote_write_layout_hits_total"),
            "misses": counter(text, "metricsd_remote_write_layout_misses_total"),
            "layouts": counter(text, "metricsd_remote_write_layouts")}


def vm_counts(url: str) -> dict[str, float]:
    text = scrape(url)
    return {"samples": counter(text, "vm_rows_inserted_total", 'type="promremotewrite"'),
            "requests": counter(text, "vm_http_requests_total", 'path="/api/v1/write"')}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def start_prometheus(tmp: Path, config: str) -> tuple[subprocess.Popen[bytes], str]:
    (tmp / "prometheus.yml").write_text(config)
    port = free_port()
    argv = ["prometheus", "--enable-feature=agent", f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.agent.path={tmp / 'agent'}", f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    with open(tmp / "prometheus.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    """``name`` set to ``value`` in this process's environment (which the processes started inherit)
    for the block, then as it was."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def start_base(procs: Processes, code: Path) -> Server:
    """A second store run from another checkout's code (``code`` first on its PYTHONPATH, e.g. a
    ``git archive`` of main unpacked): the A/B's other side, fed by the same Prometheus in the same run."""
    with _env("PYTHONPATH", str(code.resolve())):
        return procs.start_metricsd("base")


def start_cluster_b(procs: Processes, flags: str, code: Path | None = None) -> Server:
    """A second cluster whose ``cluster up`` also gets ``flags`` (e.g. ``--no-writes-on-read-port``)
    and, with ``code``, runs that checkout's code in every process (as start_base): an A/B of a
    cluster setting or of two checkouts, both fed by the same Prometheus in the same run (the same
    load on both sides, which separate runs on a shared machine never have)."""
    code_env = _env("PYTHONPATH", str(code.resolve())) if code is not None else contextlib.nullcontext()
    # Its processes start as `python -m metricsd`, which puts their working directory (inherited
    # from here) before PYTHONPATH: run from a checkout, they would all run that checkout's code.
    code_dir = contextlib.chdir(code.resolve()) if code is not None else contextlib.nullcontext()
    with _env("BENCH_CLUSTER_ARGS", f"{os.environ.get('BENCH_CLUSTER_ARGS') or ''} {flags}"), code_env, code_dir:
        return procs.start_metricsd_cluster("metricsd-cluster-b")


def _sys_seconds(pid: int) -> float:
    """The kernel (system) CPU seconds of a process so far (/proc/PID/stat's stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[12]) / os.sysconf("SC_CLK_TCK")


PROFILES = HERE / "results" / "profiles"


def start_profiles(servers: dict[str, Server]) -> list[subprocess.Popen[bytes]]:
    """py-spy of the store, and of the cluster's proxy and first store, over the window (folded
    stacks to PROFILES/profile_rwprom_*.txt; it slows what it samples)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    PROFILES.mkdir(parents=True, exist_ok=True)
    pids = {"store": servers["store"].pid}
    if "cluster" in servers:
        roles = servers["cluster"].pids()
        pids |= {"cluster_proxy": roles["proxy"][0], "cluster_store": roles["store"][0]}
    return [subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "100", "--format", "raw", "--nonblocking",
                              "-o", str(PROFILES / f"profile_rwprom_{name}.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for name, pid in pids.items()]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    queue = {k: v for k, v in (("max_samples_per_send", args.max_samples_per_send),
                               ("min_shards", args.shards), ("max_shards", args.shards)) if v}
    res: dict[str, Any] = {
        "command": " ".join(["perf/bench_rw_prometheus.py", *sys.argv[1:]]), "date": time.strftime("%Y-%m-%d %H:%M"),
        "load_before": _load(), "cores": os.cpu_count(),
        "workload": f"{args.targets} targets x {args.pods} pods x 4 series = {args.targets * args.pods * 4:,d} series, "
                    f"scraped every {args.interval:g} s"
                    + (f", {args.zero_share:.0%} of them at 0" if args.zero_share else ""),
        "queue_config": queue or "Prometheus' defaults",
        "versions": {"prometheus": package_version("prometheus"),
                     "victoriametrics": package_version("victoria-metrics")}}
    tmp = Path(tempfile.mkdtemp(prefix="metricsd-rwprom-"))
    runners, ports = await serve_targets(args.targets, args.pods, args.zero_share)
    prom: subprocess.Popen[bytes] | None = None
    try:
        with Processes() as procs:
            servers: dict[str, Server] = {"victoriametrics": procs.start_victoria_metrics(),
                                          "store": procs.start_metricsd()}
            if args.base:
                servers["base"] = start_base(procs, args.base)
            if args.cluster:
                servers["cluster"] = procs.start_metricsd_cluster()
            if args.cluster_b is not None or args.cluster_base is not None:
                servers["cluster_b"] = start_cluster_b(procs, args.cluster_b or "", args.cluster_base)
            for name in ("cluster", "cluster_b"):
                if name in servers:
                    async with MetricsClient(servers[name].grpc_address, timeout_s=60) as probe:
                        await wait_cluster_ready(probe, name)

            def cpu_now() -> dict[str, float]:
                return {n: server_cpu(s)["all"] for n, s in servers.items()}

            def sys_now() -> dict[str, float]:  # kernel CPU seconds of single-process receivers
                return {n: _sys_seconds(s.pid) for n, s in servers.items() if not s.tree}

            def roles_now() -> dict[str, dict[str, float]]:  # each cluster's CPU by role (proxy, store, control)
                return {n: server_cpu(s) for n, s in servers.items() if s.tree}

            cpu0 = cpu_now()
            await asyncio.sleep(args.idle)
            idle = {n: (c - cpu0[n]) / args.idle for n, c in cpu_now().items()}
            prom, prom_url = start_prometheus(tmp, prometheus_config(
                ports, args.interval, {n: s.url for n, s in servers.items()}, queue))
            print(f"Prometheus agent at {prom_url}; warming up {args.warmup:g} s ...", flush=True)
            await asyncio.sleep(args.warmup)
            if prom.poll() is not None:
                raise RuntimeError(f"prometheus exited: {(tmp / 'prometheus.log').read_text()[-2000:]}")
            counts = {"store": metricsd_counts, "base": metricsd_counts, "cluster": metricsd_counts,
                      "cluster_b": metricsd_counts, "victoriametrics": vm_counts}
            c0 = {n: await asyncio.to_thread(counts[n], s.url) for n, s in servers.items()}
            spies = start_profiles(servers) if args.profile else []
            t0 = time.monotonic()
            cpu0, roles0, sys0 = cpu_now(), roles_now(), sys_now()
            await asyncio.sleep(args.seconds)
            cpu1, roles1, sys1 = cpu_now(), roles_now(), sys_now()
            for spy in spies:
                spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            for spy in spies:
                spy.wait(timeout=60)
            wall = time.monotonic() - t0
            c1 = {n: await asyncio.to_thread(counts[n], s.url) for n, s in servers.items()}
            ptext = await asyncio.to_thread(scrape, prom_url)
            res["pending"] = {n: counter(ptext, "prometheus_remote_storage_samples_pending", f'remote_name="{n}"')
                              for n in servers}
            res["prometheus_sent"] = {n: counter(ptext, "prometheus_remote_storage_samples_total",
                                                 f'remote_name="{n}"') for n in servers}
            out: dict[str, Any] = {}
            for n in servers:
                d = {k: c1[n][k] - c0[n].get(k, 0.0) for k in c1[n]}
                cpu = cpu1[n] - cpu0[n]
                busy = cpu - idle[n] * wall
                samples = max(1.0, d["samples"])
                out[n] = {**d, "wall_s": wall, "cpu_s": cpu, "idle_cpu_per_s": idle[n],
                          "samples_per_s": d["samples"] / wall,
                          "cpu_s_per_million": cpu / samples * 1e6, "busy_cpu_s_per_million": busy / samples * 1e6,
                          "samples_per_request": d["samples"] / max(1.0, d["requests"])}
                if n in sys1:
                    out[n]["system_share"] = (sys1[n] - sys0[n]) / max(1e-9, cpu)
                if n in roles1:
                    out[n]["by_role"] = {r: (v - roles0[n].get(r, 0.0)) / samples * 1e6 for r, v in roles1[n].items()
                                         if r != "all"}
                if n != "victoriametrics":
                    out[n]["layouts"] = c1[n]["layouts"]
                    looked = d["hits"] + d["misses"]
                    out[n]["hit_rate"] = d["hits"] / looked if looked else 0.0
            res["window"] = out
    finally:
        if prom is not None and prom.poll() is None:
            prom.send_signal(signal.SIGTERM)
            try:
                prom.wait(timeout=20)
            except subprocess.TimeoutExpired:
                prom.kill()
                prom.wait()
        for r in runners:
            await r.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    res["load_after"] = _load()
    return res


def markdown(res: dict[str, Any]) -> str:
    w = res["window"]
    vm = w["victoriametrics"]
    lines = [f"Command: `{res['command']}` ({res['date']}, {res['cores']} cores; load before / after "
             f"{res['load_before']} / {res['load_after']}). Workload: {res['workload']}; queue: {res['queue_config']}.",
             "", "| receiver | samples/s | samples a request | CPU s per million (raw) | of which (raw) | less idle | "
             "CPU / VictoriaMetrics (less idle) | pending at the end |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for n, r in w.items():
        roles = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r.get("by_role", {}).items()))
        ratio = "-" if n == "victoriametrics" else (
            f"{r['cpu_s_per_million'] / vm['cpu_s_per_million']:.2f} "
            f"({r['busy_cpu_s_per_million'] / max(1e-9, vm['busy_cpu_s_per_million']):.2f})")
        lines.append(f"| {n} | {r['samples_per_s']:,.0f} | {r['samples_per_request']:,.0f} | "
                     f"{r['cpu_s_per_million']:.2f} | {roles or '-'} | {r['busy_cpu_s_per_million']:.2f} | {ratio} | "
                     f"{res['pending'].get(n, 0):,.0f} |")
    shares = ", ".join(f"{n} {r['system_share']:.0%}" for n, r in w.items() if "system_share" in r)
    if shares:
        lines += ["", f"Kernel (system) share of each process' CPU in the window: {shares}."]
    for n in ("store", "base", "cluster", "cluster_b"):
        if (st := w.get(n)) is not None:
            lines += ["", f"Layout memo of the {n}'s receiver in the window: {st['hits']:,.0f} hits, "
                          f"{st['misses']:,.0f} misses of {st['requests']:,.0f} write requests (hit rate "
                          f"{st['hit_rate']:.1%}); {st['layouts']:.0f} layouts kept."]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", type=int, default=10, help="scrape targets")
    ap.add_argument("--pods", type=int, default=1000, help="pods a target (4 series each)")
    ap.add_argument("--interval", type=float, default=2.0, help="scrape interval, seconds")
    ap.add_argument("--zero-share", type=float, default=0.0,
                    help="share of the series that stay at 0 (an unmoved counter; protobuf leaves the value out)")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of each receiver's idle CPU measured first")
    ap.add_argument("--warmup", type=float, default=30.0, help="seconds before the window")
    ap.add_argument("--seconds", type=float, default=90.0, help="the measured window")
    ap.add_argument("--max-samples-per-send", type=int, default=0, help="queue_config (0: Prometheus' default, 500)")
    ap.add_argument("--shards", type=int, default=0, help="min_shards = max_shards (0: Prometheus' own scaling)")
    ap.add_argument("--cluster", action="store_true", help="a third queue: a local cluster (RF 3)")
    ap.add_argument("--base", type=Path, help="also a store running this checkout's code (an A/B in one run)")
    ap.add_argument("--cluster-b", metavar="FLAGS",
                    help="also a second cluster whose `cluster up` gets these flags (an A/B of a cluster setting)")
    ap.add_argument("--cluster-base", type=Path, metavar="CODE",
                    help="also a second cluster (cluster_b) running this checkout's code (an A/B of two checkouts)")
    ap.add_argument("--profile", action="store_true", help="py-spy the stores and the proxy (not a timing run)")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "bench_rw_prometheus.json")
    args = ap.parse_args()
    if shutil.which("prometheus") is None:
        raise SystemExit("needs Debian's prometheus package: make prometheus-deps (as root)")
    ensure_installed()
    res = asyncio.run(run(args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=1))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
