"""The ``metricsd`` command: one entry point, a subcommand per role (metricsd/cmd/<role>.py).

Each subcommand module has ``add_parser(sub)``, which registers its flags and sets ``run`` (the
function that runs it and returns the exit code); this module only parses and dispatches.

Only the module of the command being run is imported (``COMMANDS``): every process of a cluster
starts from this entry point, and importing every role's dependencies (aiohttp's client, the
consumers, the agent's collectors) cost a store 11 MiB of RSS it never used. ``--help`` and an
unknown command import them all, so the listing stays whole.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import logging
import sys
from collections.abc import Callable, Sequence

from metricsd import __version__
from metricsd.memory import tune_malloc
from metricsd.parentdeath import die_with_parent

__all__ = ["COMMANDS", "build_parser", "main"]

# The subcommand -> the module under metricsd.cmd that registers it, in the order of --help.
COMMANDS: dict[str, str] = {
    "up": "up", "query": "query", "hpa": "consumers", "vpa": "consumers", "overcommit": "consumers",
    "colocation": "consumers", "agent": "agent", "store": "store", "proxy": "proxy", "federate": "federate",
    "config-server": "configserver",
    "cluster": "cluster", "chaos": "chaos", "token": "token", "k8s-api": "k8sapi",
}

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (skipping the global options), or None."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--log-level":
            i += 2
            continue
        if arg.startswith("-"):
            return None  # --help, --version, or --log-level=X: parse with every command
        return arg
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with ``argv``, only the named command's module is imported and registered."""
    parser = argparse.ArgumentParser(prog="metricsd", description="In-memory time-series store for pod metrics.")
    parser.add_argument("--version", action="version", version=f"metricsd {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)
    wanted = _command_of(argv) if argv is not None else None
    modules = [COMMANDS[wanted]] if wanted in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for name in modules:
        importlib.import_module(f"metricsd.cmd.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
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
