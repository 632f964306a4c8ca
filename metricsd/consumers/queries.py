"""The few metrics questions the consumers ask, as Aggregate and Rollups requests.

Each helper builds one request for a `MetricsBackend` and turns the answer into plain dicts keyed
by the group-by labels' values, so the controllers never touch flattened proto arrays. Errors are
the backend's: Unavailable when the data cannot be had now, BadRequest for a malformed question.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import MetricsBackend

__all__ = [
    "CPU_USAGE",
    "NODE_CAPACITY",
    "OOM_EVENTS",
    "REQUESTS",
    "WORKING_SET",
    "HourRollup",
    "eq",
    "group_instant",
    "group_range",
    "hour_rate",
    "rollups",
]

CPU_USAGE = "container_cpu_usage_seconds_total"
WORKING_SET = "container_memory_working_set_bytes"
OOM_EVENTS = "container_oom_events_total"
REQUESTS = "kube_pod_container_resource_requests"
NODE_CAPACITY = "kube_node_status_capacity"

Key = tuple[str, ...]


def eq(name: str, value: str) -> pb.Matcher:
    return pb.Matcher(type=pb.Matcher.EQ, name=name, value=value)


def _request(matchers: Sequence[pb.Matcher], fn: int, window_ms: int, by: Sequence[str], across: int,
             start_ms: int, end_ms: int, step_ms: int) -> pb.AggregateRequest:
    req = pb.AggregateRequest(across=across, start_ms=start_ms, end_ms=end_ms, step_ms=step_ms)  # type: ignore[arg-type]
    req.query.matchers.extend(matchers)
    req.query.series_fn = fn  # type: ignore[assignment]
    req.query.window_ms = window_ms
    req.group_by.extend(by)
    return req


def _key(group: pb.Group, by: Sequence[str]) -> Key:
    labels = {lab.name: lab.value for lab in group.labels}
    return tuple(labels.get(name, "") for name in by)


async def group_instant(
    backend: MetricsBackend,
    matchers: Sequence[pb.Matcher],
    fn: int,
    window_ms: int,
    by: Sequence[str],
    at_ms: int,
    across: int = pb.ACROSS_SUM,
) -> dict[Key, float]:
    """across(fn(series over window)) per group at one instant; groups without a value are left out."""
    resp = await backend.aggregate(_request(matchers, fn, window_ms, by, across, at_ms, at_ms, 0))
    out: dict[Key, float] = {}
    n_times = len(resp.timestamps)
    for g, group in enumerate(resp.groups):
        value = resp.values[g * n_times + n_times - 1] if n_times else math.nan
        if not math.isnan(value):
            out[_key(group, by)] = value
    return out


async def group_range(
    backend: MetricsBackend,
    matchers: Sequence[pb.Matcher],
    fn: int,
    window_ms: int,
    by: Sequence[str],
    start_ms: int,
    end_ms: int,
    step_ms: int,
    across: int = pb.ACROSS_SUM,
) -> tuple[list[int], dict[Key, list[float]]]:
    """The same per group at start, start + step, ... <= end; NaN where a group has no value."""
    resp = await backend.aggregate(_request(matchers, fn, window_ms, by, across, start_ms, end_ms, step_ms))
    times = list(resp.timestamps)
    n = len(times)
    values = list(resp.values)
    return times, {_key(group, by): values[g * n:(g + 1) * n] for g, group in enumerate(resp.groups)}


@dataclass(frozen=True)
class HourRollup:
    """One series' hourly rollups; labels as a dict."""

    labels: dict[str, str]
    hours: list[int]
    min: list[float]
    max: list[float]
    sum: list[float]
    count: list[float]
    last: list[float]


async def rollups(backend: MetricsBackend, matchers: Sequence[pb.Matcher], start_ms: int, end_ms: int
                  ) -> list[HourRollup]:
    """Hourly rollups of every matching series for hours starting in [start_ms, end_ms]."""
    req = pb.ReadRequest(start_ms=start_ms, end_ms=end_ms)
    req.matchers.extend(matchers)
    resp = await backend.rollups(req)
    return [HourRollup({lab.name: lab.value for lab in s.labels}, list(s.hours), list(s.min), list(s.max),
                       list(s.sum), list(s.count), list(s.last)) for s in resp.series]


def hour_rate(lo: float, hi: float, count: float, last: float) -> float | None:
    """A counter's mean per-second rate over one hour from its rollup, or None when it cannot be told.

    With `count` samples spread evenly over the hour, the first and last are (count - 1) / count of
    an hour apart, and a counter's min and max are its first and last readings. A reset inside the
    hour (its last reading below its max) makes the increase unknowable from the rollup: None.
    """
    if count < 2 or math.isnan(lo) or math.isnan(hi):
        return None
    if not math.isnan(last) and last < hi:
        return None
    return max(0.0, hi - lo) * count / ((count - 1) * 3600.0)
