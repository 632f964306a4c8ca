"""``metricsd federate``: one proxy's API over several clusters' proxies.

Serves :class:`~metricsd.federation.backend.FederatedBackend` over the same gRPC API and HTTP API
(Prometheus query API, native JSON, /metrics) as ``metricsd proxy``, with the same security flags:
TLS and tokens for its listeners, and ``--tls-ca`` / ``--auth-token-file`` for the connections to
the clusters' proxies. Every series it returns carries ``cluster="NAME"``; a cluster that does not
answer within ``--cluster-timeout`` is named in the answer (Prometheus ``warnings``, the replies'
``missing_clusters``).
"""

from __future__ import annotations

import argparse
import logging
import sys

from prometheus_client import CollectorRegistry

from metricsd.clock import SystemClock
from metricsd.cmd.frontend import serve_front
from metricsd.cmd.queryflags import add_query_arguments, http_settings_from_args
from metricsd.cmd.runner import port, run_service
from metricsd.cmd.runner import stop_event as make_stop_event
from metricsd.cmd.security import (
    add_security_arguments,
    client_from_args,
    require_secure_or_loopback,
    server_from_args,
)
from metricsd.defaults import HOST
from metricsd.federation.calls import FederationSettings
from metricsd.federation.spec import ClusterTarget, SpecError, load_clusters_file, parse_cluster_flag, parse_clusters

__all__ = ["add_arguments", "add_parser", "clusters_from_args", "run", "serve"]

log = logging.getLogger("metricsd.federate")

# Beside a cluster's proxy on the defaults (7400 / 7401).
FEDERATE_HTTP_PORT = 7600
FEDERATE_GRPC_PORT = 7601


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("clusters", "the clusters' proxies (gRPC), by name")
    g.add_argument("--cluster", action="append", default=[], metavar="NAME=HOST:PORT",
                   help="a cluster's proxy; NAME becomes the cluster label of its series (repeatable)")
    g.add_argument("--clusters-file", default=None, metavar="FILE",
                   help="YAML: {clusters: {NAME: HOST:PORT, ...}} (with --cluster: both, names unique)")
    g.add_argument("--cluster-timeout", type=float, default=5.0, metavar="SECONDS",
                   help="how long a cluster may take to answer a request, retries included; past it the answer "
                        "names the cluster as missing (default %(default)s)")
    g.add_argument("--cluster-retries", type=int, default=1,
                   help="attempts after an unavailable one, within the timeout (default %(default)s)")
    g.add_argument("--cluster-backoff", type=float, default=0.05, metavar="SECONDS",
                   help="wait before the first retry, doubled each time (default %(default)s)")
    p.add_argument("--host", default=HOST, help="address to bind (default %(default)s; 0.0.0.0 in a pod)")
    p.add_argument("--grpc-port", type=port, default=FEDERATE_GRPC_PORT, help="gRPC API port (default %(default)s)")
    p.add_argument("--http-port", type=int, default=FEDERATE_HTTP_PORT,
                   help="HTTP API port; -1: no HTTP API (default %(default)s)")
    add_query_arguments(p)
    add_security_arguments(p, probes=True)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("federate", help="a federating proxy: one API over several clusters' proxies",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_arguments(p)
    p.set_defaults(run=run)


def clusters_from_args(args: argparse.Namespace) -> list[ClusterTarget]:
    """Raises SpecError naming the flag or file."""
    targets = [parse_cluster_flag(text) for text in args.cluster]
    if args.clusters_file:
        where = f"--clusters-file {args.clusters_file}"
        try:
            with open(args.clusters_file, encoding="utf-8") as f:
                text = f.read(1 << 20)
        except OSError as e:
            raise SpecError(f"{where}: {e.strerror}") from None
        targets += load_clusters_file(text, where)
    return parse_clusters(targets)


def settings_from_args(args: argparse.Namespace) -> FederationSettings:
    return FederationSettings(timeout_s=args.cluster_timeout, retries=args.cluster_retries,
                              backoff_s=args.cluster_backoff)


async def serve(args: argparse.Namespace) -> None:
    from metricsd.federation.backend import FederatedBackend
    from metricsd.federation.calls import FederationMetrics
    from metricsd.http.selfmetrics import SelfMetrics
    from metricsd.proxy.members import grpc_connect

    targets = clusters_from_args(args)
    settings = settings_from_args(args)
    security = server_from_args(args)
    require_secure_or_loopback(args.host, security, args.insecure, "metricsd federate")
    clock = SystemClock()
    stop = make_stop_event()
    registry = CollectorRegistry()
    metrics = SelfMetrics(registry)
    backend = FederatedBackend(targets, settings, grpc_connect(settings.timeout_s, client_from_args(args)),
                               FederationMetrics(registry))
    await backend.start()
    try:
        async with serve_front(args, backend, security, clock, registry, metrics) as where:
            names = ", ".join(f"{t.name}={t.address}" for t in targets)
            print(f"metricsd federate serving {where} over {len(targets)} clusters ({names}; timeout "
                  f"{settings.timeout_s:g} s, {settings.retries} retries)", flush=True)
            await stop.wait()
            log.info("federate stopping")
    finally:
        await backend.close()
        if security.auth is not None:
            await security.auth.close()


def run(args: argparse.Namespace) -> int:
    try:  # a bad flag or file stops the start, before anything listens
        clusters_from_args(args)
        settings_from_args(args)
        http_settings_from_args(args)
    except ValueError as e:
        print(f"metricsd federate: {e}", file=sys.stderr)
        return 2
    return run_service("metricsd federate", serve, args)
