"""The security flags every process shares, and what they build: the ServerSecurity of its
listeners and the ClientSecurity of the connections it opens to other metricsd processes.

Without any flag a process serves plaintext to anyone, which is what ``metricsd up`` and
``metricsd cluster up``'s processes do on 127.0.0.1. A process asked to listen on any other
address without TLS and tokens refuses to start unless ``--insecure`` is given.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
from pathlib import Path

import grpc

from metricsd.rpc.health import HasHealth, start_cluster_grpc
from metricsd.security.auth import Authenticator
from metricsd.security.settings import ClientSecurity, ServerSecurity
from metricsd.security.tls import ClientTLS, ServerTLS
from metricsd.security.tokenreview import TokenReview, parse_role_bindings
from metricsd.security.tokens import TokenFile

__all__ = ["add_client_arguments", "add_security_arguments", "client_from_args", "require_secure_or_loopback",
           "serve_probes", "server_from_args"]

log = logging.getLogger("metricsd.security")


def add_security_arguments(p: argparse.ArgumentParser, server: bool = True, client: bool = True,
                           tokens: bool = True, probes: bool = False) -> None:
    """``probes``: also --health-port, for a process whose data port may serve TLS."""
    g = p.add_argument_group("security", "TLS and bearer tokens (README: Security)")
    if probes:
        g.add_argument("--health-port", type=int, default=-1,
                       help="also serve grpc.health.v1 alone, in plaintext, on this port: for Kubernetes' grpc "
                            "probes, which cannot speak TLS (-1: none; default %(default)s)")
    g.add_argument("--tls-cert", type=Path, default=None, metavar="FILE",
                   help="serve TLS with this certificate (PEM; re-read when it changes); also the client "
                        "certificate presented to other metricsd processes (mutual TLS)" if server else
                        "the client certificate to present (mutual TLS)")
    g.add_argument("--tls-key", type=Path, default=None, metavar="FILE", help="the key of --tls-cert (PEM)")
    if server:
        g.add_argument("--tls-client-ca", type=Path, default=None, metavar="FILE",
                       help="mutual TLS: require client certificates signed by this CA (on HTTP with tokens, "
                            "asked for and checked when presented, not required: browsers have none)")
    if server and tokens:
        g.add_argument("--tokens-file", type=Path, default=None, metavar="FILE",
                       help="require bearer tokens: 'name roles sha256:<hash>' per line (metricsd token new)")
        g.add_argument("--tokenreview", action="store_true",
                       help="also accept Kubernetes ServiceAccount tokens, checked by the API server's TokenReview")
        g.add_argument("--tokenreview-url", default=None, metavar="URL",
                       help="the API server for --tokenreview (default: the in-cluster one)")
        g.add_argument("--tokenreview-role", action="append", default=[], metavar="USER_OR_GROUP=ROLES",
                       help="roles of a ServiceAccount user or group, e.g. "
                            "system:serviceaccount:metricsd:agent=write (repeatable)")
    if server:
        g.add_argument("--insecure", action="store_true",
                       help="allow listening on a non-loopback address without TLS and tokens")
    if client:
        _add_client_arguments(g)


def add_client_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of a command that only dials metricsd (query, the consumers, cluster status)."""
    add_security_arguments(p, server=False)


def _add_client_arguments(g: argparse._ActionsContainer) -> None:
    g.add_argument("--tls-ca", type=Path, default=None, metavar="FILE",
                   help="dial other metricsd processes over TLS, trusting this CA")
    g.add_argument("--tls-server-name", default=None, metavar="NAME",
                   help="the name to check in the servers' certificates (default: the address's host)")
    g.add_argument("--auth-token-file", type=Path, default=None, metavar="FILE",
                   help="send the bearer token in this file to other metricsd processes (re-read when it "
                        "changes, as Kubernetes rotates ServiceAccount tokens)")


def server_from_args(args: argparse.Namespace) -> ServerSecurity:
    """Raises ValueError (TLSError, TokenFileError) naming the flag's file and what is wrong."""
    tls = None
    cert, key = getattr(args, "tls_cert", None), getattr(args, "tls_key", None)
    if (cert is None) != (key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    if cert is None and getattr(args, "tls_client_ca", None) is not None:
        raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")
    tokens = TokenFile(args.tokens_file) if getattr(args, "tokens_file", None) else None
    review = None
    if getattr(args, "tokenreview", False):
        bindings = parse_role_bindings(args.tokenreview_role)
        review = (TokenReview(args.tokenreview_url, bindings) if args.tokenreview_url
                  else TokenReview.in_cluster(bindings))
    auth = Authenticator(tokens, review) if tokens is not None or review is not None else None
    if cert is not None and key is not None:
        # With tokens, HTTP asks for a client certificate but admits by token: a browser opening the
        # dashboard, or Grafana, has none. gRPC stays mutual.
        tls = ServerTLS(cert, key, getattr(args, "tls_client_ca", None), require_http_client_cert=auth is None)
    return ServerSecurity(tls, auth)


def client_from_args(args: argparse.Namespace) -> ClientSecurity:
    tls = None
    ca = getattr(args, "tls_ca", None)
    if ca is not None:
        cert, key = getattr(args, "tls_cert", None), getattr(args, "tls_key", None)
        tls = ClientTLS(ca, cert, key, getattr(args, "tls_server_name", None))
    return ClientSecurity(tls, token_file=getattr(args, "auth_token_file", None))


async def serve_probes(args: argparse.Namespace, backend: HasHealth) -> grpc.aio.Server | None:
    """The --health-port server (health checks only, plaintext), or None without the flag."""
    if args.health_port < 0:
        return None
    server, bound = await start_cluster_grpc(None, backend, args.host, args.health_port)
    log.info("grpc.health.v1 for probes on %s:%d (plaintext, health checks only)", args.host, bound)
    return server


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_secure_or_loopback(host: str, security: ServerSecurity, insecure: bool, what: str) -> None:
    """Raises ValueError when ``what`` would listen on a non-loopback ``host`` without TLS and
    tokens and ``--insecure`` was not given; logs a warning when it was."""
    if _loopback(host) or security.secure:
        return
    missing = " and ".join(m for m, have in (("TLS (--tls-cert, --tls-key)", security.tls is not None),
                                               ("tokens (--tokens-file or --tokenreview)", security.auth is not None))
                           if not have)
    if not insecure:
        raise ValueError(f"{what} would listen on {host} without {missing}: anyone who reaches the port could "
                         f"read and write metrics. Give them, or --insecure to accept that")
    log.warning("%s listens on %s without %s (--insecure)", what, host, missing)
