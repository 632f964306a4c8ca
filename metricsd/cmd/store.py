"""``metricsd store``: a store process, alone or as a member of a cluster.

With ``--etcd`` the store registers itself (member record under a lease), follows the shard map
and serves only the slots the map gives it (:class:`~metricsd.replica.ownership.OwnershipBackend`);
without it, it serves everything it is sent, as a single store. ``--data-dir`` keeps a
write-ahead log and snapshots there (metricsd/store/durable.py); without it the data lives in
memory only and a restarted store comes back empty, relying on its peers (hinted hand-off and read
repair by the proxies) to be filled again. gRPC serves the Metrics API and grpc.health.v1.

The same command runs one store per host: ``--host`` is what it binds (0.0.0.0 in a pod),
``--advertise`` the address written into its member record for proxies and peers to dial.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket
from pathlib import Path
from typing import Any

from metricsd.cluster.member import ClusterMember
from metricsd.cluster.shardmap import Member, MemberState, validate_member_id
from metricsd.cmd.runner import (
    add_etcd_arguments,
    add_max_future_argument,
    address,
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
    serve_probes,
    server_from_args,
)
from metricsd.http.wholequery import QueryService
from metricsd.memory import total_memory_bytes
from metricsd.proto import metricsd_pb2 as pb
from metricsd.replica.ownership import OwnershipBackend, store_write_slots
from metricsd.replica.readiness import SlotReadiness
from metricsd.replica.servicer import StoreNodeServicer
from metricsd.rpc.backend import MetricsBackend
from metricsd.rpc.health import start_cluster_grpc
from metricsd.rpc.readport import AdvertisedReadPort, ReadPortServer
from metricsd.security.settings import ClientSecurity
from metricsd.store.api import LocalBackend, StoreAPI, gc_loop
from metricsd.store.engine import Store
from metricsd.store.limits import DEFAULT_NEW_SERIES_PER_MINUTE, SeriesLimits, default_max_series
from metricsd.store.settings import StoreSettings

__all__ = ["add_arguments", "add_parser", "advertised_address", "run", "serve"]

from metricsd.defaults import ANTI_ENTROPY_INTERVAL_S, GRPC_PORT, HOST, LEASE_TTL_S, SNAPSHOT_INTERVAL_S

_log = logging.getLogger("metricsd.store")



def _member_id(text: str) -> str:
    try:
        validate_member_id(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    return text


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--member-id", "--member", dest="member_id", type=_member_id, default=None,
                   help="this store's member id, unique in the cluster (default: the host name); also what "
                        "Health reports")
    p.add_argument("--host", default=HOST, help="address to bind (default %(default)s; 0.0.0.0 in a pod)")
    p.add_argument("--grpc-port", type=port, default=GRPC_PORT, help="gRPC port (default %(default)s)")
    p.add_argument("--advertise", type=address, default=None, metavar="HOST:PORT",
                   help="address proxies dial, written into the member record (default: --host:--grpc-port, "
                        "or the host name when binding 0.0.0.0)")
    add_etcd_arguments(p, required=False)
    p.add_argument("--read-port", type=int, default=0, metavar="PORT",
                   help="port of the read port, where proxies read with less overhead than gRPC (0: any free port, "
                        "named in the store's Health answer; -1: none, proxies read over gRPC; default %(default)s)")
    p.add_argument("--lease-ttl", type=int, default=LEASE_TTL_S,
                   help="member lease, seconds: a dead store leaves the map this long after (default %(default)s)")
    p.add_argument("--deregister-on-exit", "--leave-on-exit", dest="deregister_on_exit", action="store_true",
                   help="leave the cluster on a clean stop (scale-down): publish state 'leaving', keep serving "
                        "until the other members hold this store's slots (at most --drain-timeout), then delete "
                        "the member record; without it a clean stop lets the lease expire, so a quick restart "
                        "under the same id moves nothing")
    p.add_argument("--drain-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="with --deregister-on-exit: how long to wait for the slots to move (default %(default)s)")
    add_limit_arguments(p)
    p.add_argument("--data-dir", type=Path, default=None,
                   help="keep a write-ahead log and snapshots here (default: memory only)")
    p.add_argument("--wal-fsync", choices=["always", "interval", "never"], default="interval",
                   help="with --data-dir: always fsync before acknowledging, every second (default), or never")
    p.add_argument("--snapshot-every", type=float, default=SNAPSHOT_INTERVAL_S,
                   help="with --data-dir: seconds between snapshots (default %(default)s)")
    p.add_argument("--sync-interval", type=float, default=ANTI_ENTROPY_INTERVAL_S, metavar="SECONDS",
                   help="with --etcd: seconds between anti-entropy rounds with the other replicas, "
                        "16 slots each (default %(default)s)")
    add_security_arguments(p, probes=True)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("store", help="a store process serving gRPC; with --etcd a cluster member",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_arguments(p)
    p.set_defaults(run=run)


def add_limit_arguments(p: argparse.ArgumentParser) -> None:
    """The store's series limits (README, "Write limits") and where its chunk pages live; shared by
    ``metricsd store`` and ``up``."""
    p.add_argument("--max-series", type=int, default=None, metavar="N",
                   help="series the store holds at most; writes creating more are refused (RESOURCE_EXHAUSTED, "
                        "HTTP 429). Default: half the memory (RAM or cgroup limit) / 24 KiB per series; 0: unlimited")
    p.add_argument("--max-new-series-per-minute", type=int, default=DEFAULT_NEW_SERIES_PER_MINUTE, metavar="N",
                   help="new series a namespace may create per minute (default %(default)s; 0: unlimited)")
    add_max_future_argument(p)
    p.add_argument("--chunks-on-disk", choices=["auto", "off"], default="auto",
                   help="auto (default): with --data-dir, the compressed chunks' pages are files under "
                        "<data-dir>/chunks/ (page cache, reclaimable, not the process's anonymous memory); "
                        "off: anonymous memory")


def store_settings(args: argparse.Namespace) -> StoreSettings:
    """StoreSettings from the limit flags; logs the series limit when it was sized to the machine."""
    max_series = args.max_series
    if max_series is None:
        mem = total_memory_bytes()
        max_series = default_max_series(mem)
        _log.info("series limit %d (%.1f GiB of memory; --max-series to change)", max_series, mem / 2**30)
    if max_series < 0 or args.max_new_series_per_minute < 0:
        raise SystemExit("--max-series and --max-new-series-per-minute must be >= 0")
    return StoreSettings(series_limits=SeriesLimits(max_series, args.max_new_series_per_minute),
                         max_future_ms=args.max_future, chunks_on_disk=args.chunks_on_disk == "auto")


def advertised_address(host: str, grpc_port: int, advertise: str | None) -> str:
    if advertise:
        return advertise
    if host in ("0.0.0.0", "::", ""):
        return f"{socket.gethostname()}:{grpc_port}"
    return f"{host}:{grpc_port}"


async def serve(args: argparse.Namespace, ready: asyncio.Event | None = None) -> None:
    member_id = args.member_id or socket.gethostname().split(".")[0]
    validate_member_id(member_id)
    security = server_from_args(args)
    require_secure_or_loopback(args.host, security, args.insecure, "metricsd store")
    peers = client_from_args(args)
    stop = make_stop_event()
    background: list[asyncio.Task[Any]] = []
    durability: Any = None
    if args.data_dir is not None:
        from metricsd.store.durable import DurabilitySettings, open_store, run_durability
        from metricsd.store.wal import FsyncPolicy

        dset = DurabilitySettings(fsync=FsyncPolicy(args.wal_fsync), snapshot_interval_s=args.snapshot_every)
        store, durability = open_store(args.data_dir, settings=store_settings(args), durability=dset)
        api: StoreAPI = durability.api(member_id)
        background.append(asyncio.create_task(run_durability(durability), name="durability"))
    else:
        store = Store(store_settings(args))
        api = StoreAPI(store, member_id)
        background.append(asyncio.create_task(gc_loop(store.gc), name="retention"))
    backend: MetricsBackend = LocalBackend(api)
    member: ClusterMember | None = None
    kv = None
    if args.etcd:
        kv = etcd_from_args(args)
        if args.grpc_port == 0 and not args.advertise:
            raise ValueError("--grpc-port 0 needs --advertise in a cluster (the member record names the port)")
        lost = bool(durability is not None and durability.recovery.lost)
        # A restart that lost data registers joining: proxies read from it only once it caught up.
        record = Member(member_id, advertised_address(args.host, args.grpc_port, args.advertise),
                        MemberState.JOINING if lost else MemberState.ACTIVE)
        if lost:
            api.status = pb.HealthResponse.CATCHING_UP
        member = ClusterMember(kv, layout_from_args(args), record, ttl=args.lease_ttl)
        readiness = SlotReadiness(member_id)  # slots gained by a map change: reads refused until caught up
        backend = OwnershipBackend(backend, member_id, member.maps, store_write_slots(store),
                                   on_refused=_refresher(member), readiness=readiness)
        background.append(asyncio.create_task(_replicate(store, durability, api, member, args, peers, lost,
                                                         readiness), name="replication"))
    read_port: ReadPortServer | None = None
    if args.read_port >= 0:
        read_port = ReadPortServer(backend, security, query=QueryService(backend).answer)
        backend = AdvertisedReadPort(backend, await read_port.start(args.host, args.read_port))
    servicer = StoreNodeServicer(backend, api)
    if read_port is not None:  # a proxy's writes over the read port: the servicer's WriteParts
        read_port.write_parts = servicer.write_parts_body
    server, bound = await start_cluster_grpc(servicer, backend, args.host, args.grpc_port, security)
    probes = await serve_probes(args, backend)
    try:
        if member is not None:
            member.start()
        where = f"member {member_id} of cluster {args.cluster} (etcd {args.etcd})" if member else "standalone"
        print(f"metricsd store {member_id} serving gRPC on {args.host}:{bound}, {where}", flush=True)
        if ready is not None:
            ready.set()
        await stop.wait()
        if member is not None and args.deregister_on_exit:
            await _stop_task(background, "replication")  # no more state changes of its own while leaving
            await member.leave(args.drain_timeout)
    finally:
        _log.info("store %s stopping", member_id)
        await server.stop(grace=2.0)
        if read_port is not None:
            await read_port.stop()
        if probes is not None:
            await probes.stop(grace=None)
        if member is not None:
            await member.close(deregister=args.deregister_on_exit)
        if kv is not None:
            await kv.close()
        for task in background:
            await _stop_task([task], task.get_name())
        if durability is not None:
            durability.close(snapshot=True)
        if security.auth is not None:
            await security.auth.close()


async def _stop_task(tasks: list[asyncio.Task[Any]], name: str) -> None:
    for task in tasks:
        if task.get_name() == name and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def _replicate(store: Store, durability: Any, api: StoreAPI, member: ClusterMember,
                     args: argparse.Namespace, peers: ClientSecurity, behind: bool = False,
                     readiness: SlotReadiness | None = None) -> None:
    from metricsd.clock import SystemClock
    from metricsd.replica.catchup_client import local_apply
    from metricsd.replica.replication import ReplicaSync, SyncSettings

    sync = ReplicaSync(store, local_apply(store, durability), api, member.id, member.maps, SystemClock(),
                       SyncSettings(interval_s=args.sync_interval), publish=member.set_state,
                       security=peers, behind=behind, readiness=readiness)
    try:
        await sync.run()
    finally:
        await sync.close()


def _refresher(member: ClusterMember) -> Any:
    """After refusing a request, re-read the map (at most one read in flight): the refusing store
    may be the one with the old map, if its watch lags behind the proxy's."""
    pending: set[asyncio.Task[Any]] = set()

    def refresh() -> None:
        if pending:
            return
        task = asyncio.get_running_loop().create_task(member.maps.refresh())
        pending.add(task)
        task.add_done_callback(pending.discard)

    return refresh


def run(args: argparse.Namespace) -> int:
    return run_service("metricsd store", serve, args, errors=(OSError, RuntimeError, ValueError))
