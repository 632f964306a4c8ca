"""Online demand by hour for one pool, and what that leaves to lend: pure, hours as UTC hour starts.

A pool's forecast for an hour is the larger of two lower bounds on what its online pods will need:
the same hour yesterday (the pool's online pods' CPU then, each pod counted at the larger of its
request and its usage, because the scheduler places pods by requests), and today's planned replica
curves (an HPA's replicas in that hour times the cores one replica requests). An hour neither
source knows is unknown (None), and an unknown hour lends nothing: missing data is not idle nodes.
A curve raises an hour yesterday knows but cannot make an unknown hour known: it speaks for its
own workload only, not for the other online pods on the pool.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["HOUR_MS", "ReplicaCurve", "TableRow", "hourly_forecast", "nodes_needed", "peak_need", "time_share"]

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


@dataclass(frozen=True)
class ReplicaCurve:
    """A workload's planned replicas per UTC hour start, and the cores each replica takes on the pool
    (its request times the share of its pods that run there)."""

    name: str
    replicas: Mapping[int, int]
    cores_per_replica: float


def hourly_forecast(hours: Sequence[int], yesterday: Mapping[int, float], curves: Sequence[ReplicaCurve] = ()
                    ) -> dict[int, float | None]:
    """Forecast cores for each hour start in `hours`; `yesterday` is keyed by its own hour starts
    (hour - 24 h). Curves of several workloads on one pool add up."""
    out: dict[int, float | None] = {}
    for hour in hours:
        past = yesterday.get(hour - DAY_MS)
        if past is None or not math.isfinite(past):
            out[hour] = None
            continue
        planned = sum(c.replicas[hour] * c.cores_per_replica for c in curves if hour in c.replicas)
        out[hour] = max(past, planned)
    return out


def peak_need(forecast: Mapping[int, float | None], start_ms: int, end_ms: int, margin: float) -> float:
    """The largest forecast * (1 + margin) over the hours that overlap [start_ms, end_ms]; infinity
    when any of them is unknown."""
    peak = 0.0
    hour = start_ms // HOUR_MS * HOUR_MS
    while hour <= end_ms:
        value = forecast.get(hour)
        if value is None:
            return math.inf
        peak = max(peak, value * (1.0 + margin))
        hour += HOUR_MS
    return peak


def nodes_needed(capacities: Sequence[float], need: float, keep_online: int = 0) -> int:
    """The fewest nodes (largest first) whose capacity covers `need`, at least keep_online; all of
    them when even all cannot."""
    total = 0.0
    ordered = sorted(capacities, reverse=True)
    for i, cap in enumerate(ordered):
        if total >= need and i >= keep_online:
            return i
        total += cap
    return len(ordered)


@dataclass(frozen=True)
class TableRow:
    """One hour of one pool's time-share table: what online needs then and what can be lent."""

    pool: str
    hour_start_ms: int
    local_hour: int
    forecast_cores: float | None
    need_cores: float | None
    capacity_cores: float
    nodes: int
    nodes_online: int
    nodes_lendable: int
    cores_lendable: float


def time_share(pool: str, capacities: Sequence[float], forecast: Mapping[int, float | None], first_hour_ms: int,
               margin: float, keep_online: int = 0, hours: int = 24, utc_offset_minutes: int = 0
               ) -> list[TableRow]:
    """`hours` rows from first_hour_ms: which hours can lend how many nodes and cores. The nodes
    lent are the smallest ones (the largest stay online, so fewer stay)."""
    rows: list[TableRow] = []
    ordered = sorted(capacities, reverse=True)
    for i in range(hours):
        hour = first_hour_ms + i * HOUR_MS
        value = forecast.get(hour)
        need = None if value is None else value * (1.0 + margin)
        online = len(ordered) if need is None else nodes_needed(ordered, need, keep_online)
        local = ((hour // 60_000 + utc_offset_minutes) // 60) % 24
        rows.append(TableRow(pool, hour, local, value, need, sum(ordered), len(ordered), online,
                             len(ordered) - online, sum(ordered[online:])))
    return rows
