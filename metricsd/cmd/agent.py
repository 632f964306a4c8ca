"""``metricsd agent``: one per node, collects pod metrics from cgroup v2 (or simulates a cluster)
and pushes them to stores or proxies, through a buffer that outlives their outages.

Wiring only: flags into settings, settings into the collector, pusher, buffer and HTTP endpoint,
then run until SIGTERM, when it delivers what it can for a few seconds and spools the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from metricsd.agent.buffer import BufferSettings, PushBuffer
from metricsd.agent.collect import Collector, CollectorSettings
from metricsd.agent.loops import PodSource, collection_loop, simulate_loop
from metricsd.agent.pods import parse_quantity
from metricsd.agent.pusher import Pusher, PusherSettings
from metricsd.agent.simulate import SimConfig, Simulator
from metricsd.agent.telemetry import AgentExporter, LoopStats, health, start_http
from metricsd.clock import Clock, SystemClock
from metricsd.cmd.runner import run_main, stop_event
from metricsd.cmd.security import add_security_arguments, client_from_args
from metricsd.defaults import AGENT_METRICS_PORT, HOST, grpc_address
from metricsd.durations import parse_duration_ms
from metricsd.rpc.backend import MetricsBackend
from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import StreamingBackend
from metricsd.rpc.server import GRPC_OPTIONS
from metricsd.security.settings import ClientSecurity
from metricsd.security.tls import ServerTLS

__all__ = ["AgentOptions", "add_arguments", "add_parser", "options_from_args", "run", "run_agent"]

log = logging.getLogger("metricsd.agent")

DEFAULT_TARGET = grpc_address()
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# A store that comes back should be found within seconds, not after gRPC's default 120 s cap.
_CHANNEL_OPTIONS = [
    *GRPC_OPTIONS,
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 5000),
]


@dataclass(frozen=True)
class AgentOptions:
    """Everything ``metricsd agent`` is told; the defaults are the flags' defaults."""

    targets: tuple[str, ...] = (DEFAULT_TARGET,)
    interval_ms: int = 10_000
    node_name: str = ""
    cluster: str = ""
    cgroup_root: Path = Path("/sys/fs/cgroup")
    proc_root: Path = Path("/proc")
    pods_file: Path | None = None
    kubelet_url: str | None = None
    token_file: Path = SA_DIR / "token"
    ca_file: Path = SA_DIR / "ca.crt"
    kubelet_insecure_skip_verify: bool = False
    buffer_dir: Path | None = None
    buffer_bytes: int = 256 << 20
    memory_buffer_bytes: int = 16 << 20
    metrics_host: str = HOST
    metrics_port: int | None = AGENT_METRICS_PORT  # None: no HTTP endpoint
    write_timeout_s: float = 10.0
    shutdown_flush_s: float = 5.0
    max_batch_samples: int = 20_000
    simulate: bool = False
    sim: SimConfig | None = None
    backfill_ms: int = 0
    security: ClientSecurity | None = None  # TLS and token towards the targets
    metrics_tls: tuple[Path, Path] | None = None  # certificate and key of the /metrics endpoint

    def __post_init__(self) -> None:
        if self.interval_ms < 1000:
            raise ValueError(f"--interval must be at least 1s, got {self.interval_ms} ms")
        if not self.targets:
            raise ValueError("--targets needs at least one host:port")
        for t in self.targets:
            host, _, port = t.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"--targets: {t!r} is not host:port")
        if self.buffer_bytes < 1 << 16:
            raise ValueError("--buffer-bytes must be at least 64Ki")
        if self.backfill_ms and not self.simulate:
            raise ValueError("--backfill needs --simulate")


def _bytes(text: str) -> int:
    try:
        return int(parse_quantity(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _duration(text: str) -> int:
    try:
        return parse_duration_ms(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--targets", default=DEFAULT_TARGET,
                   help="stores or proxies to push to, host:port[,host:port...]; the first that answers is used "
                        "and the others are tried when it fails (default %(default)s)")
    p.add_argument("--interval", type=_duration, default=10_000, metavar="DURATION",
                   help="collection interval, at least 1s (default 10s)")
    p.add_argument("--node-name", default="", help="this node's name (default: $NODE_NAME, else the hostname)")
    p.add_argument("--cluster", default="", help="value of the 'cluster' label on every series (default: none; "
                   "'sim' when simulating)")
    p.add_argument("--cgroup-root", type=Path, default=Path("/sys/fs/cgroup"),
                   help="where cgroup v2 is mounted (default %(default)s)")
    p.add_argument("--proc-root", type=Path, default=Path("/proc"), help="the host's /proc (default %(default)s)")
    p.add_argument("--pods-file", type=Path, default=None,
                   help="a v1 PodList JSON file (the kubelet's /pods answer), re-read when it changes")
    p.add_argument("--kubelet-url", default=None,
                   help="the kubelet's pods endpoint, e.g. https://$NODE_IP:10250/pods")
    p.add_argument("--token-file", type=Path, default=SA_DIR / "token", help="bearer token for the kubelet")
    p.add_argument("--ca-file", type=Path, default=SA_DIR / "ca.crt", help="CA bundle for the kubelet's certificate")
    p.add_argument("--kubelet-insecure-skip-verify", action="store_true",
                   help="do not verify the kubelet's serving certificate (often self-signed)")
    p.add_argument("--buffer-dir", type=Path, default=None,
                   help="spool directory: batches past --memory-buffer-bytes go here, and undelivered ones are "
                        "kept here across restarts (default: memory only)")
    p.add_argument("--buffer-bytes", type=_bytes, default=256 << 20, metavar="BYTES",
                   help="bound on buffered batches (memory and spool); beyond it the oldest are dropped "
                        "(default 256Mi)")
    p.add_argument("--memory-buffer-bytes", type=_bytes, default=16 << 20, metavar="BYTES",
                   help="batches past this much in memory go to --buffer-dir (default 16Mi)")
    p.add_argument("--metrics-host", default=HOST,
                   help="address for /metrics and /healthz (default %(default)s; a DaemonSet uses the pod IP)")
    p.add_argument("--metrics-port", type=int, default=AGENT_METRICS_PORT,
                   help="port for /metrics and /healthz; 0 picks a free one, -1 disables (default %(default)s)")
    p.add_argument("--write-timeout", type=_duration, default=10_000, metavar="DURATION",
                   help="deadline of one Write (default 10s)")
    p.add_argument("--max-batch-samples", type=int, default=20_000, help="samples per Write batch at most")
    sim = p.add_argument_group("simulator", "push a simulated cluster's series instead of this node's")
    sim.add_argument("--simulate", action="store_true", help="run the simulator instead of the collector")
    sim.add_argument("--pods", type=int, default=200, help="simulated pods (default %(default)s)")
    sim.add_argument("--workloads", type=int, default=10, help="simulated workloads (default %(default)s)")
    sim.add_argument("--nodes", type=int, default=5, help="simulated nodes (default %(default)s)")
    sim.add_argument("--containers", type=int, default=1, help="containers per simulated pod (default %(default)s)")
    sim.add_argument("--seed", type=int, default=0, help="simulator seed (default %(default)s)")
    sim.add_argument("--backfill", type=_duration, default=0, metavar="DURATION",
                     help="first push this much past data as fast as the targets take it, e.g. 7d")
    add_security_arguments(p, tokens=False)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agent", help="the node agent: cgroup v2 collector (or simulator) and pusher",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_arguments(p)
    p.set_defaults(run=run)


def options_from_args(args: argparse.Namespace) -> AgentOptions:
    """Raises ValueError with a message for the user when the flags do not make sense."""
    sim = None
    if args.simulate:
        sim = SimConfig(pods=args.pods, workloads=args.workloads, nodes=args.nodes, containers=args.containers,
                        seed=args.seed, interval_ms=args.interval, cluster=args.cluster or "sim")
    return AgentOptions(
        targets=tuple(t.strip() for t in args.targets.split(",") if t.strip()),
        interval_ms=args.interval,
        node_name=args.node_name or os.environ.get("NODE_NAME", "") or socket.gethostname(),
        cluster=args.cluster,
        cgroup_root=args.cgroup_root,
        proc_root=args.proc_root,
        pods_file=args.pods_file,
        kubelet_url=args.kubelet_url,
        token_file=args.token_file,
        ca_file=args.ca_file,
        kubelet_insecure_skip_verify=args.kubelet_insecure_skip_verify,
        buffer_dir=args.buffer_dir,
        buffer_bytes=args.buffer_bytes,
        memory_buffer_bytes=args.memory_buffer_bytes,
        metrics_host=args.metrics_host,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        write_timeout_s=args.write_timeout / 1000.0,
        max_batch_samples=args.max_batch_samples,
        simulate=args.simulate,
        sim=sim,
        backfill_ms=args.backfill,
        security=client_from_args(args),
        metrics_tls=(args.tls_cert, args.tls_key) if args.tls_cert and args.tls_key else None,
    )


def run(args: argparse.Namespace) -> int:
    """The ``metricsd agent`` command; returns the exit code."""
    try:
        opts = options_from_args(args)
    except ValueError as e:
        print(f"metricsd agent: {e}", file=sys.stderr)
        return 2
    return run_main("metricsd agent", run_agent(opts), errors=(OSError,))


def grpc_targets(addresses: Sequence[str], timeout_s: float, security: ClientSecurity | None = None
                 ) -> list[tuple[str, StreamingBackend]]:
    """A channel per address, which reconnects by itself when its peer comes back; batches go over
    one WriteStream per address (a third of a unary call's cost at both ends)."""
    return [(a, StreamingBackend(open_channel(a, security, _CHANNEL_OPTIONS), timeout_s)) for a in addresses]


async def run_agent(
    opts: AgentOptions,
    *,
    clock: Clock | None = None,
    sleep: Callable[[float], Awaitable[None]] | None = None,
    backends: Sequence[tuple[str, MetricsBackend]] | None = None,
    registry: CollectorRegistry | None = None,
    stop: asyncio.Event | None = None,
    max_passes: int | None = None,
) -> dict[str, float]:
    """Run until ``stop`` is set (or SIGTERM / SIGINT), or after ``max_passes`` passes or ticks;
    then deliver for up to ``opts.shutdown_flush_s`` and spool the rest. Returns the final counts.

    ``clock``, ``sleep`` and ``backends`` let a test run the agent on a ManualClock against an
    in-process store."""
    clock = clock or SystemClock()
    sleep = sleep or asyncio.sleep
    stop = stop or asyncio.Event()
    buffer = PushBuffer(BufferSettings(max_bytes=opts.buffer_bytes, memory_bytes=opts.memory_buffer_bytes,
                                       directory=opts.buffer_dir))
    owned: list[tuple[str, StreamingBackend]] = []
    if backends is None:
        backends = owned = grpc_targets(opts.targets, opts.write_timeout_s, opts.security)
    pusher = Pusher(buffer, backends, clock, PusherSettings(max_batch_samples=opts.max_batch_samples), sleep=sleep)
    stats = LoopStats(interval_ms=opts.interval_ms, started_ms=clock.now_ms())
    collector: Collector | None = None
    if opts.simulate:
        sim_cfg = opts.sim or SimConfig(interval_ms=opts.interval_ms)
        sim = Simulator(sim_cfg, max(0, clock.now_ms() - opts.backfill_ms))
        producer: Coroutine[Any, Any, None] = simulate_loop(
            sim, pusher, stats, clock, sleep, backfill=opts.backfill_ms > 0, max_batch_samples=opts.max_batch_samples,
            high_water_bytes=max(1 << 20, min(opts.memory_buffer_bytes, opts.buffer_bytes) // 2), max_ticks=max_passes)
        log.info("simulating %d pods in %d workloads on %d nodes (%d series) every %d ms%s; pushing to %s",
                 sim_cfg.pods, sim_cfg.workloads, sim_cfg.nodes, len(sim.series), sim_cfg.interval_ms,
                 f", after a backfill of {opts.backfill_ms} ms" if opts.backfill_ms else "", ",".join(opts.targets))
    else:
        collector = Collector(CollectorSettings(node_name=opts.node_name, cgroup_base=opts.cgroup_root,
                                                proc_root=opts.proc_root, cluster=opts.cluster))
        pods = PodSource(opts.pods_file, opts.kubelet_url, opts.token_file, opts.ca_file,
                         opts.kubelet_insecure_skip_verify)
        producer = collection_loop(collector, pods, pusher, stats, clock, sleep, max_passes)
        log.info("collecting node %s from %s with %s every %d ms; pushing to %s", opts.node_name, opts.cgroup_root,
                 pods.describe(), opts.interval_ms, ",".join(opts.targets))
    registry = registry or CollectorRegistry()
    registry.register(AgentExporter(pusher, stats, collector))
    runner = None
    if opts.metrics_port is not None:
        runner, port = await start_http(opts.metrics_host, opts.metrics_port, registry,
                                        lambda: health(stats, pusher, clock),
                                        ServerTLS(*opts.metrics_tls) if opts.metrics_tls else None)
        log.info("agent metrics on %s://%s:%d/metrics, health on /healthz", "https" if opts.metrics_tls else "http",
                 opts.metrics_host, port)
        stats.extra["metrics_port"] = str(port)
    loop = asyncio.get_running_loop()
    stop_event(stop)  # removed again below: run_agent also runs inside other programs' loops
    sender = asyncio.create_task(pusher.run(), name="pusher")
    main = asyncio.create_task(producer, name="producer")
    stopper = asyncio.create_task(stop.wait(), name="stop")
    try:
        done, _ = await asyncio.wait({main, stopper, sender}, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if t is not stopper and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(sig)
        main.cancel()
        stopper.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pusher.flush(), opts.shutdown_flush_s)
        sender.cancel()
        await asyncio.gather(main, stopper, sender, return_exceptions=True)
        buffer.close()
        for _, backend in owned:
            await backend.close()
        if runner is not None:
            await runner.cleanup()
    p, b = pusher.stats, buffer.stats
    median, p99 = p.delay.median(), p.delay.quantile(0.99)
    summary: dict[str, float] = {"collected_samples": p.collected_samples, "sent_samples": p.sent_samples,
               "buffered_samples": buffer.samples, "dropped_samples": b.dropped_samples,
               "rejected_samples": p.rejected_samples, "invalid_samples": p.invalid_samples,
               "replayed_samples": b.replayed_samples, "duplicate_samples": p.rejected_duplicate,
               "passes": stats.passes,
               "delay_median_ms": -1.0 if median is None else round(median * 1000, 1),
               "delay_p99_ms": -1.0 if p99 is None else round(p99 * 1000, 1),
               "pass_ms_mean": round(stats.pass_seconds_total / stats.passes * 1000, 1) if stats.passes else -1.0}
    log.info("agent stopped: %s", json.dumps(summary))
    return summary
