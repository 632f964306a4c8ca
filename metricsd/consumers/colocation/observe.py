"""What the colocation plan reads from the metrics: the nodes and the pods on them now, each pool's
online demand by hour yesterday, the HPAs' planned replicas, and the surge services' load.

Online pods are pods with requests; pods without are best-effort, the offline borrowers. A pod's
demand in an hour is the larger of its CPU requests (the scheduler places by requests) and its
mean CPU usage (a counter's rollup yields the hour's mean rate, see `queries.hour_rate`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence

from metricsd.consumers.colocation.forecast import DAY_MS, HOUR_MS, ReplicaCurve
from metricsd.consumers.colocation.machine import NodeObservation
from metricsd.consumers.colocation.spec import CurveSpec
from metricsd.consumers.hpa.schedule import effective_limits
from metricsd.consumers.hpa.spec import HPASpec
from metricsd.consumers.queries import CPU_USAGE, NODE_CAPACITY, REQUESTS, eq, group_instant, hour_rate, rollups
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import MetricsBackend

__all__ = ["ColocationObserver", "Yesterday", "planned_curve"]



def _nodes_matcher(nodes: Sequence[str]) -> pb.Matcher:
    return pb.Matcher(type=pb.Matcher.RE, name="node", value="|".join(re.escape(n) for n in sorted(nodes)) or "$^")


class Yesterday:
    """Per (namespace, pod): the pod's node, and its demand and whether it was online, per hour start."""

    def __init__(self) -> None:
        self.node: dict[tuple[str, str], str] = {}
        self.usage: dict[tuple[str, str], dict[int, float]] = defaultdict(lambda: defaultdict(float))
        self.requests: dict[tuple[str, str], dict[int, float]] = defaultdict(lambda: defaultdict(float))

    def pool_demand(self, nodes: set[str]) -> dict[int, float]:
        """The online pods on these nodes, hour by hour: sum over pods of max(requests, usage)."""
        out: dict[int, float] = defaultdict(float)
        for key, req in self.requests.items():
            if self.node.get(key) not in nodes:
                continue
            use = self.usage.get(key, {})
            for hour, cores in req.items():
                out[hour] += max(cores, use.get(hour, 0.0))
        return dict(out)


def planned_curve(curve: CurveSpec, hpa: HPASpec | None, past: Mapping[int, int], hours: Sequence[int]
                  ) -> ReplicaCurve:
    """Per hour: the larger of the HPA's scheduled floor in that hour (checked every 5 minutes) and
    the replicas it ran the same hour yesterday; hours neither knows are left out."""
    replicas: dict[int, int] = {}
    for hour in hours:
        values = []
        if hpa is not None:
            values.append(max(effective_limits(hpa, (hour + m * 60_000) / 1000).min_replicas for m in range(0, 60, 5)))
        if hour - DAY_MS in past:
            values.append(past[hour - DAY_MS])
        if values:
            replicas[hour] = max(values)
    return ReplicaCurve(f"{curve.namespace}/{curve.hpa}", replicas, curve.cores_per_replica * curve.share)


class ColocationObserver:
    """rate_window_ms must hold two samples of the agents' interval; last_window_ms is how old a
    capacity or request reading may be and still count as now."""

    def __init__(self, backend: MetricsBackend, rate_window_ms: int = 2 * 60_000, last_window_ms: int = 5 * 60_000
                 ) -> None:
        self.backend = backend
        self.rate_window_ms = rate_window_ms
        self.last_window_ms = last_window_ms

    async def nodes(self, now_ms: int) -> dict[str, NodeObservation]:
        """Every node with a CPU capacity now, and its online and offline pod counts. Raises Unavailable."""
        caps = await group_instant(self.backend, [eq("__name__", NODE_CAPACITY), eq("resource", "cpu")],
                                   pb.SERIES_LAST, self.last_window_ms, ["node"], now_ms)
        with_requests = await group_instant(self.backend, [eq("__name__", REQUESTS)], pb.SERIES_LAST,
                                            self.last_window_ms, ["namespace", "pod"], now_ms, pb.ACROSS_COUNT)
        running = await group_instant(self.backend, [eq("__name__", CPU_USAGE)], pb.SERIES_RATE, self.rate_window_ms,
                                      ["node", "namespace", "pod"], now_ms, pb.ACROSS_COUNT)
        online: dict[str, int] = defaultdict(int)
        offline: dict[str, int] = defaultdict(int)
        for node, ns, pod in running:
            if (ns, pod) in with_requests:
                online[node] += 1
            else:
                offline[node] += 1
        return {node: NodeObservation(node, cap, online[node], offline[node])
                for (node,), cap in sorted(caps.items()) if node}

    async def yesterday(self, nodes: Sequence[str], now_ms: int, hours: int) -> Yesterday:
        """Rollups of the hours from 24 h before the current hour, `hours` of them. Raises Unavailable."""
        first = now_ms // HOUR_MS * HOUR_MS - DAY_MS
        last = first + (hours - 1) * HOUR_MS
        out = Yesterday()
        scope = _nodes_matcher(nodes)
        for s in await rollups(self.backend, [eq("__name__", REQUESTS), eq("resource", "cpu"), scope], first, last):
            key = (s.labels.get("namespace", ""), s.labels.get("pod", ""))
            out.node[key] = s.labels.get("node", "")
            for i, hour in enumerate(s.hours):
                out.requests[key][hour] += s.max[i]
        for s in await rollups(self.backend, [eq("__name__", CPU_USAGE), scope], first, last):
            key = (s.labels.get("namespace", ""), s.labels.get("pod", ""))
            out.node.setdefault(key, s.labels.get("node", ""))
            for i, hour in enumerate(s.hours):
                rate = hour_rate(s.min[i], s.max[i], s.count[i], s.last[i])
                if rate is not None:
                    out.usage[key][hour] += rate
        return out

    async def workload_cores(self, namespace: str, workload: str, now_ms: int) -> float | None:
        """The workload's CPU use now, in cores; None when it has no data. Raises Unavailable."""
        found = await group_instant(self.backend, [eq("__name__", CPU_USAGE), eq("namespace", namespace),
                                                   eq("workload", workload)], pb.SERIES_RATE, self.rate_window_ms,
                                    [], now_ms)
        return found.get((), None)

    async def workload_replicas_yesterday(self, namespace: str, workload: str, now_ms: int, hours: int
                                          ) -> dict[int, int]:
        """Pods of the workload with requests, per hour, over the same hours yesterday (any node)."""
        first = now_ms // HOUR_MS * HOUR_MS - DAY_MS
        found = await rollups(self.backend, [eq("__name__", REQUESTS), eq("resource", "cpu"),
                                             eq("namespace", namespace), eq("workload", workload)],
                              first, first + (hours - 1) * HOUR_MS)
        pods: dict[int, set[str]] = defaultdict(set)
        for s in found:
            for hour in s.hours:
                pods[hour].add(s.labels.get("pod", ""))
        return {hour: len(names) for hour, names in pods.items()}
