"""Flags and process plumbing that every command shares: where etcd is, which cluster, how to stop
on SIGINT / SIGTERM, and one way to run a command's coroutine (``run_main``), so a port in use or a
bad flag value ends as one line on stderr and exit status 1 in every process alike."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from metricsd.cluster.shardmap import KeyLayout
from metricsd.cmd import eventloop
from metricsd.durations import parse_duration_ms
from metricsd.rpc.admission import DEFAULT_MAX_FUTURE_MS

if TYPE_CHECKING:
    from metricsd.cluster.etcd_kv import EtcdKV

__all__ = [
    "add_etcd_arguments",
    "add_max_future_argument",
    "address",
    "etcd_from_args",
    "layout_from_args",
    "max_future",
    "port",
    "run_main",
    "run_service",
    "stop_event",
]

DEFAULT_ETCD = "127.0.0.1:2379"


def port(text: str) -> int:
    p = int(text)
    if not 0 <= p <= 65535:
        raise argparse.ArgumentTypeError(f"port {p} out of range")
    return p


def address(text: str) -> str:
    host, _, p = text.rpartition(":")
    if not host or not p.isdigit() or not 0 < int(p) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not host:port")
    return text


def add_etcd_arguments(p: argparse.ArgumentParser, required: bool = True) -> None:
    g = p.add_argument_group("cluster", "where the shard map lives")
    g.add_argument("--etcd", type=address, required=required, default=None,
                   metavar="HOST:PORT", help="an etcd client endpoint")
    g.add_argument("--cluster", default="default", help="cluster name: keys live under <etcd-root>/<cluster>/ "
                   "(default %(default)s)")
    g.add_argument("--etcd-root", default="/metricsd", help="key prefix in etcd (default %(default)s)")
    g.add_argument("--etcd-timeout", type=float, default=2.0, metavar="SECONDS",
                   help="timeout of each etcd request (default %(default)s)")


def max_future(text: str) -> int | None:
    """``--max-future``: a duration in milliseconds, or None for ``none`` (no limit)."""
    if text.strip().lower() in ("none", "off"):
        return None
    try:
        return parse_duration_ms(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def add_max_future_argument(p: argparse.ArgumentParser) -> None:
    """``--max-future`` (store, proxy, up): README, "What an operator meets"."""
    p.add_argument("--max-future", type=max_future, default=DEFAULT_MAX_FUTURE_MS, metavar="DURATION",
                   help="refuse samples stamped more than this after this process's clock (a sender's clock "
                        "running ahead), before they reach a series; 'none': no limit (default 10m)")


def layout_from_args(args: argparse.Namespace) -> KeyLayout:
    return KeyLayout(root=args.etcd_root, cluster=args.cluster)


def etcd_from_args(args: argparse.Namespace) -> EtcdKV:
    from metricsd.cluster.etcd_kv import EtcdKV, EtcdSettings  # aetcd (~3 MiB): only commands that use etcd

    return EtcdKV(EtcdSettings(endpoint=args.etcd, request_timeout_s=args.etcd_timeout,
                               watch_backoff_max_s=1.0))


def stop_event(stop: asyncio.Event | None = None) -> asyncio.Event:
    """An event (``stop``, or a new one) set by SIGINT or SIGTERM (handlers installed on the
    running loop)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    return stop


def run_main(name: str, main: Coroutine[Any, Any, object],
             errors: tuple[type[Exception], ...] = (OSError, ValueError), role: str | None = None) -> int:
    """Run a command's coroutine to its end (SIGINT / SIGTERM end a service cleanly). The expected
    start-up failures (a port in use, an unusable flag value, a locked data directory) become one
    line on stderr and exit status 1 instead of a traceback; Ctrl-C is a clean exit. A coroutine
    that returns an int returns the exit status itself. ``role``: the kind of process, for its
    event loop's own setting (metricsd/cmd/eventloop.py)."""
    try:
        result = eventloop.run(main, role)
    except errors as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return result if isinstance(result, int) else 0


def run_service(name: str, serve: Callable[[argparse.Namespace], Coroutine[Any, Any, None]],
                args: argparse.Namespace, errors: tuple[type[Exception], ...] = (OSError, ValueError),
                role: str | None = None) -> int:
    """``run_main`` of a long-lived process's ``serve(args)``."""
    return run_main(name, serve(args), errors, role)
