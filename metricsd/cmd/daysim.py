"""A simulated day for the HPA: a store in this process, a tidal load, and a replica count that the
HPA's decisions change, run as fast as the machine allows on a ManualClock.

The load is a Simulator's: the total CPU of its `big` Deployment, whose level follows the daily
tide (trough at 04:00 UTC, peak at 21:00), scaled so that its evening peak is `peak_load_cores`.
That load is served by a separate Deployment, `frontend`, whose pods are the HPA's target: at each
tick every running replica uses load / replicas cores, so scaling up lowers the usage per pod as
it does behind a load balancer. Replicas the HPA adds appear at the next tick; removed ones end
with a stale marker. The rest of the simulated cluster is written too, as an agent would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import CPU_USAGE, SimConfig, Simulator
from metricsd.clock import ManualClock
from metricsd.consumers.actuators.base import InMemoryScale, WorkloadRef
from metricsd.consumers.hpa.controller import HPAController, HPAControllerSettings
from metricsd.consumers.hpa.observe import ObserveSettings
from metricsd.consumers.hpa.parse import load_hpa_yaml
from metricsd.consumers.hpa.spec import ControllerSettings, HPASpec
from metricsd.consumers.publish import DecisionPublisher
from metricsd.model import Labels, series_id, stale_marker
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

__all__ = ["DAY_HPA", "DAY_START_MS", "DayResult", "DaySettings", "run_day"]

_HOUR_MS = 3_600_000
# 2024-01-02 00:00 UTC, a Tuesday: a weekday tide.
DAY_START_MS = 1_704_153_600_000

DAY_HPA = """
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: frontend, namespace: default}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: frontend}
  minReplicas: 4
  maxReplicas: 50
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 60}}
  metricsd:
    schedules:
    - {name: evening-floor, start: "19:00", end: "23:00", minReplicas: 44}
"""


@dataclass(frozen=True)
class DaySettings:
    start_ms: int = DAY_START_MS
    duration_ms: int = 24 * _HOUR_MS
    interval_ms: int = 10_000
    sync_ms: int = 15_000
    seed: int = 0
    load_pods: int = 40
    other_pods: int = 20
    peak_load_cores: float = 13.0
    request_cores: float = 0.5
    spec_yaml: str = DAY_HPA


@dataclass
class DayResult:
    """One row per HPA sync: time, the load then (cores), replicas after the sync, bounds, rule."""

    times_ms: list[int] = field(default_factory=list)
    load_cores: list[float] = field(default_factory=list)
    replicas: list[int] = field(default_factory=list)
    min_replicas: list[int] = field(default_factory=list)
    max_replicas: list[int] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    target_utilization: float = 0.0
    request_cores: float = 0.0
    decisions: int = 0
    scales: int = 0

    def at(self, hour: float, start_ms: int) -> int:
        """Replicas at the sync nearest to `hour` hours after start_ms."""
        t = start_ms + hour * _HOUR_MS
        i = min(range(len(self.times_ms)), key=lambda k: abs(self.times_ms[k] - t))
        return self.replicas[i]

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("times_ms", "load_cores", "replicas", "min_replicas", "max_replicas",
                                             "rules", "target_utilization", "request_cores", "decisions", "scales")}


class _Subset:
    """Some of a simulator's series, as a batches.SeriesSource."""

    def __init__(self, sim: Simulator, cols: np.ndarray) -> None:
        self.series = [sim.series[i] for i in cols.tolist()]
        self.series_ids = sim.series_ids[cols]


class _Frontend:
    """The HPA's target: per-replica CPU counters and requests, written as an agent would."""

    def __init__(self, request_cores: float) -> None:
        self.request = request_cores
        self.counters: dict[str, float] = {}
        self.known: set[int] = set()

    @staticmethod
    def _labels(name: str, pod: str, extra: tuple[tuple[str, str], ...] = ()) -> Labels:
        base = {"__name__": name, "namespace": "default", "pod": pod, "workload": "frontend", "container": "app",
                **dict(extra)}
        return tuple(sorted(base.items()))

    def request_for(self, replicas: int, load_cores: float, ts: int, dt_s: float) -> pb.WriteRequest:
        pods = [f"frontend-{i:03d}" for i in range(replicas)]
        gone = [p for p in self.counters if p not in pods]
        req = pb.WriteRequest()
        per_pod = load_cores / replicas
        for pod in pods:
            self.counters[pod] = self.counters.get(pod, 0.0) + per_pod * dt_s
            self._add(req, self._labels(CPU_USAGE, pod), ts, self.counters[pod])
            self._add(req, self._labels("kube_pod_container_resource_requests", pod,
                                        (("resource", "cpu"), ("unit", "core"))), ts, self.request)
        for pod in gone:
            del self.counters[pod]
            self._add(req, self._labels(CPU_USAGE, pod), ts, stale_marker())
            self._add(req, self._labels("kube_pod_container_resource_requests", pod,
                                        (("resource", "cpu"), ("unit", "core"))), ts, stale_marker())
        return req

    def _add(self, req: pb.WriteRequest, labels: Labels, ts: int, value: float) -> None:
        sid = series_id(labels)
        req.ids.append(sid)
        req.counts.append(1)
        req.timestamps.append(ts)
        req.values.append(value)
        if sid not in self.known:
            self.known.add(sid)
            req.series.add(id=sid).labels.extend(labels_to_pb(labels))


def _big_load(cols: np.ndarray, prev: np.ndarray | None, values: np.ndarray, dt_s: float) -> float | None:
    now = values[cols]
    if prev is None:
        return None
    delta = now - prev
    delta = np.where(delta < 0, now, delta)  # a restarted container counts from zero
    return float(delta.sum() / dt_s)


def _calibrate(cfg: SimConfig, start_ms: int, cols: np.ndarray) -> float:
    """The big workload's mean CPU over 20:30-21:00 of the first day, to scale the load's peak."""
    day = start_ms // 86_400_000 * 86_400_000
    sim = Simulator(cfg, day + 20 * _HOUR_MS + 30 * 60_000)
    ts, block = sim.block(int(30 * 60_000 // cfg.interval_ms) + 1)
    used = np.diff(block[:, cols], axis=0).clip(min=0).sum(axis=1)
    return float(used.sum() / ((ts[-1] - ts[0]) / 1000.0))


async def run_day(settings: DaySettings | None = None, api: StoreAPI | None = None,
                  publish: bool = False) -> DayResult:
    """Run the HPA over the simulated period; returns the replica curve, one row per sync.

    `api` is the store written to (a new one by default); with `publish` each sync's decisions are
    also written back as series (consumers/recording.py), as `metricsd up` does, so a dashboard
    over `api` draws the day (tests/http/test_dashboard_browser_day.py)."""
    s = settings or DaySettings()
    spec: HPASpec = load_hpa_yaml(s.spec_yaml)[0]
    cfg = SimConfig(pods=s.load_pods + s.other_pods, workloads=6, nodes=4, namespaces=3, seed=s.seed,
                    interval_ms=s.interval_ms, big_workload_pods=s.load_pods)
    sim = Simulator(cfg, s.start_ms)
    cpu = sim.columns(CPU_USAGE)
    wl = [dict(lab).get("workload") for lab in sim.series]
    big_cols = np.array([i for i in range(cpu.start, cpu.stop) if wl[i] == "big"], dtype=np.int64)
    other = _Subset(sim, np.array([i for i in range(len(wl)) if wl[i] != "big"], dtype=np.int64))
    other_cols = np.array([i for i in range(len(wl)) if wl[i] != "big"], dtype=np.int64)
    scale = s.peak_load_cores / _calibrate(cfg, s.start_ms, big_cols)

    api = api if api is not None else StoreAPI(Store())
    backend = LocalBackend(api)
    publisher = DecisionPublisher(backend) if publish else None
    clock = ManualClock(s.start_ms)
    ref = WorkloadRef(spec.namespace, spec.scale_target_ref.kind, spec.scale_target_ref.name,
                      spec.scale_target_ref.api_version)
    cluster = InMemoryScale({ref: spec.min_replicas})
    # The rate window must hold at least two samples whatever the data interval.
    observe = ObserveSettings(rate_window_ms=max(60_000, 2 * s.interval_ms + s.interval_ms // 2),
                              last_window_ms=max(120_000, 3 * s.interval_ms))
    hpa_settings = HPAControllerSettings(ControllerSettings(sync_period_seconds=s.sync_ms / 1000.0), observe)
    controller = HPAController([spec], backend, cluster, clock, hpa_settings)
    frontend = _Frontend(s.request_cores)
    target = spec.metrics[0].target.value
    result = DayResult(target_utilization=target, request_cores=s.request_cores)

    prev: np.ndarray | None = None
    prev_ts = s.start_ms - s.interval_ms
    load = math.nan
    next_sync = s.start_ms + s.sync_ms
    labels_sent = False
    end = s.start_ms + s.duration_ms
    while sim.next_timestamp_ms <= end:
        ts, values = sim.next_tick()
        while next_sync < ts:
            if not math.isnan(load):
                clock.set(next_sync)
                entries = await controller.sync_once()
                if publisher is not None:
                    await publisher.publish("hpa", entries)
                entry = entries[0]
                res = entry["result"]
                result.times_ms.append(next_sync)
                result.load_cores.append(load)
                result.replicas.append(cluster.replicas[ref])
                result.min_replicas.append(res.get("minReplicas", spec.min_replicas))
                result.max_replicas.append(res.get("maxReplicas", spec.max_replicas))
                result.rules.append(entry["rule"])
            next_sync += s.sync_ms
        clock.set(ts)
        dt_s = (ts - prev_ts) / 1000.0
        raw = _big_load(big_cols, prev, values, dt_s)
        prev, prev_ts = values[big_cols].copy(), ts
        for req in write_requests(other, ts, values[other_cols], max_samples=60_000,
                                  send_labels_for=None if not labels_sent else set()):
            api.write(req)
        labels_sent = True
        if raw is None:
            continue
        load = raw * scale
        api.write(frontend.request_for(cluster.replicas[ref], load, ts, dt_s))
    result.decisions = controller.log.recorded
    result.scales = controller.targets[0].scales
    return result

