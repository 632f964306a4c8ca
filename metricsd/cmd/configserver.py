"""``metricsd config-server``: assigns slots to live store members and writes the shard map.

Several run; one leads (metricsd/cluster/configserver.py holds the leader's logic). Each serves
grpc.health.v1 on ``--grpc-port`` for probes.
"""

from __future__ import annotations

import argparse
import logging

from metricsd.cluster.configserver import ConfigServer, ConfigServerSettings
from metricsd.cmd.runner import add_etcd_arguments, etcd_from_args, layout_from_args, run_service
from metricsd.cmd.runner import stop_event as make_stop_event
from metricsd.cmd.security import add_security_arguments, server_from_args
from metricsd.defaults import CONFIG_SERVER_HEALTH_PORT, HOST, LEASE_TTL_S
from metricsd.maths.slots import DEFAULT_SLOTS
from metricsd.rpc.health import start_cluster_grpc
from metricsd.security.settings import ServerSecurity

__all__ = ["add_arguments", "add_parser", "run", "serve"]

_log = logging.getLogger("metricsd.cluster.configserver")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--id", required=True, help="this config server's id (unique among config servers)")
    add_etcd_arguments(p)
    p.add_argument("--slots", type=int, default=DEFAULT_SLOTS,
                   help="slot count of a new cluster's map (fixed once the map exists; default %(default)s)")
    p.add_argument("--rf", type=int, default=3, help="replicas per slot (default %(default)s)")
    p.add_argument("--lease-ttl", type=int, default=LEASE_TTL_S,
                   help="leader lease, seconds: a stand-by takes over within it (default %(default)s)")
    p.add_argument("--debounce", type=float, default=1.0, metavar="SECONDS",
                   help="wait this long after a member change before assigning (default %(default)s)")
    p.add_argument("--min-members", type=int, default=1,
                   help="members to wait for before writing a cluster's first map (default %(default)s)")
    p.add_argument("--host", default=HOST, help="address of the health endpoint (default %(default)s)")
    p.add_argument("--grpc-port", type=int, default=CONFIG_SERVER_HEALTH_PORT,
                   help="gRPC port serving grpc.health.v1 for probes; -1: none (default %(default)s)")
    add_security_arguments(p, client=False, tokens=False)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config-server", help="assign slots to store members and write the shard map (leader-elected)",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_arguments(p)
    p.set_defaults(run=run)


async def serve(args: argparse.Namespace) -> None:
    settings = ConfigServerSettings(server_id=args.id, num_slots=args.slots, rf=args.rf, lease_ttl=args.lease_ttl,
                                    debounce_s=args.debounce, min_members=args.min_members)
    stop = make_stop_event()
    kv = etcd_from_args(args)
    server = ConfigServer(kv, layout_from_args(args), settings)
    # It serves only grpc.health.v1 (open to probes, nothing to read or write): TLS, no tokens.
    security = ServerSecurity(server_from_args(args).tls)
    grpc_server = None
    try:
        if args.grpc_port >= 0:
            grpc_server, bound = await start_cluster_grpc(None, server, args.host, args.grpc_port, security)
            _log.info("config server %s: health on %s:%d", args.id, args.host, bound)
        server.start()
        print(f"metricsd config-server {args.id} running (etcd {args.etcd}, cluster {args.cluster})", flush=True)
        await stop.wait()
    finally:
        _log.info("config server %s stopping", args.id)
        await server.close()
        if grpc_server is not None:
            await grpc_server.stop(grace=1.0)
        await kv.close()


def run(args: argparse.Namespace) -> int:
    return run_service("metricsd config-server", serve, args)
