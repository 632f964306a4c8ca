"""Overcommit advice from hourly rollups: three pure functions, no I/O, time passed in.

- Service level: a container's request should cover its highest hourly peak of the last week
  plus a buffer; anything above that is reclaimable, summed per workload, namespace and cluster.
- Node level: what offline (best-effort) work may borrow now, as Koordinator's batch resources do:
  capacity * threshold (CPU 60%, memory 65%) - usage of the pods that are not best-effort -
  system usage, floored at zero.
- Tidal table: per hour of the day over the last week, cluster capacity minus that hour's peak
  online usage minus a margin: which hours can lend how much.

Inputs are the hourly rollups (hour start in ms, the hour's max) that the store keeps for eight
days; CPU is in cores, memory in bytes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "DEFAULT_THRESHOLDS",
    "ContainerSeries",
    "HourlyPoint",
    "NodeUsage",
    "PodUsage",
    "ReclaimSummary",
    "RequestRecommendation",
    "TidalRow",
    "borrowable",
    "recommend_requests",
    "tidal_table",
]

Resource = Literal["cpu", "memory"]
HOUR_MS = 3_600_000
WEEK_MS = 7 * 24 * HOUR_MS
# Koordinator's defaults: cpuReclaimThresholdPercent 60, memoryReclaimThresholdPercent 65.
DEFAULT_THRESHOLDS: Mapping[str, float] = {"cpu": 0.60, "memory": 0.65}


@dataclass(frozen=True)
class HourlyPoint:
    hour_start_ms: int
    max: float


@dataclass(frozen=True)
class ContainerSeries:
    """One pod's container: its request and the hourly peaks of its usage of one resource."""

    namespace: str
    workload: str
    pod: str
    container: str
    resource: Resource
    request: float
    hourly: Sequence[HourlyPoint]


@dataclass(frozen=True)
class RequestRecommendation:
    """Per (namespace, workload, container, resource): the request to set and what it frees.

    reclaimable is summed over the workload's pods and negative when the pods need more than they
    request (the recommendation then raises the request).
    """

    namespace: str
    workload: str
    container: str
    resource: Resource
    pods: int
    weekly_peak: float
    recommended: float
    requested_total: float
    reclaimable: float


@dataclass(frozen=True)
class ReclaimSummary:
    by_workload: Mapping[tuple[str, str, str], float] = field(default_factory=dict)
    by_namespace: Mapping[tuple[str, str], float] = field(default_factory=dict)
    cluster: Mapping[str, float] = field(default_factory=dict)


def _in_window(points: Sequence[HourlyPoint], now_ms: int, window_ms: int) -> list[HourlyPoint]:
    return [p for p in points if now_ms - window_ms <= p.hour_start_ms < now_ms]


def recommend_requests(
    series: Sequence[ContainerSeries], now_ms: int, buffer: float = 0.15, window_ms: int = WEEK_MS
) -> tuple[tuple[RequestRecommendation, ...], ReclaimSummary]:
    """Recommended request = the highest hourly peak of the window across the workload's pods * (1 + buffer).

    Containers without a point in the window get no recommendation (nothing is known about them).
    Results are sorted by namespace, workload, container, resource.
    """
    groups: dict[tuple[str, str, str, str], list[ContainerSeries]] = defaultdict(list)
    for s in series:
        groups[(s.namespace, s.workload, s.container, s.resource)].append(s)
    recs: list[RequestRecommendation] = []
    by_workload: dict[tuple[str, str, str], float] = defaultdict(float)
    by_namespace: dict[tuple[str, str], float] = defaultdict(float)
    cluster: dict[str, float] = defaultdict(float)
    for key in sorted(groups):
        members = groups[key]
        peaks = [p.max for s in members for p in _in_window(s.hourly, now_ms, window_ms)]
        if not peaks:
            continue
        ns, workload, container, resource = key
        peak = max(peaks)
        recommended = peak * (1.0 + buffer)
        requested = sum(s.request for s in members)
        reclaimable = requested - recommended * len(members)
        recs.append(RequestRecommendation(ns, workload, container, resource, len(members),  # type: ignore[arg-type]
                                          peak, recommended, requested, reclaimable))
        by_workload[(ns, workload, resource)] += reclaimable
        by_namespace[(ns, resource)] += reclaimable
        cluster[resource] += reclaimable
    return tuple(recs), ReclaimSummary(dict(by_workload), dict(by_namespace), dict(cluster))


@dataclass(frozen=True)
class PodUsage:
    name: str
    usage: Mapping[str, float]
    best_effort: bool = False


@dataclass(frozen=True)
class NodeUsage:
    name: str
    capacity: Mapping[str, float]
    pods: Sequence[PodUsage] = ()
    system_usage: Mapping[str, float] = field(default_factory=dict)


def borrowable(node: NodeUsage, thresholds: Mapping[str, float] = DEFAULT_THRESHOLDS) -> dict[str, float]:
    """What best-effort work may use on this node now, per resource in `thresholds`.

    Best-effort pods' own usage does not count against it: they are the borrowers.
    """
    out: dict[str, float] = {}
    for resource, threshold in thresholds.items():
        online = sum(p.usage.get(resource, 0.0) for p in node.pods if not p.best_effort)
        system = node.system_usage.get(resource, 0.0)
        out[resource] = max(0.0, node.capacity.get(resource, 0.0) * threshold - online - system)
    return out


@dataclass(frozen=True)
class TidalRow:
    """One hour of the (local) day: the week's peak online usage then, and what can be lent.

    lendable is None for a resource with no data in that hour: unknown is not the same as zero.
    """

    hour: int
    peak_usage: Mapping[str, float | None]
    lendable: Mapping[str, float | None]


def tidal_table(
    capacity: Mapping[str, float],
    online_hourly: Mapping[str, Sequence[HourlyPoint]],
    now_ms: int,
    margin: float = 0.1,
    utc_offset_minutes: int = 0,
    window_ms: int = WEEK_MS,
) -> tuple[TidalRow, ...]:
    """24 rows: for each hour of the day, capacity - the window's peak online usage in that hour - margin.

    online_hourly holds the cluster's online (non-best-effort) usage per resource as hourly peaks;
    margin is a fraction of capacity held back. Hours are local to `utc_offset_minutes`.
    """
    peaks: dict[str, list[float | None]] = {}
    for resource, points in online_hourly.items():
        by_hour: list[float | None] = [None] * 24
        for p in _in_window(points, now_ms, window_ms):
            hour = ((p.hour_start_ms // 60_000 + utc_offset_minutes) // 60) % 24
            current = by_hour[hour]
            by_hour[hour] = p.max if current is None else max(current, p.max)
        peaks[resource] = by_hour
    rows: list[TidalRow] = []
    for hour in range(24):
        peak_usage: dict[str, float | None] = {}
        lendable: dict[str, float | None] = {}
        for resource, cap in capacity.items():
            peak = peaks.get(resource, [None] * 24)[hour]
            peak_usage[resource] = peak
            lendable[resource] = None if peak is None else max(0.0, cap - peak - margin * cap)
        rows.append(TidalRow(hour, peak_usage, lendable))
    return tuple(rows)
