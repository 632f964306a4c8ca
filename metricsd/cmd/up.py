"""``metricsd up``: the embedded default, one process with a store and a simulated agent.

The simulator backfills the last hour before the first query can be asked, then feeds one tick
per interval in real time, through the same gRPC Write path that node agents use.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.clock import Clock, SystemClock
from metricsd.cmd.onwardflags import add_onward_arguments, start_onward, targets_from_args
from metricsd.cmd.queryflags import add_query_arguments, add_remote_write_arguments, http_settings_from_args
from metricsd.cmd.runner import port, run_main, stop_event
from metricsd.cmd.security import add_security_arguments, client_from_args, require_secure_or_loopback, server_from_args
from metricsd.cmd.store import add_limit_arguments, store_settings
from metricsd.defaults import GRPC_PORT, HOST, HTTP_PORT, SNAPSHOT_INTERVAL_S
from metricsd.http.server import serve_http, stop_http
from metricsd.http.settings import HttpSettings
from metricsd.replica.servicer import StoreNodeServicer
from metricsd.rpc.backend import MetricsBackend
from metricsd.rpc.client import MetricsClient
from metricsd.rpc.server import start_grpc_server
from metricsd.rpc.wire import labels_to_pb
from metricsd.security.settings import ClientSecurity, ServerSecurity
from metricsd.security.tls import ClientTLS
from metricsd.security.tokens import Role
from metricsd.store.api import LocalBackend, StoreAPI, gc_loop
from metricsd.store.durable import Durability, DurabilitySettings, open_store, run_durability
from metricsd.store.engine import Store
from metricsd.store.settings import StoreSettings

if TYPE_CHECKING:
    from metricsd.consumers.consumerset import ConsumerSet

log = logging.getLogger("metricsd.cmd.up")

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "examples"


@dataclass(frozen=True)
class UpOptions:
    grpc_port: int = GRPC_PORT
    http_port: int = HTTP_PORT
    data_dir: Path | None = None
    simulate: bool = True
    pods: int = 200
    workloads: int = 10
    nodes: int = 5
    seed: int = 0
    interval_ms: int = 10_000
    backfill_ms: int = 3_600_000
    host: str = HOST
    consumers: bool = True
    publish_decisions: bool = True  # the consumers write their decisions back as series
    wal_fsync: str = "interval"
    snapshot_every_s: float = SNAPSHOT_INTERVAL_S
    examples_dir: Path = field(default_factory=lambda: EXAMPLES_DIR)
    store_settings: StoreSettings | None = None  # None: StoreSettings() (no series limit)
    security: ServerSecurity = field(default_factory=ServerSecurity)  # of both listeners
    client_tls: ClientTLS | None = None  # what the simulated agent trusts (default: the server's certificate)
    tls_server_name: str | None = None
    http_settings: HttpSettings = field(default_factory=HttpSettings)
    onward_args: argparse.Namespace | None = None  # the sending-onward flags (cmd/onwardflags.py)


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
        store, durability = open_store(opts.data_dir, settings=opts.store_settings, fsync=opts.wal_fsync, clock=clock,
                                       durability=DurabilitySettings(snapshot_interval_s=opts.snapshot_every_s))
        api: StoreAPI = durability.api(member="up")
        log.info("store recovered from %s: %d series, %d samples", opts.data_dir, store.stats()["series"],
                 store.stats()["samples"])
    else:
        store = Store(opts.store_settings)
        api = StoreAPI(store, member="up", clock=clock)
        log.info("no --data-dir: data lives in memory only and is lost when metricsd stops")
    backend: MetricsBackend = LocalBackend(api)
    registry = CollectorRegistry()
    onward, onward_tmp = (start_onward(opts.onward_args, opts.data_dir, registry, clock)
                          if opts.onward_args is not None else (None, None))
    if onward is not None:  # every acknowledged write, whoever sent it, goes onward once
        from metricsd.onward.tee import OnwardBackend  # pyarrow (~90 MiB resident) only when sending onward

        backend = OnwardBackend(backend, onward, max_future_ms=store.settings.max_future_ms)
        onward.start()
    server, port = await start_grpc_server(StoreNodeServicer(backend, api), opts.host, opts.grpc_port, opts.security)
    tasks = [asyncio.create_task(run_durability(durability) if durability is not None else gc_loop(store.gc))]
    addr = f"{opts.host}:{port}"
    log.info("store serving gRPC on %s", addr)
    consumers: ConsumerSet | None = None
    if opts.consumers and opts.examples_dir.is_dir():
        from metricsd.consumers.consumerset import start_consumers  # only when they run: ~3 MiB of RSS

        consumers = start_consumers(backend, clock, opts.examples_dir, checkpoint_dir=opts.data_dir,
                                    publish=opts.publish_decisions, registry=registry)
    elif opts.consumers:
        log.warning("no consumer specs at %s: HPA, VPA, overcommit and colocation are not running", opts.examples_dir)
    http_runner, http_port = await serve_http(backend, opts.host, opts.http_port, registry, clock,
                                              consumers=consumers.document if consumers is not None else None,
                                              security=opts.security, settings=opts.http_settings)
    client = MetricsClient(_dial(opts.host, port), security=_own_client(opts))
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
    parquet = getattr(opts.onward_args, "parquet_dir", None)
    if parquet:  # after the simulated backfill: an hour written before it would be written empty, for good
        # Reads need no tee: the store's own rows, read a slice at a time as columns, no selector
        # and no message at all (store/hourread.py).
        from metricsd.onward.hourly import HourlyParquet  # pyarrow only when writing Parquet
        from metricsd.store.hourread import StoreHour

        writer = HourlyParquet(LocalBackend(api), parquet, clock,
                               check_s=getattr(opts.onward_args, "parquet_check", 60.0), source=StoreHour(api))
        tasks.append(asyncio.create_task(writer.run()))
    if consumers is not None:
        await consumers.start()
    scheme = "https" if opts.security.tls is not None else "http"
    print(_banner(addr, f"{scheme}://{opts.host}:{http_port}", consumers is not None), flush=True)
    if ready is not None:
        ready.set()
    stop = stop_event()
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
        if onward is not None:
            await onward.close()
        if onward_tmp is not None:
            onward_tmp.cleanup()
        if durability is not None:
            durability.close()  # a final snapshot: the next start replays nothing


def _dial(host: str, port: int) -> str:
    return f"{'127.0.0.1' if host in ('0.0.0.0', '', '::') else host}:{port}"


def _own_client(opts: UpOptions) -> ClientSecurity:
    """How the simulated agent reaches this process's gRPC API: over its TLS (trusting
    ``client_tls``, else the server's own certificate) with an in-memory write token."""
    tls = None
    if opts.security.tls is not None:
        tls = opts.client_tls or ClientTLS(ca=opts.security.tls.cert, server_name=opts.tls_server_name)
    auth = opts.security.auth
    token = auth.issue_internal("up-simulated-agent", frozenset({Role.WRITE, Role.READ})) if auth else None
    return ClientSecurity(tls, token)


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
            "The HPA, VPA, overcommit advisor and colocation plan run on deploy/examples/ (dry run); their decisions:",
            f"  metricsd hpa status --url {http}    (likewise vpa, overcommit, colocation)",
        ]
    lines.append("Stop with Ctrl-C.")
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("up", help="one process: a store fed by a simulated cluster (the embedded default)")
    up.add_argument("--host", default=HOST,
                    help="address to bind (default %(default)s; any other needs TLS and tokens, or --insecure)")
    up.add_argument("--grpc-port", type=port, default=GRPC_PORT, help="gRPC API port (default %(default)s)")
    up.add_argument("--http-port", type=port, default=HTTP_PORT,
                    help="HTTP API port (Prometheus query API, remote write, native JSON, /metrics; "
                         "default %(default)s)")
    up.add_argument("--data-dir", type=Path, default=None,
                    help="directory for the store's write-ahead log and snapshots (created if missing); without it "
                         "data lives in memory only")
    up.add_argument("--wal-fsync", choices=["always", "interval", "never"], default="interval",
                    help="when the WAL is fsynced: a process crash loses nothing acknowledged under any policy; "
                         "a machine crash may lose up to the interval (1 s) with 'interval', everything unsynced "
                         "with 'never'")
    up.add_argument("--snapshot-every", type=float, default=SNAPSHOT_INTERVAL_S, metavar="SECONDS",
                    help="with --data-dir: seconds between snapshots (default %(default)s)")
    add_limit_arguments(up)
    up.add_argument("--no-simulate", action="store_true", help="do not run the simulated agent")
    up.add_argument("--pods", type=int, default=200, help="simulated pods")
    up.add_argument("--workloads", type=int, default=10, help="simulated workloads")
    up.add_argument("--nodes", type=int, default=5, help="simulated nodes")
    up.add_argument("--seed", type=int, default=0, help="simulator seed")
    up.add_argument("--no-consumers", action="store_true",
                    help="do not run the HPA, VPA, overcommit advisor and colocation plan")
    up.add_argument("--no-publish-decisions", action="store_true",
                    help="do not write the consumers' decisions back as metricsd_* series (what the Grafana "
                         "dashboards in deploy/grafana/ draw)")
    up.add_argument("--examples-dir", type=Path, default=EXAMPLES_DIR,
                    help="consumer specs (hpa.yaml, vpa.yaml, overcommit.yaml, colocation.yaml) to run in dry-run mode")
    add_query_arguments(up)
    add_remote_write_arguments(up)
    add_onward_arguments(up)
    add_security_arguments(up)
    up.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        security = server_from_args(args)
        require_secure_or_loopback(args.host, security, args.insecure, "metricsd up")
        client_tls = client_from_args(args).tls
        http_settings = http_settings_from_args(args)
        targets_from_args(args)  # a bad target stops the start, before anything listens
    except ValueError as e:
        print(f"metricsd up: {e}", file=sys.stderr)
        return 2
    opts = UpOptions(host=args.host, security=security, http_settings=http_settings, client_tls=client_tls,
                     tls_server_name=args.tls_server_name,
                     grpc_port=args.grpc_port, http_port=args.http_port, data_dir=args.data_dir,
                     simulate=not args.no_simulate, pods=args.pods, workloads=args.workloads, nodes=args.nodes,
                     seed=args.seed, consumers=not args.no_consumers,
                     publish_decisions=not args.no_publish_decisions, examples_dir=args.examples_dir,
                     wal_fsync=args.wal_fsync, snapshot_every_s=args.snapshot_every,
                     store_settings=store_settings(args), onward_args=args)
    return run_main("metricsd up", run_up(opts), errors=(OSError,))
