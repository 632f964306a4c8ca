"""``metricsd proxy``: a stateless proxy process over a cluster's stores.

It follows the shard map in etcd (:class:`~metricsd.cluster.mapwatch.EtcdMapSource`, keeping the
last map while etcd is unreachable) and serves :class:`~metricsd.proxy.backend.ProxyBackend` over
the same gRPC API as a store, plus grpc.health.v1 for probes, and the HTTP API (Prometheus query
API, remote write, native JSON, /metrics) on ``--http-port``. Run several; clients may use any.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from metricsd.clock import SystemClock
from metricsd.cluster.election import LeaderElection
from metricsd.cluster.etcd_kv import EtcdKV
from metricsd.cluster.mapwatch import EtcdMapSource
from metricsd.cmd.frontend import serve_front
from metricsd.cmd.onwardflags import add_onward_arguments, parquet_clock, start_onward, targets_from_args
from metricsd.cmd.queryflags import add_query_arguments, add_remote_write_arguments, http_settings_from_args
from metricsd.cmd.runner import (
    add_etcd_arguments,
    etcd_from_args,
    layout_from_args,
    port,
    run_service,
)
from metricsd.cmd.runner import stop_event as make_stop_event
from metricsd.cmd.security import (
    add_security_arguments,
    client_from_args,
    require_secure_or_loopback,
    server_from_args,
)
from metricsd.proxy.coalesce import CoalesceSettings
from metricsd.proxy.settings import ProxySettings
from metricsd.rpc.backend import MetricsBackend

if TYPE_CHECKING:
    from metricsd.onward.hourly import ElectedParquet
    from metricsd.proxy.backend import ProxyBackend

__all__ = ["add_arguments", "add_parser", "run", "serve"]

from metricsd.defaults import GRPC_PORT, HOST, HTTP_PORT, LEASE_TTL_S

log = logging.getLogger("metricsd.proxy")



def add_arguments(p: argparse.ArgumentParser) -> None:
    add_etcd_arguments(p)
    p.add_argument("--host", default=HOST, help="address to bind (default %(default)s; 0.0.0.0 in a pod)")
    p.add_argument("--grpc-port", type=port, default=GRPC_PORT, help="gRPC API port (default %(default)s)")
    p.add_argument("--http-port", type=int, default=HTTP_PORT,
                   help="HTTP API port; -1: no HTTP API (default %(default)s)")
    p.add_argument("--w", type=int, default=2, help="write acknowledgements per slot (default %(default)s)")
    p.add_argument("--r", type=int, default=2, help="read replies per slot (default %(default)s)")
    p.add_argument("--call-timeout", type=float, default=5.0, metavar="SECONDS",
                   help="timeout of each call to a store (default %(default)s)")
    p.add_argument("--write-calls-per-member", type=int, default=CoalesceSettings.calls_per_member, metavar="N",
                   help="write calls under way to one store before client batches queue; the queued ones leave "
                        "together in one message on the store's WriteStream (0: a message per batch as it comes; "
                        "default %(default)s)")
    p.add_argument("--write-linger", type=float, default=CoalesceSettings.linger_s * 1000, metavar="MS",
                   help="how long a client batch bound for an idle store waits for others to share its message "
                        "(0: only those read in the same event-loop iteration; at most 1000; default %(default)g)")
    p.add_argument("--writes-on-read-port", action=argparse.BooleanOptionalAction,
                   default=ProxySettings.writes_on_read_port,
                   help="send write parts to the stores over their read ports instead of their WriteStreams "
                        "(less CPU a message at both ends; --no-writes-on-read-port: the WriteStreams; "
                        "default %(default)s)")
    p.add_argument("--whole-queries", action=argparse.BooleanOptionalAction, default=ProxySettings.whole_queries,
                   help="send a dashboard's PromQL query that reads series whole to one store that holds every slot "
                        "instead of evaluating it here (README: Read consistency; default %(default)s)")
    p.add_argument("--whole-first", type=int, default=None, metavar="N",
                   help="the place, among the stores holding every slot in member-id order, asked first for this "
                        "proxy's whole queries while it is idle (default: at random, so that proxies spread)")
    p.add_argument("--spill-in-flight", type=int, default=ProxySettings.whole_spill, metavar="N",
                   help="whole queries of this proxy under way on its first store at which the next goes to the "
                        "least busy store instead (1: concurrent queries spread over every store; more: fewer "
                        "stores busy, less CPU a query; default %(default)s)")
    p.add_argument("--spill-queued-ms", type=float, default=ProxySettings.whole_spill_work_s * 1000, metavar="MS",
                   help="also keep a whole query on the first store while the expected answer times of this "
                        "proxy's queries under way there and its own sum to at most MS (cheap queries share one "
                        "store, heavy ones spread; 0: --spill-in-flight alone; 0-60000, default %(default)g)")
    p.add_argument("--spill-cheap-ms", type=float, default=ProxySettings.whole_spill_cheap_s * 1000, metavar="MS",
                   help="the expected time (the store's own for the query) up to which a whole query is cheap "
                        "enough to share the first store under --spill-queued-ms (a heavier one goes there only "
                        "when it is idle; 0-60000, default %(default)g)")
    p.add_argument("--map-timeout", type=float, default=0.0, metavar="SECONDS",
                   help="wait this long for a shard map before serving (0: serve at once, answering UNAVAILABLE "
                        "until the map arrives)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="where the proxy keeps what it must not lose: the onward buffer of --remote-write-url "
                        "(<data-dir>/onward). A proxy without remote-write targets keeps nothing")
    add_query_arguments(p)
    add_remote_write_arguments(p)
    add_onward_arguments(p)
    add_security_arguments(p, probes=True)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("proxy", help="a stateless proxy: quorum writes and reads over the cluster's stores",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_arguments(p)
    p.set_defaults(run=run)


async def serve(args: argparse.Namespace) -> None:
    from metricsd.proxy.backend import ProxyBackend

    if args.write_calls_per_member < 0:
        raise SystemExit("metricsd proxy: --write-calls-per-member must be >= 0")
    if args.whole_first is not None and args.whole_first < 0:
        raise SystemExit("metricsd proxy: --whole-first must be >= 0")
    if args.spill_in_flight < 1:
        raise SystemExit("metricsd proxy: --spill-in-flight must be >= 1")
    if not (0 <= args.spill_queued_ms <= 60_000 and 0 <= args.spill_cheap_ms <= 60_000):
        raise SystemExit("metricsd proxy: --spill-queued-ms and --spill-cheap-ms must be in [0, 60000] milliseconds")
    if not 0 <= args.write_linger <= 1000:
        raise SystemExit("metricsd proxy: --write-linger must be in [0, 1000] milliseconds")
    settings = ProxySettings(w=args.w, r=args.r, call_timeout_s=args.call_timeout, whole_queries=args.whole_queries,
                             whole_first=args.whole_first, whole_spill=args.spill_in_flight,
                             whole_spill_work_s=args.spill_queued_ms / 1000,
                             whole_spill_cheap_s=args.spill_cheap_ms / 1000,
                             writes_on_read_port=args.writes_on_read_port,
                             coalesce=CoalesceSettings(calls_per_member=args.write_calls_per_member,
                                                       linger_s=args.write_linger / 1000))
    security = server_from_args(args)
    require_secure_or_loopback(args.host, security, args.insecure, "metricsd proxy")
    clock = SystemClock()
    stop = make_stop_event()
    kv = etcd_from_args(args)
    maps = EtcdMapSource(kv, layout_from_args(args), name="proxy")
    maps.start()
    if args.map_timeout > 0:
        try:
            await maps.wait_ready(args.map_timeout)
        except TimeoutError:
            log.warning("no shard map after %.1fs; serving anyway (requests fail until it arrives)", args.map_timeout)
    proxy = ProxyBackend(maps, settings, clock, security=client_from_args(args))
    await proxy.start()
    registry = CollectorRegistry()
    onward, onward_tmp = start_onward(args, args.data_dir, registry, clock)
    backend: MetricsBackend = proxy
    if onward is not None:  # every write passes through one proxy: each sample goes onward once
        from metricsd.onward.tee import OnwardBackend  # pyarrow (~90 MiB resident) only when sending onward

        backend = OnwardBackend(proxy, onward)
        onward.start()
    parquet = asyncio.create_task(_parquet_writer(args, proxy, kv, clock).run()) if args.parquet_dir else None
    try:
        async with serve_front(args, backend, security, clock, registry) as where:
            print(f"metricsd proxy serving {where} (etcd {args.etcd}, cluster {args.cluster}, W {args.w}, R {args.r})",
                  flush=True)
            await stop.wait()
            log.info("proxy stopping")
    finally:
        if parquet is not None:
            parquet.cancel()
        if onward is not None:
            await onward.close()
        if onward_tmp is not None:
            onward_tmp.cleanup()
        await proxy.close()
        await maps.close()
        await kv.close()
        if security.auth is not None:
            await security.auth.close()


def _parquet_writer(args: argparse.Namespace, proxy: ProxyBackend, kv: EtcdKV, clock: SystemClock
                    ) -> ElectedParquet:
    """The hourly Parquet writer, run while this proxy leads the election of its cluster's
    ``parquet-writer`` key: the proxies given the same --parquet-dir write each hour once, and
    another takes over when the writer dies (onward/hourly.py ElectedParquet)."""
    from metricsd.onward.hourly import ElectedParquet, HourlyParquet  # pyarrow only when writing Parquet
    from metricsd.proxy.hourread import HourRead

    writer_id = f"{socket.gethostname()}:{args.grpc_port}"
    # each slot's hour from one replica that the others' digests vouch for (proxy/hourread.py),
    # unless digest reads are off (then every read is a quorum read)
    source = HourRead(proxy.reads) if proxy.settings.digest_reads else None
    writer = HourlyParquet(proxy, args.parquet_dir, parquet_clock(args, clock), check_s=args.parquet_check,
                           writer_id=writer_id, source=source)
    election = LeaderElection(kv, f"{layout_from_args(args).base}/parquet-writer", writer_id, LEASE_TTL_S)
    return ElectedParquet(writer, election)


def run(args: argparse.Namespace) -> int:
    try:
        http_settings_from_args(args)  # a bad flag or relabel file stops the start, before anything listens
        targets_from_args(args)
    except ValueError as e:
        print(f"metricsd proxy: {e}", file=sys.stderr)
        return 2
    return run_service("metricsd proxy", serve, args, role="proxy")  # METRICSD_EVENT_LOOP_PROXY (cmd/eventloop.py)
