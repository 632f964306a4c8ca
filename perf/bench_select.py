"""Selection and evaluation over many series: metricsd and VictoriaMetrics side by side, one run
(a documented command, not a test).

    .venv/bin/python perf/bench_select.py                  # 50,000 pods, 200,000 series, 2 h at 10 s (144 M samples)
    .venv/bin/python perf/bench_select.py --scale 0.5      # 5,000 pods: a quick look
    .venv/bin/python perf/bench_select.py --ab /tmp/base   # also a metricsd from another checkout (A/B)
    .venv/bin/python perf/bench_select.py --profile        # py-spy of metricsd during each query

1. Starts `metricsd up --no-simulate --no-consumers` (one store process, series limits off) and
   VictoriaMetrics 1.79 (no latency offset, no response cache, the series API's limit raised past
   the workload) on 127.0.0.1; with ``--ab DIR`` a second metricsd whose code comes from DIR
   (``PYTHONPATH``), fed the same data, so before and after are timed in the same run.
2. Feeds them the side-by-side workload (perf/compare_workload.py at ``--scale``: 4 series a pod),
   60 ticks a request block, 1,000 series a request: columnar gRPC Write to metricsd, Prometheus
   remote write 1.0 to VictoriaMetrics (bodies encoded with NumPy, not a message per sample).
3. Checks that every system gives the same answer to every question (counts are exact), then
   times each question ``--rounds`` times per system, systems interleaved (A B C, then C B A).
   Questions: the issue's selections (50,000 series each, positive and negative matchers), the
   count of every sample (four selectors), the HPA question (pushed down in metricsd), an engine
   path query, and Grafana's series / labels / label values lookups with a match[] over 50,000
   series.
4. Prints a Markdown table (median and best seconds, ratio to VictoriaMetrics) and writes it with
   the machine's load to perf/results/bench_select.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import cramjam
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_peers import METRICSD, Processes, Server, ensure_installed, free_port
from compare_workload import Workload, WorkloadConfig
from procstat import rss_bytes

from metricsd.agent.batches import write_requests
from metricsd.model import Labels
from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import StreamingBackend
from metricsd.rpc.wire import length_delimited, varint

HERE = Path(__file__).resolve().parent
CPU = "container_cpu_usage_seconds_total"
METRICS = (CPU, "container_memory_working_set_bytes", "kube_pod_container_resource_requests",
           "kube_pod_container_resource_limits")
RW_HEADERS = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
              "X-Prometheus-Remote-Write-Version": "0.1.0"}
INFLIGHT = 4


# --- feeding ---------------------------------------------------------------------------------------


def _label_bytes(labels: Labels) -> bytes:
    """A remote write TimeSeries' labels (field 1, Label{name = 1, value = 2})."""
    return b"".join(length_delimited(1, length_delimited(1, k.encode()) + length_delimited(2, v.encode()))
                    for k, v in labels)


def remote_write_body(label_bytes: list[bytes], stamps: np.ndarray, values: np.ndarray) -> bytes:
    """A snappy remote write 1.0 body, ``values[t, s]`` of series s at ``stamps[t]``, encoded with
    NumPy: each Sample is ``0x12 0x10 | 0x09 double | 0x10 varint(ts)`` with every timestamp a
    6-byte varint (2^35 <= ts < 2^42 ms: 1971 to 2109), so a series' samples are one array row."""
    ts = np.asarray(stamps, dtype=np.int64)
    if ts.min() < 2**35 or ts.max() >= 2**42:
        raise ValueError("timestamps must be 6-byte varints")
    n_t, n_s = values.shape
    rec = np.zeros((n_s, n_t, 18), dtype=np.uint8)
    rec[:, :, 0], rec[:, :, 1], rec[:, :, 2], rec[:, :, 11] = 0x12, 16, 0x09, 0x10
    rec[:, :, 3:11] = np.ascontiguousarray(values.T, dtype="<f8").view(np.uint8).reshape(n_s, n_t, 8)
    shifts = np.arange(6, dtype=np.int64) * 7
    var = ((ts[:, None] >> shifts[None, :]) & 0x7F).astype(np.uint8)
    var[:, :5] |= 0x80
    rec[:, :, 12:18] = var[None, :, :]
    rows = rec.reshape(n_s, n_t * 18)
    parts = []
    for s in range(n_s):
        body = label_bytes[s] + rows[s].tobytes()
        parts.append(b"\x0a" + varint(len(body)) + body)
    return bytes(cramjam.snappy.compress_raw(b"".join(parts)))


@dataclass
class Feed:
    """The workload's blocks as gRPC requests and remote write bodies, block by block."""

    wl: Workload
    per_request: int = 1000

    def __post_init__(self) -> None:
        self.label_bytes = [_label_bytes(s) for s in self.wl.series]
        self._labels_sent = False

    def block(self, ticks: int) -> tuple[list[Any], list[bytes], int]:
        stamps, values = self.wl.sim.block(ticks)
        block = values[:, self.wl.source.cols]
        grpc = write_requests(self.wl.source, stamps, block, max_samples=self.per_request * ticks,
                              send_labels_for=set() if self._labels_sent else None)
        self._labels_sent = True
        bodies = [remote_write_body(self.label_bytes[s0:s0 + self.per_request], stamps,
                                    block[:, s0:s0 + self.per_request])
                  for s0 in range(0, block.shape[1], self.per_request)]
        return grpc, bodies, block.size


async def _gather_limited(calls: list[Callable[[], Awaitable[None]]]) -> None:
    sem = asyncio.Semaphore(INFLIGHT)

    async def one(c: Callable[[], Awaitable[None]]) -> None:
        async with sem:
            await c()

    await asyncio.gather(*(one(c) for c in calls))


async def feed_all(feed: Feed, ticks: int, grpc: dict[str, StreamingBackend], vm: Server,
                   http: aiohttp.ClientSession) -> dict[str, float]:
    """Every tick, 60 a block; returns each system's wall seconds of ingest."""
    wall = dict.fromkeys([*grpc, "victoriametrics"], 0.0)

    async def rw(body: bytes) -> None:
        async with http.post(vm.url + "/api/v1/write", data=body, headers=RW_HEADERS) as resp:
            if resp.status >= 300:
                raise RuntimeError(f"VictoriaMetrics remote write: HTTP {resp.status}: {await resp.text()}")

    def grpc_call(client: StreamingBackend, req: Any) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            resp = await client.write(req)
            if resp.unknown_ids or resp.rejected_too_old:
                raise RuntimeError(f"metricsd write: unexpected response {resp}")
        return call

    sent = 0
    while sent < ticks:
        n = min(60, ticks - sent)
        reqs, bodies, _ = feed.block(n)
        sent += n
        for name, client in grpc.items():
            t0 = time.perf_counter()
            await _gather_limited([grpc_call(client, r) for r in reqs])
            wall[name] += time.perf_counter() - t0
        t0 = time.perf_counter()
        await _gather_limited([lambda b=b: rw(b) for b in bodies])  # type: ignore[misc]
        wall["victoriametrics"] += time.perf_counter() - t0
        print(f"  fed {sent}/{ticks} ticks", flush=True)
    return wall


# --- questions -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    key: str
    title: str
    path: str  # /api/v1/...
    params: tuple[tuple[str, str], ...]
    pushed_down: bool = False
    rtol: float = 0.0  # rate() differs: VictoriaMetrics does not extrapolate as Prometheus (and metricsd) do


def questions(at_ms: int, start_ms: int) -> list[Question]:
    t = f"{at_ms / 1000:.3f}"
    window = f"{(at_ms - start_ms) // 1000 + 10}s"

    def q(key: str, title: str, promql: str, pushed_down: bool = False, rtol: float = 0.0) -> Question:
        return Question(key, title, "/api/v1/query", (("query", promql), ("time", t)), pushed_down, rtol)

    span = (("start", f"{start_ms / 1000 - 60:.3f}"), ("end", t))
    sel = f'{{__name__="{CPU}"}}'
    return [
        q("count", "count(count_over_time(cpu[6s]))", f"count(count_over_time({CPU}[6s]))"),
        q("neg_absent", 'the same, {peer_bench_poll!="7"}',
          f'count(count_over_time({CPU}{{peer_bench_poll!="7"}}[6s]))'),
        q("neg_empty", 'the same, {container!=""}', f'count(count_over_time({CPU}{{container!=""}}[6s]))'),
        q("neg_regex", 'the same, {namespace!~"ns-1.*"}', f'count(count_over_time({CPU}{{namespace!~"ns-1.*"}}[6s]))'),
        *[q(f"samples_{i}", f"sum(count_over_time({m}[{window}]))", f"sum(count_over_time({m}[{window}]))")
          for i, m in enumerate(METRICS)],
        q("hpa", "the HPA question over Deployment big",
          f'sum(rate({CPU}{{workload="big"}}[1m])) / '
          'sum(kube_pod_container_resource_requests{resource="cpu",workload="big"})', pushed_down=True, rtol=1e-2),
        q("engine", "count(rate(cpu[1m]) >= 0) (engine path)", f"count(rate({CPU}[1m]) >= 0)"),
        Question("series", "/api/v1/series, match[] over 50,000 series", "/api/v1/series", (("match[]", sel), *span)),
        Question("labels", "/api/v1/labels, match[] over 50,000 series", "/api/v1/labels", (("match[]", sel), *span)),
        Question("values", "/api/v1/label/pod/values, match[] over 50,000 series", "/api/v1/label/pod/values",
                 (("match[]", sel), *span)),
    ]


async def ask(http: aiohttp.ClientSession, url: str, q: Question) -> Any:
    async with http.post(url + q.path, data=dict(q.params)) as resp:
        body = await resp.json(content_type=None)
        if resp.status != 200 or body.get("status") != "success":
            raise RuntimeError(f"{url}{q.path} {dict(q.params)}: HTTP {resp.status}: {str(body)[:500]}")
        return body["data"]


def canonical(q: Question, data: Any) -> Any:
    """The answer in a shape both systems agree on: sorted lists (a query's values apart)."""
    if q.path == "/api/v1/query":
        return sorted((tuple(sorted(r["metric"].items())), float(r["value"][1])) for r in data["result"])
    if q.key == "series":
        return sorted(tuple(sorted(s.items())) for s in data)
    return sorted(data)


def same(q: Question, a: Any, b: Any) -> bool:
    """Whether two canonical answers agree: exactly, or within ``q.rtol`` for a query's values."""
    if q.path != "/api/v1/query":
        return bool(a == b)
    return len(a) == len(b) and all(la == lb and abs(va - vb) <= q.rtol * max(abs(va), abs(vb))
                                    for (la, va), (lb, vb) in zip(a, b, strict=True))


def summary(data: Any) -> str:
    if isinstance(data, dict) and "result" in data:
        rows = data["result"]
        return f"{len(rows)} rows" + (f", first {rows[0]['value'][1]}" if rows else "")
    return f"{len(data)} items"


# --- timing ----------------------------------------------------------------------------------------


async def time_question(http: aiohttp.ClientSession, urls: dict[str, str], q: Question, rounds: int
                        ) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {n: [] for n in urls}
    names = list(urls)
    for n in names:
        await ask(http, urls[n], q)  # warm
    for r in range(rounds):
        for n in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            await ask(http, urls[n], q)
            out[n].append(time.perf_counter() - t0)
    return out


class Spy:
    """py-spy recording one process into a folded-stacks file while open."""

    def __init__(self, pid: int, path: Path) -> None:
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        self.proc = subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "200", "--format", "raw",
                                      "--nonblocking", "-o", str(path)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        time.sleep(1.0)

    def close(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=60)


def start_metricsd(procs: Processes, name: str, pythonpath: str | None) -> Server:
    d = procs._tmp / name
    d.mkdir()
    grpc_port, http_port = free_port(), free_port()
    argv = [str(METRICSD), "--log-level", "WARNING", "up", "--no-simulate", "--no-consumers", "--grpc-port",
            str(grpc_port), "--http-port", str(http_port), "--max-series", "0", "--max-new-series-per-minute", "0"]
    env_path = os.environ.get("PYTHONPATH")
    if pythonpath is not None:
        os.environ["PYTHONPATH"] = pythonpath
    try:
        return procs._start(name, argv, f"http://127.0.0.1:{http_port}", "/api/v1/status/buildinfo", d,
                            grpc_address=f"127.0.0.1:{grpc_port}")
    finally:
        if pythonpath is not None:
            if env_path is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = env_path


def start_victoria_metrics(procs: Processes) -> Server:
    d = procs._tmp / "victoria-metrics"
    d.mkdir()
    port = free_port()
    argv = ["victoria-metrics", f"-storageDataPath={d}", f"-httpListenAddr=127.0.0.1:{port}",
            "-search.latencyOffset=0s", "-search.disableCache", "-retentionPeriod=2d", "-loggerLevel=WARN",
            "-search.maxSeries=10000000", "-search.maxUniqueTimeseries=10000000"]
    return procs._start("victoriametrics", argv, f"http://127.0.0.1:{port}", "/health", d)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    end = (time.time_ns() // 1_000_000 // 10_000) * 10_000 - 10_000
    cfg = WorkloadConfig(end_ms=end, ticks=round(args.hours * 360), live_ticks=0).scaled(args.scale)
    wl = Workload(cfg)
    feed = Feed(wl)
    res: dict[str, Any] = {"command": " ".join([".venv/bin/python", "perf/bench_select.py", *sys.argv[1:]]),
                           "cores": os.cpu_count(), "python": platform.python_version(),
                           "date": time.strftime("%Y-%m-%d"), "series": len(wl.series),
                           "samples": len(wl.series) * cfg.ticks, "load_before": os.getloadavg()}
    prof = HERE / "results" / "profiles" if args.profile else None
    if prof is not None:
        prof.mkdir(parents=True, exist_ok=True)
    with Processes() as procs:
        servers = {"metricsd": start_metricsd(procs, "metricsd", None)}
        if args.ab:
            servers["metricsd-base"] = start_metricsd(procs, "metricsd-base", str(Path(args.ab).resolve()))
        servers["victoriametrics"] = start_victoria_metrics(procs)
        async with AsyncExitStack() as stack:
            http = await stack.enter_async_context(aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=16), timeout=aiohttp.ClientTimeout(total=900)))
            grpc = {n: StreamingBackend(open_channel(s.grpc_address), timeout_s=300)
                    for n, s in servers.items() if s.grpc_address}
            for w in grpc.values():
                stack.push_async_callback(w.close)
            print(f"feeding {len(wl.series):,} series x {cfg.ticks} ticks ...", flush=True)
            res["ingest_wall_s"] = await feed_all(feed, cfg.ticks, grpc, servers["victoriametrics"], http)
            urls = {n: s.url for n, s in servers.items()}
            qs = questions(wl.last_ms + 5_000, wl.start_ms)
            # VictoriaMetrics makes fresh samples searchable within a few seconds: wait until it counts them all.
            deadline = time.monotonic() + 300
            for q in qs[4:8]:
                while True:
                    a = [canonical(q, await ask(http, u, q)) for u in urls.values()]
                    if all(same(q, x, a[0]) for x in a) or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(2.0)
            res["rss_mib"] = {n: rss_bytes(s.pid) / 2**20 for n, s in servers.items()}
            res["questions"] = {}
            for q in qs:
                if args.only and q.key not in args.only.split(","):
                    continue
                answers = {n: await ask(http, u, q) for n, u in urls.items()}
                shapes = {n: canonical(q, a) for n, a in answers.items()}
                agree = all(same(q, s, shapes["victoriametrics"]) for s in shapes.values())
                spy = Spy(servers["metricsd"].pid, prof / f"select_{q.key}.txt") if prof is not None else None
                try:
                    times = await time_question(http, urls, q, args.rounds)
                finally:
                    if spy is not None:
                        spy.close()
                row = {"title": q.title, "path": q.path, "params": dict(q.params), "agree": agree,
                       "answers": {n: summary(a) for n, a in answers.items()},
                       "median_s": {n: float(np.median(t)) for n, t in times.items()},
                       "best_s": {n: float(np.min(t)) for n, t in times.items()}, "load": os.getloadavg()}
                res["questions"][q.key] = row
                print(line(q.key, row), flush=True)
    res["load_after"] = os.getloadavg()
    return res


def line(key: str, row: dict[str, Any]) -> str:
    med = row["median_s"]
    vm = med["victoriametrics"]
    cells = [f"{med[n] * 1000:,.1f}" for n in med]
    ratio = med["metricsd"] / vm if vm else float("nan")
    return (f"| {key} | {row['title']} | " + " | ".join(cells) + f" | {ratio:.2f}x | "
            f"{'yes' if row['agree'] else 'NO: ' + str(row['answers'])} |")


def markdown(res: dict[str, Any]) -> str:
    names = list(next(iter(res["questions"].values()))["median_s"])
    head = ("| key | question | " + " | ".join(f"{n}, ms" for n in names)
            + " | metricsd / VictoriaMetrics | same answer |")
    out = [head, "| --- " * (len(names) + 4) + "|"]
    out += [line(k, row) for k, row in res["questions"].items()]
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=5.0, help="x 10,000 pods (5: 50,000 pods, 200,000 series)")
    p.add_argument("--hours", type=float, default=2.0, help="hours of data at 10 s")
    p.add_argument("--rounds", type=int, default=5, help="timed runs per question and system")
    p.add_argument("--ab", help="also run a metricsd whose code is in this directory (PYTHONPATH), for an A/B")
    p.add_argument("--only", help="comma-separated question keys to time")
    p.add_argument("--profile", action="store_true", help="py-spy of metricsd while each question is timed")
    args = p.parse_args()
    ensure_installed()
    res = asyncio.run(run(args))
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "bench_select.json").write_text(json.dumps(res, indent=1))
    print(f"command: {res['command']}; load before {res['load_before']}, after {res['load_after']}")
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
