"""What the HPA controller asks metricsd each sync: the target's pods, each metric per pod, the
same hour yesterday for the history fallback, and the hourly demand a predictive HPA forecasts from.

The pods of a target are those whose `kube_pod_container_resource_requests` series carry the
target's namespace and `workload` label and have a sample in the last two minutes (a stale marker
ends a pod at once). Per-pod values are Aggregates grouped by pod: the CPU usage rate over one
minute (about what metrics-server reports), the last memory working set, the last value of a Pods
metric (its rate when the name ends in `_total`, as custom-metrics adapters report counters).
metricsd knows no readiness, so every reporting pod is taken as Running and Ready.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from metricsd.consumers.hpa.replicas import HistoryPoint, MetricObservation, PodSample
from metricsd.consumers.hpa.spec import HPASpec, MetricSpec
from metricsd.consumers.queries import (
    CPU_USAGE,
    REQUESTS,
    WORKING_SET,
    HourRollup,
    eq,
    group_instant,
    hour_rate,
    rollups,
)
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest, MetricsBackend, Unavailable

__all__ = ["HPAObserver", "ObserveSettings", "hourly_demand"]

_HOUR_MS = 3_600_000
_DAY_MS = 86_400_000
# Rollups are kept eight days: a predictive HPA reads all of them.
_DEMAND_DAYS = 8


@dataclass(frozen=True)
class ObserveSettings:
    """rate_window_ms: the window of CPU and counter rates; last_window_ms: how old a gauge's last
    sample may be (requests, working set, Pods metrics) before the pod counts as not reporting."""

    rate_window_ms: int = 60_000
    last_window_ms: int = 120_000
    # How long after an hour ends its rollup is read for the forecast (late samples still arrive).
    demand_settle_ms: int = 120_000


def _is_counter(name: str) -> bool:
    return name.endswith("_total")


class HPAObserver:
    """Gathers one sync's inputs; caches yesterday's hours, which do not change once closed."""

    def __init__(self, backend: MetricsBackend, settings: ObserveSettings | None = None) -> None:
        self.backend = backend
        self.settings = settings or ObserveSettings()
        self._yesterday: dict[tuple[str, str, int], HistoryPoint | None] = {}
        self._demand: dict[tuple[str, str], tuple[int, dict[int, float]]] = {}

    @staticmethod
    def _workload(spec: HPASpec) -> list[pb.Matcher]:
        return [eq("namespace", spec.namespace), eq("workload", spec.scale_target_ref.name)]

    async def pods(self, spec: HPASpec, now_ms: int) -> list[str]:
        """The target's pods now. Raises Unavailable or BadRequest."""
        found = await group_instant(self.backend, [eq("__name__", REQUESTS), *self._workload(spec)],
                                    pb.SERIES_LAST, self.settings.last_window_ms, ["pod"], now_ms, pb.ACROSS_COUNT)
        return sorted(k[0] for k in found)

    async def observe(self, spec: HPASpec, metric: MetricSpec, now_ms: int) -> MetricObservation:
        """One metric's observation; a failed query gives available=False rather than an exception."""
        yesterday = None
        if spec.metricsd.history_fallback.enabled:
            yesterday = await self._history(spec, metric, now_ms)
        try:
            if metric.type in ("Resource", "ContainerResource"):
                return await self._resource(spec, metric, now_ms, yesterday)
            if metric.type == "Pods":
                samples = await self._per_pod(self._pods_matchers(spec, metric), metric.name, now_ms)
                return MetricObservation(samples={p: PodSample(v) for p, v in samples.items()}, yesterday=yesterday)
            total = await group_instant(self.backend, self._external_matchers(metric), self._fn(metric.name),
                                        self._window(metric.name), [], now_ms)
            return MetricObservation(external=tuple(total.values()), yesterday=yesterday)
        except (Unavailable, BadRequest):
            return MetricObservation(available=False, yesterday=yesterday)

    def _fn(self, name: str) -> int:
        return pb.SERIES_RATE if _is_counter(name) else pb.SERIES_LAST

    def _window(self, name: str) -> int:
        return self.settings.rate_window_ms if _is_counter(name) else self.settings.last_window_ms

    def _resource_matchers(self, spec: HPASpec, metric: MetricSpec, name: str) -> list[pb.Matcher]:
        out = [eq("__name__", name), *self._workload(spec)]
        if metric.container:
            out.append(eq("container", metric.container))
        return out

    def _pods_matchers(self, spec: HPASpec, metric: MetricSpec) -> list[pb.Matcher]:
        return [eq("__name__", metric.name), *self._workload(spec),
                *(eq(k, v) for k, v in sorted(metric.selector.items()))]

    @staticmethod
    def _external_matchers(metric: MetricSpec) -> list[pb.Matcher]:
        return [eq("__name__", metric.name), *(eq(k, v) for k, v in sorted(metric.selector.items()))]

    async def _per_pod(self, matchers: list[pb.Matcher], name: str, now_ms: int) -> dict[str, float]:
        found = await group_instant(self.backend, matchers, self._fn(name), self._window(name), ["pod"], now_ms)
        return {k[0]: v for k, v in found.items()}

    async def _resource(self, spec: HPASpec, metric: MetricSpec, now_ms: int,
                        yesterday: HistoryPoint | None) -> MetricObservation:
        usage_name = CPU_USAGE if metric.name == "cpu" else WORKING_SET
        usage = await self._per_pod(self._resource_matchers(spec, metric, usage_name), usage_name, now_ms)
        req_matchers = [*self._resource_matchers(spec, metric, REQUESTS), eq("resource", metric.name)]
        requests = await group_instant(self.backend, req_matchers, pb.SERIES_LAST, self.settings.last_window_ms,
                                       ["pod"], now_ms)
        return MetricObservation(samples={p: PodSample(v) for p, v in usage.items()},
                                 requests={k[0]: v for k, v in requests.items()}, yesterday=yesterday)

    async def demand(self, spec: HPASpec, metric: MetricSpec, now_ms: int) -> dict[int, float]:
        """The workload's demand per closed hour (hour start ms -> mean total over its pods) over the
        last eight days. Closed hours do not change, so only hours not asked for yet are read.
        Raises Unavailable or BadRequest (and keeps what it had)."""
        key = (f"{spec.namespace}/{spec.name}", metric.key)
        last = (now_ms - self.settings.demand_settle_ms) // _HOUR_MS * _HOUR_MS - _HOUR_MS
        first = last - _DEMAND_DAYS * _DAY_MS + _HOUR_MS
        through, hours = self._demand.get(key, (first - _HOUR_MS, {}))
        if through >= last:
            return hours
        start = max(through + _HOUR_MS, first)
        if metric.type == "Pods":
            matchers, name = self._pods_matchers(spec, metric), metric.name
        else:
            name = CPU_USAGE if metric.name == "cpu" else WORKING_SET
            matchers = self._resource_matchers(spec, metric, name)
        fresh = hourly_demand(await rollups(self.backend, matchers, start, last), _is_counter(name))
        kept = {h: v for h, v in hours.items() if h >= first}
        kept.update(fresh)
        self._demand[key] = (last, kept)
        return kept

    async def _history(self, spec: HPASpec, metric: MetricSpec, now_ms: int) -> HistoryPoint | None:
        hour = (now_ms - _DAY_MS) // _HOUR_MS * _HOUR_MS
        key = (f"{spec.namespace}/{spec.name}", metric.key, hour)
        if key in self._yesterday:
            return self._yesterday[key]
        try:
            point = await self._history_point(spec, metric, hour)
        except (Unavailable, BadRequest):
            return None  # not cached: ask again next sync
        if len(self._yesterday) > 256:
            self._yesterday.clear()
        self._yesterday[key] = point
        return point

    async def _history_point(self, spec: HPASpec, metric: MetricSpec, hour: int) -> HistoryPoint | None:
        """The metric over yesterday's hour: the mean rate of counters, the mean of gauges."""
        if metric.type == "External":
            series = await rollups(self.backend, self._external_matchers(metric), hour, hour)
            values = [v for s in series if (v := _hour_value(s, metric.name)) is not None]
            return HistoryPoint(sum(values)) if values else None
        if metric.type == "Pods":
            per_pod = _per_pod(await rollups(self.backend, self._pods_matchers(spec, metric), hour, hour),
                               metric.name)
            return HistoryPoint(sum(per_pod.values()) / len(per_pod), len(per_pod)) if per_pod else None
        usage_name = CPU_USAGE if metric.name == "cpu" else WORKING_SET
        usage = _per_pod(await rollups(self.backend, self._resource_matchers(spec, metric, usage_name), hour, hour),
                         usage_name)
        req_matchers = [*self._resource_matchers(spec, metric, REQUESTS), eq("resource", metric.name)]
        requests = _per_pod(await rollups(self.backend, req_matchers, hour, hour), REQUESTS)
        pods = sorted(set(usage) & set(requests))
        if not pods:
            return None
        used = sum(usage[p] for p in pods)
        if metric.target.type == "Utilization":
            asked = sum(requests[p] for p in pods)
            return HistoryPoint(100.0 * used / asked, len(pods)) if asked > 0 else None
        return HistoryPoint(used / len(pods), len(pods))


def _hour_value(s: HourRollup, name: str) -> float | None:
    if not s.hours:
        return None
    if _is_counter(name):
        return hour_rate(s.min[0], s.max[0], s.count[0], s.last[0])
    if name == REQUESTS:
        return s.last[0] if not math.isnan(s.last[0]) else s.max[0]
    return s.sum[0] / s.count[0] if s.count[0] > 0 else None


def _per_pod(series: list[HourRollup], name: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for s in series:
        value = _hour_value(s, name)
        if value is not None:
            out[s.labels.get("pod", "")] += value
    return dict(out)


def hourly_demand(series: list[HourRollup], counter: bool) -> dict[int, float]:
    """The total over all series per hour: a counter's mean rate (`hour_rate`), a gauge's mean.

    A gauge series present for part of an hour adds its sum over the samples an hour holds (the most
    any series has that hour), so a pod that ran ten minutes adds a sixth of its level, as it did to
    the hour's mean total. An hour no series could tell is left out, not zero.
    """
    totals: dict[int, float] = defaultdict(float)
    if counter:
        for s in series:
            for i, hour in enumerate(s.hours):
                rate = hour_rate(s.min[i], s.max[i], s.count[i], s.last[i])
                if rate is not None:
                    totals[hour] += rate
        return dict(totals)
    full: dict[int, float] = defaultdict(float)
    for s in series:
        for i, hour in enumerate(s.hours):
            full[hour] = max(full[hour], s.count[i])
    for s in series:
        for i, hour in enumerate(s.hours):
            if s.count[i] > 0 and not math.isnan(s.sum[i]):
                totals[hour] += s.sum[i] / full[hour]
    return dict(totals)
