"""Flags of the processes that serve the HTTP API (``metricsd up``, ``metricsd proxy``): PromQL's
limits, named as Prometheus names its own (--query.timeout, --query.max-concurrency,
--query.max-samples), plus the input limits that bound the parser; and how remote write keys
series (--remote-write-relabel and the namespace/pod fallbacks, metricsd/http/remote_series.py)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from metricsd.http.relabel import Rule, parse_rules
from metricsd.http.settings import HttpSettings
from metricsd.promql.limits import QueryLimits

__all__ = [
    "add_query_arguments", "add_remote_write_arguments", "http_settings_from_args", "relabel_rules_from_file",
    "remote_write_argv",
]


def add_query_arguments(p: argparse.ArgumentParser) -> None:
    d, q = HttpSettings(), QueryLimits()
    g = p.add_argument_group("PromQL limits", "each refused with Prometheus' error JSON (README: The HTTP API)")
    g.add_argument("--query.timeout", dest="query_timeout", type=float, default=d.request_timeout_s,
                   metavar="SECONDS", help="a query still running after this gets 503 timeout (default %(default)s)")
    g.add_argument("--query.max-concurrency", dest="query_max_concurrency", type=int, default=q.max_concurrency,
                   help="queries evaluated at once; up to --query.max-queued more wait (default %(default)s)")
    g.add_argument("--query.max-queued", dest="query_max_queued", type=int, default=q.max_queued,
                   help="queries waiting for a slot before more get 503 at once (default %(default)s)")
    g.add_argument("--query.max-samples", dest="query_max_samples", type=int, default=d.max_samples,
                   help="samples one query may load; past it 422 (default %(default)s)")
    g.add_argument("--query.max-series", dest="query_max_series", type=int, default=q.max_series,
                   help="series one selector may select (queries, /api/v1/series); past it 422 (default %(default)s)")
    g.add_argument("--query.max-length", dest="query_max_length", type=int, default=q.max_length,
                   help="characters of a query; past it 400 before parsing (default %(default)s)")
    g.add_argument("--query.max-depth", dest="query_max_depth", type=int, default=q.max_depth,
                   help="nesting of (), [] and {}; past it 400 before parsing (default %(default)s)")
    g.add_argument("--query.max-operators", dest="query_max_operators", type=int, default=q.max_operators,
                   help="binary operators in a query; past it 400 before parsing (default %(default)s)")
    g.add_argument("--http.hot-path", dest="http_hot_path", action=argparse.BooleanOptionalAction,
                   default=d.hot_path, help="answer small /api/v1/query and /query_range requests below aiohttp's "
                                            "web layer (metricsd/http/hotpath.py; default %(default)s)")


def add_remote_write_arguments(p: argparse.ArgumentParser) -> None:
    d = HttpSettings()
    g = p.add_argument_group("remote write", "how series without namespace/pod are keyed (README: The HTTP API)")
    g.add_argument("--remote-write-relabel", type=Path, default=None, metavar="FILE",
                   help="a YAML or JSON list of Prometheus relabel_configs applied to every remote-written series")
    g.add_argument("--remote-write.default-namespace", dest="rw_default_namespace", default=d.default_namespace,
                   metavar="NAME", help="namespace of series without one after relabelling; '' refuses them "
                                        "(default %(default)s)")
    g.add_argument("--remote-write.pod-from", dest="rw_pod_from", default=",".join(d.pod_labels), metavar="LABELS",
                   help="comma-separated labels whose value becomes pod when a series has none, the first present "
                        "wins; '' refuses them (default %(default)s)")
    g.add_argument("--remote-write.created-timestamp-zero", dest="rw_created_zero", action="store_true",
                   help="remote write 2.0: store a 0 sample at a counter's created timestamp")


def remote_write_argv(args: argparse.Namespace) -> tuple[str, ...]:
    """The remote-write flags as given, for a command that starts proxies of its own (``cluster
    up``); the relabel file is checked here, so a bad one fails before any process starts, and made
    absolute, so the children find it whatever their working directory.

    Raises ValueError naming the file."""
    out: list[str] = []
    if args.remote_write_relabel is not None:
        relabel_rules_from_file(args.remote_write_relabel)
        out += ["--remote-write-relabel", str(args.remote_write_relabel.resolve())]
    out += ["--remote-write.default-namespace", args.rw_default_namespace, "--remote-write.pod-from", args.rw_pod_from]
    if args.rw_created_zero:
        out.append("--remote-write.created-timestamp-zero")
    return tuple(out)


def relabel_rules_from_file(path: Path | None) -> tuple[Rule, ...]:
    """Raises ValueError (RelabelConfigError, or the file cannot be read) naming the file."""
    if path is None:
        return ()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--remote-write-relabel {path}: {e}") from None
    return parse_rules(text, str(path))


def http_settings_from_args(args: argparse.Namespace, base: HttpSettings | None = None) -> HttpSettings:
    """Raises ValueError for a limit that is not positive."""
    limits = QueryLimits(max_length=args.query_max_length, max_depth=args.query_max_depth,
                         max_operators=args.query_max_operators, max_concurrency=args.query_max_concurrency,
                         max_queued=args.query_max_queued, max_series=args.query_max_series)
    if args.query_timeout <= 0 or args.query_max_samples <= 0:
        raise ValueError("--query.timeout and --query.max-samples must be positive")
    settings = dataclasses.replace(base or HttpSettings(), request_timeout_s=args.query_timeout,
                                   max_samples=args.query_max_samples, query_limits=limits,
                                   hot_path=getattr(args, "http_hot_path", True))
    if not hasattr(args, "rw_pod_from"):
        return settings
    pods = tuple(x.strip() for x in args.rw_pod_from.split(",") if x.strip())
    return dataclasses.replace(settings, default_namespace=args.rw_default_namespace or None, pod_labels=pods,
                               relabel_rules=relabel_rules_from_file(args.remote_write_relabel),
                               created_timestamp_zero=args.rw_created_zero)
