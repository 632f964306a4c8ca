"""``metricsd query``: ask an aggregate from the command line and print a readable table."""

from __future__ import annotations

import argparse
import math
import sys
from datetime import UTC, datetime

import grpc

from metricsd.clock import SystemClock
from metricsd.cmd import eventloop
from metricsd.cmd.security import add_client_arguments, client_from_args
from metricsd.defaults import grpc_address
from metricsd.durations import parse_duration_ms
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.client import MetricsClient
from metricsd.rpc.wire import ACROSS_FNS, SERIES_FNS, matchers_to_pb, values_matrix
from metricsd.selector import InvalidSelector, parse_selector


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--addr", default=grpc_address(), help="gRPC address of a store or proxy")
    p.add_argument("--metric", required=True, help="metric name, e.g. container_cpu_usage_seconds_total")
    p.add_argument("--selector", default="", help='label matchers, e.g. \'workload="web",namespace=~"prod-.*"\'')
    p.add_argument("--fn", choices=sorted(SERIES_FNS), default="rate", help="per-series function over the window")
    p.add_argument("--across", choices=sorted(ACROSS_FNS), default="avg", help="across-series function per group")
    p.add_argument("--quantile", type=float, default=0.9, help="for --across quantile")
    p.add_argument("--window", default="1m", help="per-series window, e.g. 1m")
    p.add_argument("--by", default="", help="comma-separated labels to group by, e.g. workload,namespace")
    p.add_argument("--at", default="", help="evaluation time (unix seconds); default now")
    p.add_argument("--range", dest="range_", default="", help="evaluate over the last RANGE at --step, e.g. 10m")
    p.add_argument("--step", default="1m")
    p.add_argument("--ratio-metric", default="", help="divide by this metric aggregated the same way (utilisation)")
    p.add_argument("--ratio-selector", default="", help="extra matchers for the ratio's metric")
    p.add_argument("--ratio-fn", choices=sorted(SERIES_FNS), default="last")
    p.add_argument("--ratio-window", default="5m")
    add_client_arguments(p)


def build_request(args: argparse.Namespace, now_ms: int) -> pb.AggregateRequest:
    at = int(float(args.at) * 1000) if args.at else now_ms
    req = pb.AggregateRequest(across=ACROSS_FNS[args.across], quantile=args.quantile)
    req.query.matchers.extend(matchers_to_pb(parse_selector(args.selector, args.metric)))
    req.query.series_fn = SERIES_FNS[args.fn]
    req.query.window_ms = parse_duration_ms(args.window)
    if args.by:
        req.group_by.extend(b.strip() for b in args.by.split(",") if b.strip())
    if args.ratio_metric:
        # The denominator shares the numerator's matchers apart from the metric name, so that
        # e.g. CPU usage of workload="web" is divided by the CPU requests of the same pods.
        sel = ",".join(x for x in (args.selector, args.ratio_selector) if x)
        req.denominator.matchers.extend(matchers_to_pb(parse_selector(sel, args.ratio_metric)))
        req.denominator.series_fn = SERIES_FNS[args.ratio_fn]
        req.denominator.window_ms = parse_duration_ms(args.ratio_window)
    if args.range_:
        step = parse_duration_ms(args.step)
        req.start_ms = at - parse_duration_ms(args.range_)
        req.end_ms = at
        req.step_ms = step
    else:
        req.start_ms = req.end_ms = at
    return req


def format_table(resp: pb.AggregateResponse) -> str:
    vals = values_matrix(resp)
    names = sorted({lab.name for g in resp.groups for lab in g.labels})
    header = [*names, "time (UTC)", "value"]
    rows = []
    for gi, g in enumerate(resp.groups):
        d = {lab.name: lab.value for lab in g.labels}
        for ti, t in enumerate(resp.timestamps):
            v = float(vals[gi, ti])
            when = datetime.fromtimestamp(t / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
            rows.append([*(d.get(n, "") for n in names), when, "-" if math.isnan(v) else f"{v:.6g}"])
    if not rows:
        return "no series matched (check --metric and --selector)"
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r) for r in rows]
    lines.append(f"({resp.series_scanned} series, {resp.samples_scanned} samples scanned)")
    return "\n".join(lines)


async def run_query(args: argparse.Namespace, now_ms: int) -> int:
    try:
        req = build_request(args, now_ms)
    except (ValueError, InvalidSelector) as e:
        print(f"metricsd query: {e}", file=sys.stderr)
        return 2
    async with MetricsClient(args.addr, security=client_from_args(args)) as client:
        try:
            resp = await client.aggregate(req)
        except grpc.aio.AioRpcError as e:
            print(f"metricsd query: {args.addr}: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    print(format_table(resp))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("query", help="ask an aggregate and print a table")
    add_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return eventloop.run(run_query(args, SystemClock().now_ms()))
