"""``metricsd up``: the embedded default, one process with a store and a simulated agent.

The simulator backfills the last hour before the first query can be asked, then feeds one tick
per interval in real time, through the same gRPC Write path that node agents use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.backend import LocalBackend
from metricsd.client import MetricsClient
from metricsd.clock import Clock, SystemClock
from metricsd.consumers.consumerset import ConsumerSet, start_consumers
from metricsd.http.server import serve_http, stop_http
from metricsd.store.api import StoreAPI
from metricsd.store.durable import Durability, open_store, run_durability
from metricsd.store.engine import Store
from metricsd.store.node import StoreNodeServicer
from metricsd.store.server import gc_loop, start_grpc_server
from metricsd.wire import labels_to_pb

log = logging.getLogger("metricsd.up")

DEFAULT_GRPC_PORT = 7401
DEFAULT_HTTP_PORT = 7400
EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "deploy" / "examples"


@dataclass(frozen=True)
class UpOptions:
    grpc_port: int = DEFAULT_GRPC_PORT
    http_port: int = DEFAULT_HTTP_PORT
    data_dir: Path | None = None
    simulate: bool = True
    pods: int = 200
    workloads: int = 10
    nodes: int = 5
    seed: int = 0
    interval_ms: int = 10_000
    backfill_ms: int = 3_600_000
    host: str = "127.0.0.1"
    consumers: bool = True
    wal_fsync: str = "interval"
    examples_dir: Path = field(default_factory=lambda: EXAMPLES_DIR)


class SimulatedAgent:
    """Feeds a simulator's ticks into a metricsd gRPC endpoint."""

    def __init__(self, sim: Simulator, client: MetricsClient, clock: Clock) -> None:
        self.sim = sim
        self.client = client
        self.clock = clock
        self.labels_of = {int(sid): labels_to_pb(lab) for sid, lab in zip(sim.series_ids.tolist(), sim.series,
                                                                            strict=True)}
        self.samples_sent = 0
        self._labels_sent = False

    async def _send(self, ts: int | object, values: object) -> None:
        reqs = write_requests(self.sim, ts, values, max_samples=60_000,  # type: ignore[arg-type]
                              send_labels_for=None if not self._labels_sent else set())
        self._labels_sent = True
        for req in reqs:
            resp = await self.client.write(req, self.labels_of)
            if resp.unknown_ids:
                raise RuntimeError(f"store does not know {len(resp.unknown_ids)} series even after resending labels")
            self.samples_sent += len(req.values)

    async def backfill(self, until_ms: int, ticks_per_batch: int = 60) -> None:
        t0 = time.perf_counter()
        while self.sim.next_timestamp_ms <= until_ms:
            n = min(ticks_per_batch, (until_ms - self.sim.next_timestamp_ms) // self.sim.config.interval_ms + 1)
            ts, values = self.sim.block(int(n))
            await self._send(ts, values)
        log.info("backfilled %d samples in %.1f s", self.samples_sent, time.perf_counter() - t0)

    async def run_live(self) -> None:
        while True:
            wait_ms = self.sim.next_timestamp_ms - self.clock.now_ms()
            if wait_ms > 0:
                await asyncio.sleep(wait_ms / 1000)
            ts, values = self.sim.next_tick()
            try:
                await self._send(ts, values)
            except Exception as e:  # keep feeding: a demo outlives a hiccup
                log.warning("simulated agent: write at %d failed: %s", ts, e)


async def run_up(opts: UpOptions, ready: asyncio.Event | None = None) -> None:
    clock = SystemClock()
    durability: Durability | None = None
    if opts.data_dir is not None:
        # Recover what the last run acknowledged (snapshot + WAL replay), then log every write.
        store, durability = open_store(opts.data_dir, fsync=opts.wal_fsync, clock=clock)
        api: StoreAPI = durability.api(member="up")
        log.info("store recovered from %s: %d series, %d samples", opts.data_dir, store.stats()["series"],
                 store.stats()["samples"])
    else:
        store = Store()
        api = StoreAPI(store, member="up")
        log.info("no --data-dir: data lives in memory only and is lost when metricsd stops")
    backend = LocalBackend(api)
    server, port = await start_grpc_server(StoreNodeServicer(backend, api), opts.host, opts.grpc_port)
    tasks = [asyncio.create_task(run_durability(durability) if durability is not None else gc_loop(store))]
    addr = f"{opts.host}:{port}"
    log.info("store serving gRPC on %s", addr)
    consumers: ConsumerSet | None = None
    if opts.consumers and opts.examples_dir.is_dir():
        consumers = start_consumers(backend, clock, opts.examples_dir, checkpoint_dir=opts.data_dir)
    elif opts.consumers:
        log.warning("no consumer specs at %s: HPA, VPA and overcommit are not running", opts.examples_dir)
    http_runner, http_port = await serve_http(backend, opts.host, opts.http_port, CollectorRegistry(), clock,
                                              consumers=consumers.document if consumers is not None else None)
    client = MetricsClient(addr)
    if opts.simulate:
        cfg = SimConfig(pods=opts.pods, workloads=opts.workloads, nodes=opts.nodes, seed=opts.seed,
                        interval_ms=opts.interval_ms)
        now = clock.now_ms()
        sim = Simulator(cfg, max(0, now - opts.backfill_ms))
        agent = SimulatedAgent(sim, client, clock)
        await agent.backfill(now)
        tasks.append(asyncio.create_task(agent.run_live()))
        st = await client.stats()
        log.info("simulating %d pods in %d workloads on %d nodes: %d series, %d samples", opts.pods,
                 opts.workloads, opts.nodes, st.series, st.samples)
    if consumers is not None:
        await consumers.start()
    print(_banner(addr, f"http://{opts.host}:{http_port}", consumers is not None), flush=True)
    if ready is not None:
        ready.set()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        for t in tasks:
            t.cancel()
        if consumers is not None:
            await consumers.stop()
        await stop_http(http_runner)
        await client.close()
        await server.stop(grace=2.0)
        if durability is not None:
            durability.close()  # a final snapshot: the next start replays nothing


def _banner(addr: str, http: str, consumers: bool) -> str:
    lines = [
        "",
        f"metricsd is up. gRPC API: {addr}   HTTP API: {http}",
        "Ask it a question from another shell, e.g. the average CPU use (cores) per pod of a workload:",
        f"  metricsd query --addr {addr} --metric container_cpu_usage_seconds_total \\",
        "      --selector 'workload=\"feed-api\"' --fn rate --across avg --window 1m",
        "or CPU utilisation against requests, per workload:",
        f"  metricsd query --addr {addr} --metric container_cpu_usage_seconds_total --fn rate --across sum \\",
        "      --by workload --ratio-metric kube_pod_container_resource_requests --ratio-selector 'resource=\"cpu\"'",
        "or in PromQL over HTTP (Grafana's Prometheus data source works too):",
        f"  curl -sG {http}/api/v1/query \\",
        "      --data-urlencode 'query=avg by (workload) (rate(container_cpu_usage_seconds_total[1m]))'",
    ]
    if consumers:
        lines += [
            "The HPA, VPA and overcommit advisor run on deploy/examples/ (dry run); their decisions:",
            f"  metricsd hpa status --url {http}    (likewise vpa, overcommit)",
        ]
    lines.append("Stop with Ctrl-C.")
    return "\n".join(lines)
