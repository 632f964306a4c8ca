"""``metricsd k8s-api``: the Kubernetes aggregated API server for ``kubectl top``, the stock HPA
(``metrics.k8s.io``) and, with ``--rules``, custom and external metrics (prometheus-adapter's rule
format), answered by a store or proxy's pushed-down aggregates.

    metricsd k8s-api --addr metricsd-proxy.metricsd.svc:7401 --host 0.0.0.0 \\
        --tls-cert tls.crt --tls-key tls.key --requestheader-from-cluster --rules rules.yaml
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import tempfile
from pathlib import Path

from metricsd.cmd.runner import run_main, stop_event
from metricsd.cmd.security import add_security_arguments, client_from_args, server_from_args
from metricsd.defaults import GRPC_PORT, HOST, K8S_API_PORT, grpc_address
from metricsd.durations import parse_duration_ms
from metricsd.http.server import start_http
from metricsd.k8sapi.custom import CustomMetrics
from metricsd.k8sapi.incluster import fetch_requestheader
from metricsd.k8sapi.requestheader import RequestHeaderSettings
from metricsd.k8sapi.rules import RuleError, load_rules
from metricsd.k8sapi.server import FrontProxyTLS, K8sApiSettings, build_k8s_app
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import GrpcBackend

__all__ = ["add_parser", "run"]

log = logging.getLogger("metricsd.k8sapi")


def _csv(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("k8s-api", help="Kubernetes aggregated API server: metrics.k8s.io, custom and external "
                                       "metrics", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--addr", default=grpc_address(HOST, GRPC_PORT), metavar="HOST:PORT",
                   help="the store or proxy to ask (gRPC; default %(default)s)")
    p.add_argument("--host", default=HOST, help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=K8S_API_PORT, help="HTTPS port (default %(default)s)")
    p.add_argument("--rules", type=Path, default=None, metavar="FILE",
                   help="prometheus-adapter rules (rules, externalRules) for custom.metrics.k8s.io and "
                        "external.metrics.k8s.io; without it only metrics.k8s.io is served")
    p.add_argument("--relist-interval", type=float, default=60.0, metavar="SECONDS",
                   help="how often the rules' metric names are listed again (default %(default)s)")
    p.add_argument("--window", default="1m", help="CPU rate window of PodMetrics / NodeMetrics (default %(default)s)")
    p.add_argument("--label-selector-keys", type=_csv, default=[], metavar="KEY,...",
                   help="labelSelector keys of metrics.k8s.io requests matched against series labels (e.g. "
                        "workload); requirements on other keys are ignored: metricsd stores no pod labels")
    g = p.add_argument_group("front proxy", "the API server's aggregator (README: The Kubernetes metrics APIs)")
    g.add_argument("--requestheader-client-ca-file", type=Path, default=None, metavar="FILE",
                   help="trust X-Remote-User / X-Remote-Group only from client certificates signed by this CA")
    g.add_argument("--requestheader-from-cluster", action="store_true",
                   help="read that CA and the settings below from kube-system/extension-apiserver-authentication")
    g.add_argument("--requestheader-allowed-names", type=_csv, default=[], metavar="CN,...",
                   help="common names the front proxy's certificate may have (default: any the CA signed)")
    g.add_argument("--requestheader-username-headers", type=_csv, default=["X-Remote-User"], metavar="H,...")
    g.add_argument("--requestheader-group-headers", type=_csv, default=["X-Remote-Group"], metavar="H,...")
    g.add_argument("--requestheader-extra-headers-prefix", type=_csv, default=["X-Remote-Extra-"], metavar="P,...")
    add_security_arguments(p)
    p.set_defaults(run=run)


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def _serve(args: argparse.Namespace) -> None:
    if args.tls_client_ca is not None:
        raise ValueError("metricsd k8s-api: use --requestheader-client-ca-file for the front proxy's CA, "
                         "not --tls-client-ca")
    window_ms = parse_duration_ms(args.window)
    if window_ms <= 0:
        raise ValueError(f"--window {args.window}: must be positive")
    rules = load_rules(args.rules.read_text(), str(args.rules)) if args.rules is not None else None
    security = server_from_args(args)  # tokens (and TokenReview), if any
    tmp = tempfile.TemporaryDirectory(prefix="metricsd-k8sapi-")
    ca: Path | None = args.requestheader_client_ca_file
    header: RequestHeaderSettings | None = None
    if args.requestheader_from_cluster:
        ca = Path(tmp.name) / "requestheader-ca.crt"
        header = await fetch_requestheader(ca)
        log.info("front proxy from the cluster: allowed names %s", sorted(header.allowed_names) or "any")
    elif ca is not None:
        header = RequestHeaderSettings(frozenset(args.requestheader_allowed_names),
                                       tuple(args.requestheader_username_headers),
                                       tuple(args.requestheader_group_headers),
                                       tuple(args.requestheader_extra_headers_prefix))
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    if args.tls_cert is None and (header is not None or not _loopback(args.host)):
        raise ValueError("metricsd k8s-api serves HTTPS only off loopback and with a front proxy: give --tls-cert "
                         "and --tls-key")
    if not _loopback(args.host) and header is None and security.auth is None and not args.insecure:
        raise ValueError(f"metricsd k8s-api would listen on {args.host} without --requestheader-client-ca-file "
                         f"(or --requestheader-from-cluster) or tokens: anyone could read metrics. Give one, or "
                         f"--insecure")
    tls = FrontProxyTLS(args.tls_cert, args.tls_key, ca) if args.tls_cert is not None else None
    channel = open_channel(args.addr, client_from_args(args))
    backend = GrpcBackend(pb_grpc.MetricsStub(channel))
    custom = CustomMetrics(backend, rules, args.relist_interval) if rules is not None else None
    settings = K8sApiSettings(window_ms, frozenset(args.label_selector_keys), header)
    app = build_k8s_app(backend, custom, settings, security.auth)
    runner, port = await start_http(app, args.host, args.port, tls)
    scheme = "https" if tls is not None else "http"
    groups = "metrics.k8s.io" + (", custom.metrics.k8s.io, external.metrics.k8s.io" if rules else "")
    print(f"metricsd k8s-api: serving {groups} on {scheme}://{args.host}:{port} from {args.addr}", flush=True)
    try:
        await stop_event().wait()
    finally:
        await runner.cleanup()
        await channel.close(None)
        if security.auth is not None:
            await security.auth.close()
        tmp.cleanup()


def run(args: argparse.Namespace) -> int:
    return run_main("metricsd k8s-api", _serve(args), errors=(OSError, ValueError, RuleError))


