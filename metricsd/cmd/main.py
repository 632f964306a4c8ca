"""The ``metricsd`` command: one entry point, a subcommand per role (metricsd/cmd/<role>.py).

Each subcommand module has ``add_parser(sub)``, which registers its flags and sets ``run`` (the
function that runs it and returns the exit code); this module only parses and dispatches.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import sys
from collections.abc import Callable

from metricsd import __version__
from metricsd.cmd import agent, chaos, cluster, configserver, consumers, proxy, query, store, token, up
from metricsd.cmd.parentdeath import die_with_parent
from metricsd.memory import tune_malloc

__all__ = ["build_parser", "main"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="metricsd", description="In-memory time-series store for pod metrics.")
    parser.add_argument("--version", action="version", version=f"metricsd {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (up, query, consumers, agent, store, proxy, configserver, cluster, chaos, token):
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # A crash in native code (gRPC, NumPy, lz4) then leaves every thread's Python stack in the log
    # instead of a bare exit code -11.
    faulthandler.enable(file=sys.stderr, all_threads=True)
    die_with_parent()
    tune_malloc()
    logging.basicConfig(level=args.log_level, format=LOG_FORMAT, stream=sys.stderr)
    run: Callable[[argparse.Namespace], int] = args.run
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
