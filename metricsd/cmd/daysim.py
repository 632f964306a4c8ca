"""A simulated day for the HPA: a store in this process, a tidal load, and a replica count that the
HPA's decisions change, run as fast as the machine allows on a ManualClock.

The load is a Simulator's: the total CPU of its `big` Deployment, whose level follows the daily
tide (trough at 04:00 UTC, peak at 21:00), scaled so that its evening peak is `peak_load_cores`.
That load is served by a separate Deployment, `frontend`, whose pods are the HPA's target: at each
tick every ready replica uses load / ready replicas cores, so scaling up lowers the usage per pod as
it does behind a load balancer. A replica the HPA adds exists at once (it reports its request, as
kube-state-metrics does for a pod being created) but serves and uses CPU only `startup_ms` later,
as a pod that pulls its image and syncs its data first; a scale-down removes starting pods first,
then the newest, each ending with a stale marker. The rest of the simulated cluster is written
too, as an agent would.

`run_days` runs several HPAs side by side on one store and one load: each spec targets its own
copy of the frontend (its `scaleTargetRef.name` is the workload), so a reactive and a predictive
HPA see the same day and build their own history.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from metricsd.agent.batches import write_requests
from metricsd.agent.simulate import CPU_USAGE, REQUESTS, SimConfig, Simulator
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

__all__ = ["DAY_HPA", "DAY_START_MS", "RAMP_HOURS", "DayResult", "DaySettings", "run_day", "run_days"]

_HOUR_MS = 3_600_000
# The simulator's tide rises from its 04:00 UTC trough to its 21:00 peak: the daily ramp.
RAMP_HOURS = (4.0, 21.0)
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
    startup_ms: int = 0


@dataclass
class DayResult:
    """One row per HPA sync: time, the load then (cores), replicas after the sync (pods that exist,
    starting ones included), the ready ones before it and their CPU utilisation (load / (ready *
    request), percent), bounds, rule; and for a predictive HPA the forecast's demand now and at
    its peak within the horizon (cores), the replicas it asked for and whether it was in use."""

    name: str = ""
    times_ms: list[int] = field(default_factory=list)
    load_cores: list[float] = field(default_factory=list)
    replicas: list[int] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    utilization: list[float] = field(default_factory=list)
    min_replicas: list[int] = field(default_factory=list)
    max_replicas: list[int] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    forecast_now: list[float | None] = field(default_factory=list)
    forecast_peak: list[float | None] = field(default_factory=list)
    predicted_replicas: list[int | None] = field(default_factory=list)
    prediction_active: list[bool] = field(default_factory=list)
    prediction_reason: list[str | None] = field(default_factory=list)
    target_utilization: float = 0.0
    tolerance: float = 0.1
    request_cores: float = 0.0
    sync_ms: int = 15_000
    decisions: int = 0
    scales: int = 0

    def _rows(self, start_ms: int, end_ms: int | None, ramps_only: bool) -> list[int]:
        lo, hi = RAMP_HOURS
        return [i for i, t in enumerate(self.times_ms) if t >= start_ms and (end_ms is None or t < end_ms)
                and (not ramps_only or lo <= (t % 86_400_000) / _HOUR_MS < hi)]

    def minutes_above_target(self, start_ms: int, end_ms: int | None = None, ramps_only: bool = False) -> float:
        """Minutes (one sync period per sync) in which the ready pods ran above the target plus the
        tolerance, from start_ms on; ramps_only counts only the tide's rise (RAMP_HOURS)."""
        limit = self.target_utilization * (1.0 + self.tolerance)
        above = sum(1 for i in self._rows(start_ms, end_ms, ramps_only) if self.utilization[i] > limit)
        return above * self.sync_ms / 60_000

    def replica_hours(self, start_ms: int, end_ms: int | None = None) -> float:
        """Replicas that existed (starting ones included: they cost as much) times hours, from start_ms on."""
        return sum(self.replicas[i] for i in self._rows(start_ms, end_ms, False)) * self.sync_ms / _HOUR_MS

    def at(self, hour: float, start_ms: int) -> int:
        """Replicas at the sync nearest to `hour` hours after start_ms."""
        t = start_ms + hour * _HOUR_MS
        i = min(range(len(self.times_ms)), key=lambda k: abs(self.times_ms[k] - t))
        return self.replicas[i]

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class _Subset:
    """Some of a simulator's series, as a batches.SeriesSource."""

    def __init__(self, sim: Simulator, cols: np.ndarray) -> None:
        self.series = [sim.series[i] for i in cols.tolist()]
        self.series_ids = sim.series_ids[cols]


class _Frontend:
    """One HPA's target: its pods (each ready from some time on), their CPU counters and requests,
    written as an agent would. A counter keeps its value while its pod is gone, so a pod name used
    again counts on from there, as a new pod's series would not reset within an hour."""

    def __init__(self, workload: str, request_cores: float, startup_ms: int, replicas: int, start_ms: int) -> None:
        self.workload = workload
        self.request = request_cores
        self.startup_ms = startup_ms
        self.ready_at: dict[str, int] = {self._pod(i): start_ms for i in range(replicas)}
        self.counters: dict[str, float] = {}
        self.known: set[int] = set()
        self.gone: list[str] = []

    def _pod(self, i: int) -> str:
        return f"{self.workload}-{i:03d}"

    def ready(self, ts: int) -> int:
        return sum(1 for t in self.ready_at.values() if t <= ts)

    def resize(self, replicas: int, ts: int) -> None:
        """Create pods (ready startup_ms from now) or delete them: starting ones first, then the newest."""
        i = 0
        while len(self.ready_at) < replicas:
            if self._pod(i) not in self.ready_at:
                self.ready_at[self._pod(i)] = ts + self.startup_ms
            i += 1
        if len(self.ready_at) > replicas:
            order = sorted(self.ready_at, key=lambda p: (self.ready_at[p] <= ts, -int(p.rsplit("-", 1)[1])))
            for pod in order[: len(self.ready_at) - replicas]:
                del self.ready_at[pod]
                self.gone.append(pod)

    def _labels(self, name: str, pod: str, extra: tuple[tuple[str, str], ...] = ()) -> Labels:
        base = {"__name__": name, "namespace": "default", "pod": pod, "workload": self.workload, "container": "app",
                **dict(extra)}
        return tuple(sorted(base.items()))

    def request_for(self, load_cores: float, ts: int, dt_s: float) -> pb.WriteRequest:
        req = pb.WriteRequest()
        serving = [p for p, t in self.ready_at.items() if t <= ts]
        per_pod = load_cores / max(1, len(serving))
        for pod in serving:
            self.counters[pod] = self.counters.get(pod, 0.0) + per_pod * dt_s
            self._add(req, self._labels(CPU_USAGE, pod), ts, self.counters[pod])
        for pod in self.ready_at:
            self._add(req, self._labels(REQUESTS, pod, (("resource", "cpu"), ("unit", "core"))), ts, self.request)
        for pod in self.gone:
            self._add(req, self._labels(CPU_USAGE, pod), ts, stale_marker())
            self._add(req, self._labels(REQUESTS, pod, (("resource", "cpu"), ("unit", "core"))), ts, stale_marker())
        self.gone = []
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
    """Run the HPA of `settings.spec_yaml` over the simulated period; one row per sync.

    `api` is the store written to (a new one by default); with `publish` each sync's decisions are
    also written back as series (consumers/recording.py), as `metricsd up` does, so a dashboard
    over `api` draws the day (tests/http/test_dashboard_browser_day.py)."""
    s = settings or DaySettings()
    return (await run_days(s, [s.spec_yaml], api, publish))[0]


def _record(result: DayResult, entry: dict[str, Any], at_ms: int, load: float, replicas: int, ready: int,
            spec: HPASpec) -> None:
    res = entry["result"]
    result.times_ms.append(at_ms)
    result.load_cores.append(load)
    result.replicas.append(replicas)
    result.ready.append(ready)
    result.utilization.append(100.0 * load / (max(1, ready) * result.request_cores))
    result.min_replicas.append(res.get("minReplicas", spec.min_replicas))
    result.max_replicas.append(res.get("maxReplicas", spec.max_replicas))
    result.rules.append(entry["rule"])
    prediction = res.get("prediction") or {}
    rows = entry["inputs"]["metrics"]
    forecast = (rows[0].get("prediction") or {}) if rows else {}
    result.forecast_now.append(forecast.get("demandNow"))
    result.forecast_peak.append(forecast.get("demandPeak"))
    result.predicted_replicas.append(prediction.get("replicas"))
    result.prediction_active.append(bool(prediction.get("active")))
    result.prediction_reason.append(prediction.get("reason"))


async def run_days(settings: DaySettings, spec_yamls: list[str], api: StoreAPI | None = None,
                   publish: bool = False) -> list[DayResult]:
    """Run one HPA per spec, side by side on the same load, each on its own copy of the frontend."""
    s = settings
    specs: list[HPASpec] = [load_hpa_yaml(y)[0] for y in spec_yamls]
    if len({sp.scale_target_ref.name for sp in specs}) != len(specs):
        raise ValueError("each HPA run side by side needs its own scaleTargetRef.name")
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
    refs = [WorkloadRef(sp.namespace, sp.scale_target_ref.kind, sp.scale_target_ref.name,
                        sp.scale_target_ref.api_version) for sp in specs]
    cluster = InMemoryScale({ref: sp.min_replicas for ref, sp in zip(refs, specs, strict=True)})
    # The rate window must hold at least two samples whatever the data interval.
    observe = ObserveSettings(rate_window_ms=max(60_000, 2 * s.interval_ms + s.interval_ms // 2),
                              last_window_ms=max(120_000, 3 * s.interval_ms))
    controller_settings = ControllerSettings(sync_period_seconds=s.sync_ms / 1000.0)
    hpa_settings = HPAControllerSettings(controller_settings, observe)
    controller = HPAController(specs, backend, cluster, clock, hpa_settings)
    frontends = [_Frontend(sp.scale_target_ref.name, s.request_cores, s.startup_ms, sp.min_replicas, s.start_ms)
                 for sp in specs]
    results = [DayResult(name=sp.name, target_utilization=sp.metrics[0].target.value,
                         tolerance=sp.behavior.scale_up.tolerance or controller_settings.tolerance,
                         request_cores=s.request_cores, sync_ms=s.sync_ms) for sp in specs]

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
                ready = [f.ready(next_sync) for f in frontends]
                entries = await controller.sync_once()
                if publisher is not None:
                    await publisher.publish("hpa", entries)
                for i, entry in enumerate(entries):
                    replicas = cluster.replicas[refs[i]]
                    frontends[i].resize(replicas, next_sync)
                    _record(results[i], entry, next_sync, load, replicas, ready[i], specs[i])
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
        for frontend in frontends:
            api.write(frontend.request_for(load, ts, dt_s))
    for i, result in enumerate(results):
        result.decisions = controller.log.recorded // len(specs)
        result.scales = controller.targets[i].scales
    return results
