"""`metricsd hpa|vpa|overcommit|colocation`: run one consumer against a gRPC endpoint, or print its decisions.

    metricsd hpa --spec deploy/examples/hpa.yaml --addr 127.0.0.1:7401 [--backend log|webhook|kubernetes]
    metricsd hpa status --url http://127.0.0.1:7400
    metricsd colocation --spec deploy/examples/colocation.yaml --hpa-spec deploy/examples/hpa.yaml \
        --state colocation-state.json --http-port 7410

`--once` runs a single sync and prints its decisions (a quick check of a spec).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from aiohttp import web

from metricsd.clock import SystemClock
from metricsd.cmd import eventloop
from metricsd.cmd.runner import add_etcd_arguments, etcd_from_args, layout_from_args, run_main, stop_event
from metricsd.cmd.security import (
    add_security_arguments,
    client_from_args,
    require_secure_or_loopback,
    server_from_args,
)
from metricsd.consumers.actuators import (
    Actuator,
    KubernetesActuator,
    KubernetesSettings,
    LogActuator,
    WebhookActuator,
    WebhookSettings,
)
from metricsd.consumers.actuators.base import ActuatorError
from metricsd.consumers.colocation.controller import ColocationController
from metricsd.consumers.colocation.spec import load_colocation_yaml
from metricsd.consumers.hpa.controller import HPAController
from metricsd.consumers.hpa.parse import load_hpa_yaml
from metricsd.consumers.loop import Periodic
from metricsd.consumers.overcommit.config import load_overcommit_yaml
from metricsd.consumers.overcommit.controller import OvercommitController
from metricsd.consumers.publish import DecisionPublisher, Publishing
from metricsd.consumers.specfields import SpecError
from metricsd.consumers.statusfmt import format_status
from metricsd.consumers.vpa.checkpoint import (
    CheckpointStore,
    EtcdCheckpointStore,
    FileCheckpointStore,
    MemoryCheckpointStore,
)
from metricsd.consumers.vpa.controller import VPAController
from metricsd.consumers.vpa.spec import load_vpa_yaml
from metricsd.defaults import grpc_address, http_url
from metricsd.http.auth import auth_middleware
from metricsd.http.consumers import add_consumer_routes
from metricsd.http.server import start_http
from metricsd.proto import metricsd_pb2_grpc as pb_grpc
from metricsd.rpc.channel import open_channel
from metricsd.rpc.client import GrpcBackend
from metricsd.security.settings import ClientSecurity

__all__ = ["KINDS", "add_parser", "build_actuator", "fetch_status", "run"]

KINDS = {
    "hpa": "horizontal autoscaler: Kubernetes' HPA rule plus schedules, step limit, history fallback",
    "vpa": "vertical recommender: the Kubernetes VPA recommender's model, checkpointed",
    "overcommit": "overcommit advisor: request sizes from weekly peaks, borrowable capacity, tidal table",
    "colocation": "colocation lending plan: which whole nodes to lend to offline work, when, and how they return",
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add `hpa`, `vpa`, `overcommit` and `colocation` to the `metricsd` command's subparsers."""
    for kind, text in KINDS.items():
        p = sub.add_parser(kind, help=text, description=text)
        p.set_defaults(consumer=kind, run=run)
        p.add_argument("--spec", type=Path, help="YAML file of the specs (see deploy/examples/)")
        p.add_argument("--addr", default=grpc_address(), help="gRPC address of a store or proxy")
        p.add_argument("--backend", choices=("log", "webhook", "kubernetes"), default="log",
                       help="how decisions are carried out (log: dry run)")
        p.add_argument("--webhook-url", help="POST decisions here (the webhook backend; alerts with any backend)")
        p.add_argument("--webhook-timeout", type=float, default=5.0)
        p.add_argument("--webhook-retries", type=int, default=3)
        p.add_argument("--kube-api", help="API server URL; default: in-cluster service account")
        p.add_argument("--kube-token-file", type=Path, help="bearer token file (default: the service account's)")
        p.add_argument("--kube-ca-file", type=Path, help="CA bundle of the API server (default: the account's)")
        p.add_argument("--colocation-selector", default="metricsd.io/colocation-pool=true",
                       help="label selector of the colocation-pool nodes (HPA scale-down preference)")
        p.add_argument("--once", action="store_true", help="run one sync, print its decisions, exit")
        p.add_argument("--no-publish-decisions", action="store_true",
                       help="do not write the decisions back to --addr as metricsd_* series (publishing needs a "
                            "token with the write role; a failed publish is logged and the decision stands)")
        if kind == "vpa":
            p.add_argument("--checkpoint", type=Path, help="JSON file for the histograms (default: memory only, "
                           "or etcd with --etcd)")
            add_etcd_arguments(p, required=False)
        if kind == "colocation":
            p.add_argument("--hpa-spec", type=Path, help="HPA specs whose schedules plan today's replica curves")
            p.add_argument("--state", type=Path, help="JSON file of the node states, kept across restarts "
                           "(default: memory only)")
        # In a pod the status port is also what the kubelet probes (/healthz), so every consumer has one.
        p.add_argument("--http-port", type=int, help=f"serve /api/v1/metricsd/{kind} (status, decisions) and "
                       "/healthz on this port")
        p.add_argument("--http-host", default="127.0.0.1", help="address for --http-port")
        add_security_arguments(p)  # the status port is a listener: TLS, tokens, --insecure as any other
        actions = p.add_subparsers(dest="action", metavar="{status}")
        st = actions.add_parser("status", help=f"print the {kind} decisions from the HTTP API as a table")
        st.add_argument("--url", default=http_url(), help="base URL of the metricsd HTTP API")
        st.add_argument("--limit", type=int, default=20, help="how many recent decisions")
        st.add_argument("--json", action="store_true", help="print the JSON document instead of a table")




def build_actuator(args: argparse.Namespace) -> Actuator:
    """The backend the options ask for. Raises ValueError or ActuatorError when it cannot be built."""
    if args.backend == "log":
        return LogActuator()
    if args.backend == "webhook":
        if not args.webhook_url:
            raise ValueError("--backend webhook needs --webhook-url")
        return WebhookActuator(WebhookSettings(args.webhook_url, args.webhook_timeout, args.webhook_retries))
    settings = KubernetesSettings.in_cluster() if not args.kube_api else KubernetesSettings(args.kube_api)
    defaults = KubernetesSettings(settings.api_url)
    return KubernetesActuator(KubernetesSettings(
        api_url=settings.api_url,
        token_file=args.kube_token_file or defaults.token_file,
        ca_file=args.kube_ca_file or defaults.ca_file,
        colocation_node_selector=args.colocation_selector,
    ))


async def fetch_status(kind: str, url: str, timeout_s: float = 10.0, security: ClientSecurity | None = None) -> object:
    """The JSON document of /api/v1/metricsd/<kind>. Raises aiohttp.ClientError or ValueError."""
    ssl = security.tls.ssl_context() if security is not None and security.tls is not None else None
    headers = security.headers() if security is not None else {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s),
                                     connector=aiohttp.TCPConnector(ssl=ssl) if ssl else None) as session, \
            session.get(f"{url.rstrip('/')}/api/v1/metricsd/{kind}", headers=headers) as resp:
        if resp.status != 200:
            raise ValueError(f"HTTP {resp.status} from {resp.url}: {(await resp.text())[:200]}")
        return await resp.json()


async def _status(args: argparse.Namespace) -> int:
    try:
        doc = await fetch_status(args.consumer, args.url, security=client_from_args(args))
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        print(f"metricsd {args.consumer} status: {e}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=1) if args.json else format_status(args.consumer, doc, args.limit))
    return 0


async def _run_loop(args: argparse.Namespace) -> int:
    kind = args.consumer
    text = args.spec.read_text()
    clock = SystemClock()
    actuator = build_actuator(args)
    alerts = WebhookActuator(WebhookSettings(args.webhook_url)) if args.webhook_url and args.backend != "webhook" \
        else None
    channel = open_channel(args.addr, client_from_args(args))
    backend = GrpcBackend(pb_grpc.MetricsStub(channel))
    controller: HPAController | VPAController | OvercommitController | ColocationController
    if kind == "hpa":
        controller = HPAController(load_hpa_yaml(text), backend, actuator, clock, alerts=alerts)
    elif kind == "vpa":
        store: CheckpointStore
        if args.checkpoint:
            store = FileCheckpointStore(args.checkpoint)
        elif args.etcd:
            kv = etcd_from_args(args)
            store = EtcdCheckpointStore(kv, f"{layout_from_args(args).base}/checkpoints/vpa")
        else:
            store = MemoryCheckpointStore()
        controller = VPAController(load_vpa_yaml(text), backend, actuator, clock, store)
    elif kind == "colocation":
        plans = load_colocation_yaml(text)
        if not plans:
            raise SpecError("documents", "no ColocationPlan in the file")
        hpas = load_hpa_yaml(args.hpa_spec.read_text()) if args.hpa_spec else []
        controller = ColocationController(plans[0], backend, actuator, clock, hpas=hpas, alerts=alerts,
                                          state_file=args.state)
    else:
        configs = load_overcommit_yaml(text)
        if not configs:
            raise SpecError("documents", "no OvercommitAdvisor in the file")
        controller = OvercommitController(configs[0], backend, actuator, clock)
    publisher = None if args.no_publish_decisions else DecisionPublisher(backend)
    status_site = (await _serve_status(args, controller, publisher) if getattr(args, "http_port", None) is not None
                   else None)
    syncable = controller if publisher is None else Publishing(controller, publisher)
    try:
        if args.once:
            await syncable.sync_once()
            print(format_status(kind, controller.history()))
            return 0
        loop = Periodic(syncable)
        loop.start()
        await stop_event().wait()
        await loop.stop()
        return 0
    finally:
        if isinstance(controller, VPAController):
            await controller.save()
        await actuator.close()
        if alerts is not None:
            await alerts.close()
        await channel.close(None)
        if status_site is not None:
            await status_site.cleanup()


async def _serve_status(args: argparse.Namespace, controller: ColocationController | HPAController | VPAController
                        | OvercommitController, publisher: DecisionPublisher | None = None) -> web.AppRunner:
    """GET /api/v1/metricsd/<kind> for this one consumer, read-only. A listener like any other:
    TLS and tokens (the read role) when given, and no non-loopback address without them unless
    --insecure. Raises ValueError naming the flag that is wrong."""
    def document(kind: str) -> dict[str, object]:
        if kind != args.consumer:
            raise KeyError(kind)
        publishing = publisher.document(kind) if publisher is not None else {"enabled": False}
        return {"status": controller.status(), "history": controller.history(), "publishing": publishing}

    security = server_from_args(args)
    require_secure_or_loopback(args.http_host, security, args.insecure, f"metricsd {args.consumer} --http-port")
    middlewares: list[Callable[..., Awaitable[web.StreamResponse]]] = []
    if security.auth is not None:
        middlewares.append(auth_middleware(security.auth))
    app = web.Application(middlewares=middlewares)
    add_consumer_routes(app, document)

    async def healthz(_: web.Request) -> web.Response:
        # Liveness only: the loop answers. A failing sync (the API server or the proxy away) is in
        # the status document, and a restart would not bring them back.
        return web.Response(text="ok\n")

    app.router.add_get("/healthz", healthz)
    runner, port = await start_http(app, args.http_host, args.http_port, security.tls)
    scheme = "https" if security.tls is not None else "http"
    print(f"metricsd {args.consumer}: status on {scheme}://{args.http_host}:{port}/api/v1/metricsd/"
          f"{args.consumer}", flush=True)
    return runner


def run(args: argparse.Namespace) -> int:
    """Entry point for `metricsd hpa|vpa|overcommit|colocation [status]`; returns the exit code."""
    if getattr(args, "action", None) == "status":
        return eventloop.run(_status(args))
    if args.spec is None:
        print(f"metricsd {args.consumer}: --spec FILE is required (see deploy/examples/)", file=sys.stderr)
        return 2
    return run_main(f"metricsd {args.consumer}", _run_loop(args),
                    errors=(OSError, SpecError, ValueError, ActuatorError))
