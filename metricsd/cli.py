"""The ``metricsd`` command: one entry point, a subcommand per role."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from metricsd import __version__
from metricsd.agent import main as agent_main
from metricsd.clock import SystemClock
from metricsd.cluster import chaos, configserver, storeproc
from metricsd.cluster import local as cluster_local
from metricsd.consumers import cli as consumers_cli
from metricsd.memory import tune_malloc
from metricsd.proxy import main as proxy_main
from metricsd.up import DEFAULT_GRPC_PORT, DEFAULT_HTTP_PORT, EXAMPLES_DIR, UpOptions, run_up


def _port(text: str) -> int:
    p = int(text)
    if not 0 <= p <= 65535:
        raise argparse.ArgumentTypeError(f"port {p} out of range")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="metricsd", description="In-memory time-series store for pod metrics.")
    parser.add_argument("--version", action="version", version=f"metricsd {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="one process: a store fed by a simulated cluster (the embedded default)")
    up.add_argument("--grpc-port", type=_port, default=DEFAULT_GRPC_PORT, help="gRPC API port on 127.0.0.1")
    up.add_argument("--http-port", type=_port, default=DEFAULT_HTTP_PORT,
                    help="HTTP API port on 127.0.0.1 (Prometheus query API, remote write, native JSON, /metrics)")
    up.add_argument("--data-dir", type=Path, default=None,
                    help="directory for the store's write-ahead log and snapshots (created if missing); without it "
                         "data lives in memory only")
    up.add_argument("--wal-fsync", choices=["always", "interval", "never"], default="interval",
                    help="when the WAL is fsynced: a process crash loses nothing acknowledged under any policy; "
                         "a machine crash may lose up to the interval (1 s) with 'interval', everything unsynced "
                         "with 'never'")
    up.add_argument("--no-simulate", action="store_true", help="do not run the simulated agent")
    up.add_argument("--pods", type=int, default=200, help="simulated pods")
    up.add_argument("--workloads", type=int, default=10, help="simulated workloads")
    up.add_argument("--nodes", type=int, default=5, help="simulated nodes")
    up.add_argument("--seed", type=int, default=0, help="simulator seed")
    up.add_argument("--no-consumers", action="store_true", help="do not run the HPA, VPA and overcommit advisor")
    up.add_argument("--examples-dir", type=Path, default=EXAMPLES_DIR,
                    help="consumer specs (hpa.yaml, vpa.yaml, overcommit.yaml) to run in dry-run mode")

    from metricsd.querycmd import add_arguments

    q = sub.add_parser("query", help="ask an aggregate and print a table")
    add_arguments(q)
    consumers_cli.add_parsers(sub)
    agent_main.add_parser(sub)
    storeproc.add_parser(sub)
    proxy_main.add_parser(sub)
    configserver.add_parser(sub)
    cluster_local.add_parser(sub)
    chaos.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    tune_malloc()
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "up":
        opts = UpOptions(grpc_port=args.grpc_port, http_port=args.http_port, data_dir=args.data_dir,
                         simulate=not args.no_simulate, pods=args.pods, workloads=args.workloads, nodes=args.nodes,
                         seed=args.seed, consumers=not args.no_consumers, examples_dir=args.examples_dir,
                         wal_fsync=args.wal_fsync)
        try:
            asyncio.run(run_up(opts))
        except OSError as e:
            print(f"metricsd up: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            pass
        return 0
    if args.command == "query":
        from metricsd.querycmd import run_query

        return asyncio.run(run_query(args, SystemClock().now_ms()))
    if args.command in ("hpa", "vpa", "overcommit"):
        return consumers_cli.run(args)
    if args.command == "agent":
        return agent_main.run(args)
    if args.command == "store":
        return storeproc.run(args)
    if args.command == "proxy":
        return proxy_main.run(args)
    if args.command == "config-server":
        return configserver.run(args)
    if args.command == "cluster":
        return cluster_local.run(args)
    if args.command == "chaos":
        return chaos.run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
