"""The overcommit advisor loop: weekly hourly peaks from the rollups, node capacity and usage now,
through the pure `advisor` functions; the advice is recorded and published, never applied.

Hourly peaks: memory uses the hour's maximum working set. CPU is a counter, whose rollup keeps
its first and last readings of the hour, so its "peak" is the hour's mean rate: a peak inside
the hour would need raw samples, which the store keeps for a day only. The cluster's online
usage per hour (for the tidal table) is the sum over online containers of those values, which
for memory over-counts a little (peaks of different containers need not coincide): the table
errs on the side of lending less. A container counts as online when it has a request; pods with
no requests at all are best-effort, the borrowers.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import asdict
from typing import Any

from metricsd.clock import Clock
from metricsd.consumers.actuators.base import Actuator, ActuatorError
from metricsd.consumers.history import DecisionLog, iso_time
from metricsd.consumers.overcommit.advisor import (
    ContainerSeries,
    HourlyPoint,
    NodeUsage,
    PodUsage,
    borrowable,
    recommend_requests,
    tidal_table,
)
from metricsd.consumers.overcommit.config import OvercommitConfig
from metricsd.consumers.queries import (
    CPU_USAGE,
    NODE_CAPACITY,
    REQUESTS,
    WORKING_SET,
    HourRollup,
    eq,
    group_instant,
    hour_rate,
    rollups,
)
from metricsd.consumers.wording import reclaimable_words
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest, MetricsBackend, Unavailable

__all__ = ["OvercommitController"]

log = logging.getLogger("metricsd.consumers.overcommit")
_HOUR_MS = 3_600_000
_DAY_MS = 86_400_000


def _hourly(s: HourRollup, cpu: bool) -> list[HourlyPoint]:
    out = []
    for i, hour in enumerate(s.hours):
        value = hour_rate(s.min[i], s.max[i], s.count[i], s.last[i]) if cpu else s.max[i]
        if value is not None:
            out.append(HourlyPoint(hour, value))
    return out


class OvercommitController:
    """Not safe to share across event loops; `sync_once` must not run concurrently with itself."""

    name = "overcommit"

    def __init__(self, config: OvercommitConfig, backend: MetricsBackend, actuator: Actuator, clock: Clock,
                 history: int = 50) -> None:
        self.config = config
        self.backend = backend
        self.actuator = actuator
        self.clock = clock
        self.log = DecisionLog(history)
        self.syncs = 0
        self.errors = 0
        self.last: dict[str, Any] | None = None

    @property
    def interval_s(self) -> float:
        return self.config.interval_s

    def _scope(self, name: str) -> list[pb.Matcher]:
        out = [eq("__name__", name)]
        if self.config.namespaces:
            pattern = "|".join(self.config.namespaces)
            out.append(pb.Matcher(type=pb.Matcher.RE, name="namespace", value=pattern))
        return out

    async def sync_once(self) -> dict[str, Any]:
        now_ms = self.clock.now_ms()
        self.syncs += 1
        try:
            entry = await self._advise(now_ms)
        except (Unavailable, BadRequest) as e:
            self.errors += 1
            entry = {"time": iso_time(now_ms), "timeMs": now_ms, "consumer": "overcommit",
                     "advisor": self.config.name, "inputs": {}, "rule": "Unavailable",
                     "message": f"cannot read the metrics now: {e}", "result": {"errors": [str(e)]}}
            self.last = self.log.record(entry)
            return self.last
        self.last = self.log.record(entry)
        try:
            await self.actuator.publish("overcommit.advice", self.last)
        except ActuatorError as e:
            self.last["result"]["errors"].append(f"publishing: {e}")
        return self.last

    async def _advise(self, now_ms: int) -> dict[str, Any]:
        cfg = self.config
        window_ms = cfg.window_days * _DAY_MS
        first_hour = (now_ms - window_ms) // _HOUR_MS * _HOUR_MS
        cpu_hours = await rollups(self.backend, self._scope(CPU_USAGE), first_hour, now_ms)
        mem_hours = await rollups(self.backend, self._scope(WORKING_SET), first_hour, now_ms)
        by = ["namespace", "workload", "pod", "container", "node", "resource"]
        requests = await group_instant(self.backend, self._scope(REQUESTS), pb.SERIES_LAST, 5 * 60_000, by, now_ms)
        req = {(ns, pod, c, res): v for (ns, _wl, pod, c, _node, res), v in requests.items()}

        series: list[ContainerSeries] = []
        online_hourly: dict[str, dict[int, float]] = {"cpu": defaultdict(float), "memory": defaultdict(float)}
        for resource, found in (("cpu", cpu_hours), ("memory", mem_hours)):
            for s in found:
                lab = s.labels
                key = (lab.get("namespace", ""), lab.get("pod", ""), lab.get("container", ""), resource)
                if key not in req:
                    continue
                points = _hourly(s, resource == "cpu")
                series.append(ContainerSeries(key[0], lab.get("workload", "") or key[1], key[1], key[2],
                                              resource, req[key], points))  # type: ignore[arg-type]
                for p in points:
                    online_hourly[resource][p.hour_start_ms] += p.max
        recs, summary = recommend_requests(series, now_ms, cfg.buffer, window_ms)

        nodes = await self._nodes(now_ms)
        node_rows = [{"node": n.name, "capacity": n.capacity, "borrowable": borrowable(n, cfg.thresholds),
                      "onlinePods": sum(1 for p in n.pods if not p.best_effort)} for n in nodes]
        capacity = {res: sum(n.capacity.get(res, 0.0) for n in nodes) for res in ("cpu", "memory")}
        hourly = {res: [HourlyPoint(h, v) for h, v in sorted(points.items())] for res, points in online_hourly.items()}
        tidal = tidal_table(capacity, hourly, now_ms, cfg.tidal_margin, cfg.utc_offset_minutes, window_ms)
        best = max((r for r in tidal if r.lendable.get("cpu") is not None),
                   key=lambda r: r.lendable.get("cpu") or 0.0, default=None)
        hours_seen = len({p.hour_start_ms for s in series for p in s.hourly})
        cluster = summary.cluster
        message = (f"{reclaimable_words({'cpu': cluster.get('cpu', 0.0), 'memory': cluster.get('memory', 0.0)})} "
                   f"over {len(recs)} workload containers; {hours_seen} hours of history")
        if best is not None:
            message += f"; most to lend at {best.hour:02d}:00 ({best.lendable['cpu']:.1f} cores)"
        return {
            "time": iso_time(now_ms), "timeMs": now_ms, "consumer": "overcommit", "advisor": cfg.name,
            "inputs": {"containers": len(series), "nodes": len(nodes), "hoursOfHistory": hours_seen,
                       "windowDays": cfg.window_days, "buffer": cfg.buffer, "thresholds": dict(cfg.thresholds)},
            "rule": "Advised" if recs else "NoHistory", "message": message,
            "result": {
                "requests": [asdict(r) for r in recs],
                "reclaimable": {
                    "cluster": dict(summary.cluster),
                    "byNamespace": [{"namespace": ns, "resource": res, "amount": v}
                                    for (ns, res), v in sorted(summary.by_namespace.items())],
                    "byWorkload": [{"namespace": ns, "workload": wl, "resource": res, "amount": v}
                                   for (ns, wl, res), v in sorted(summary.by_workload.items())],
                },
                "nodes": node_rows,
                "tidal": [{"hour": r.hour, "peakUsage": dict(r.peak_usage), "lendable": dict(r.lendable)}
                          for r in tidal],
                "capacity": capacity,
                "errors": [],
            },
        }

    async def _nodes(self, now_ms: int) -> list[NodeUsage]:
        """Each node's capacity and the usage of the pods on it now, in every namespace."""
        with_requests = await group_instant(self.backend, [eq("__name__", REQUESTS)], pb.SERIES_LAST, 5 * 60_000,
                                            ["namespace", "pod"], now_ms, pb.ACROSS_COUNT)
        online_pods = set(with_requests)
        caps = await group_instant(self.backend, [eq("__name__", NODE_CAPACITY)], pb.SERIES_LAST, 5 * 60_000,
                                   ["node", "resource"], now_ms)
        by = ["node", "namespace", "pod"]
        cpu = await group_instant(self.backend, [eq("__name__", CPU_USAGE)], pb.SERIES_RATE, 2 * 60_000, by, now_ms)
        mem = await group_instant(self.backend, [eq("__name__", WORKING_SET)], pb.SERIES_LAST, 2 * 60_000, by,
                                  now_ms)
        capacity: dict[str, dict[str, float]] = defaultdict(dict)
        for (node, res), v in caps.items():
            capacity[node][res] = v
        pods: dict[str, dict[tuple[str, str], dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
        for res, found in (("cpu", cpu), ("memory", mem)):
            for (node, ns, pod), v in found.items():
                pods[node][(ns, pod)][res] = v
        return [NodeUsage(node, cap, [PodUsage(f"{ns}/{pod}", usage, (ns, pod) not in online_pods)
                                      for (ns, pod), usage in sorted(pods.get(node, {}).items())])
                for node, cap in sorted(capacity.items())]

    def history(self) -> list[dict[str, Any]]:
        return self.log.entries()

    def status(self) -> dict[str, Any]:
        last = self.last or {}
        return {"consumer": "overcommit", "backend": self.actuator.name, "intervalSeconds": self.interval_s,
                "advisor": self.config.name, "decisions": self.log.recorded, "syncs": self.syncs,
                "errors": self.errors, "rule": last.get("rule"), "message": last.get("message"),
                "lastSync": last.get("time"), "latest": last.get("result")}
