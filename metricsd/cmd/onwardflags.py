"""Flags of sending data onward (``metricsd up``, ``metricsd proxy``, ``metricsd cluster up``):
remote-write targets, the onward buffer, and the hourly Parquet files (README: Sending data onward)."""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from metricsd.clock import Clock
from metricsd.onward.buffer import BufferSettings
from metricsd.onward.target import TargetConfig, TargetError, parse_targets

if TYPE_CHECKING:  # the sender imports pyarrow (~90 MiB resident): only a process that sends onward loads it
    from metricsd.onward.tee import Onward

__all__ = ["FileClock", "add_onward_arguments", "onward_argv", "parquet_argv", "parquet_clock", "parquet_location",
           "start_onward", "targets_from_args"]

log = logging.getLogger("metricsd.onward")


def add_onward_arguments(p: argparse.ArgumentParser) -> None:
    d = BufferSettings()
    g = p.add_argument_group("sending onward", "remote write to other systems, hourly Parquet "
                                               "(README: Sending data onward)")
    g.add_argument("--remote-write-url", action="append", default=[], metavar="URL",
                   help="send every acknowledged sample to this Prometheus remote-write receiver (repeatable)")
    g.add_argument("--remote-write-config", type=Path, default=None, metavar="FILE",
                   help="remote-write targets with relabel rules, auth and TLS: a YAML list of Prometheus "
                        "remote_write entries")
    g.add_argument("--remote-write-buffer-dir", type=Path, default=None, metavar="DIR",
                   help="the onward buffer (default <data-dir>/onward; without either, a temporary directory: a "
                        "restart then loses what was not sent)")
    g.add_argument("--remote-write-buffer-bytes", type=int, default=d.max_bytes, metavar="BYTES",
                   help="bound of the onward buffer on disk; past it the oldest unsent samples are dropped and "
                        "counted (default %(default)s)")
    g.add_argument("--parquet-dir", default=None, metavar="DIR_OR_URL",
                   help="write raw samples and hourly rollups of every closed hour as Parquet here (a directory, "
                        "or any fsspec URL: s3://bucket/prefix, memory://x). Proxies given the same one elect "
                        "the writer in etcd: one writes, another takes over when it dies")
    g.add_argument("--parquet-check", type=float, default=60.0, metavar="SECONDS",
                   help="how often the Parquet writer looks for closed hours without files (default %(default)s)")
    g.add_argument("--parquet-clock-file", type=Path, default=None, help=argparse.SUPPRESS)  # tests: the writer's clock


def targets_from_args(args: argparse.Namespace) -> list[TargetConfig]:
    """Raises ValueError naming the flag or file."""
    text = None
    if args.remote_write_config is not None:
        try:
            text = args.remote_write_config.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--remote-write-config {args.remote_write_config}: {e}") from None
    try:
        return parse_targets(list(args.remote_write_url), text, str(args.remote_write_config or "--remote-write-url"))
    except TargetError as e:
        raise ValueError(str(e)) from None


def onward_argv(args: argparse.Namespace) -> tuple[str, ...]:
    """The flags as given, for ``cluster up``'s proxies (the config file checked and made absolute).
    Each proxy keeps its own onward buffer in ``<data-dir>/proxy-i/onward``: one directory given
    to all would be two processes appending to one log, so ``--remote-write-buffer-dir`` is refused."""
    if getattr(args, "remote_write_buffer_dir", None) is not None:
        raise ValueError("--remote-write-buffer-dir: each proxy keeps its onward buffer in "
                         "<data-dir>/proxy-<i>/onward; give --data-dir instead")
    targets_from_args(args)
    out: list[str] = []
    for url in args.remote_write_url:
        out += ["--remote-write-url", url]
    if args.remote_write_config is not None:
        out += ["--remote-write-config", str(args.remote_write_config.resolve())]
    if args.remote_write_url or args.remote_write_config is not None:
        out += ["--remote-write-buffer-bytes", str(args.remote_write_buffer_bytes)]
    return tuple(out)


def parquet_argv(args: argparse.Namespace) -> tuple[str, ...]:
    """The Parquet flags as given, for ``cluster up``'s proxies (which elect the one that writes)."""
    if not args.parquet_dir:
        return ()
    out = ["--parquet-dir", parquet_location(args.parquet_dir), "--parquet-check", str(args.parquet_check)]
    if args.parquet_clock_file is not None:
        out += ["--parquet-clock-file", str(args.parquet_clock_file.resolve())]
    return tuple(out)


def parquet_location(where: str) -> str:
    """A --parquet-dir as given to child processes: a local path made absolute, a URL unchanged."""
    return where if "://" in where else str(Path(where).resolve())


class FileClock:
    """A clock read from a file (milliseconds since the epoch, decimal text) at each look: what a
    test passes a process so that it moves the hours of the Parquet writer without waiting."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def now_ms(self) -> int:
        return int(self.path.read_text().strip())

    def monotonic(self) -> float:
        return time.monotonic()


def parquet_clock(args: argparse.Namespace, clock: Clock) -> Clock:
    return FileClock(args.parquet_clock_file) if args.parquet_clock_file is not None else clock


def start_onward(args: argparse.Namespace, data_dir: Path | None, registry: CollectorRegistry, clock: Clock
                 ) -> tuple[Onward | None, tempfile.TemporaryDirectory[str] | None]:
    """The Onward of the flags (None without targets), and a temporary directory to clean up.
    Raises ValueError for a bad target or bound."""
    targets = targets_from_args(args)
    if not targets:
        return None, None
    tmp = None
    directory = args.remote_write_buffer_dir or (data_dir / "onward" if data_dir is not None else None)
    if directory is None:
        tmp = tempfile.TemporaryDirectory(prefix="metricsd-onward-")
        directory = Path(tmp.name)
        log.warning("no --remote-write-buffer-dir or --data-dir: the onward buffer is in %s and a restart loses "
                    "what was not sent", directory)
    from metricsd.onward.tee import Onward  # pyarrow only when sending onward

    bound = args.remote_write_buffer_bytes
    settings = BufferSettings(max_bytes=bound, segment_bytes=max(4096, min(64 << 20, bound // 4)))
    onward = Onward(directory, targets, registry, clock, settings=settings)
    log.info("sending onward to %s (buffer %s)", ", ".join(t.url for t in targets), directory)
    return onward, tmp
