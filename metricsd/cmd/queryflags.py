"""PromQL's limits as flags of the processes that serve the HTTP API (``metricsd up``,
``metricsd proxy``), named as Prometheus names its own (--query.timeout, --query.max-concurrency,
--query.max-samples), plus the input limits that bound the parser."""

from __future__ import annotations

import argparse
import dataclasses

from metricsd.http.settings import HttpSettings
from metricsd.promql.limits import QueryLimits

__all__ = ["add_query_arguments", "http_settings_from_args"]


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
    g.add_argument("--query.max-length", dest="query_max_length", type=int, default=q.max_length,
                   help="characters of a query; past it 400 before parsing (default %(default)s)")
    g.add_argument("--query.max-depth", dest="query_max_depth", type=int, default=q.max_depth,
                   help="nesting of (), [] and {}; past it 400 before parsing (default %(default)s)")
    g.add_argument("--query.max-operators", dest="query_max_operators", type=int, default=q.max_operators,
                   help="binary operators in a query; past it 400 before parsing (default %(default)s)")


def http_settings_from_args(args: argparse.Namespace, base: HttpSettings | None = None) -> HttpSettings:
    """Raises ValueError for a limit that is not positive."""
    limits = QueryLimits(max_length=args.query_max_length, max_depth=args.query_max_depth,
                         max_operators=args.query_max_operators, max_concurrency=args.query_max_concurrency,
                         max_queued=args.query_max_queued)
    if args.query_timeout <= 0 or args.query_max_samples <= 0:
        raise ValueError("--query.timeout and --query.max-samples must be positive")
    return dataclasses.replace(base or HttpSettings(), request_timeout_s=args.query_timeout,
                               max_samples=args.query_max_samples, query_limits=limits)
