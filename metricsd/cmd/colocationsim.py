"""A simulated week for the colocation plan: a store in this process, a pool of nodes, a tidal online
service, offline work on the lent nodes, and the real ColocationController deciding every period
on a ManualClock, as fast as the machine allows.

Two online services share the pool: `shop/frontend` follows the daily tide, and `shop/checkout`,
the shadow service, idles at a few cores until a flash sale one night. Each runs
`ceil(load / (request * target))` pods of `request_cores` each, never fewer than its HPA floor
(the rule an HPA converges to; the HPA controller itself is not run here). New pods go to the
Online node with the most room; a scale-down removes pods on draining nodes first, as the
pod-deletion-cost annotation makes a ReplicaSet do. A node being lent has its online pods moved to
Online nodes after a drawn delay (the drain); a lent node runs offline pods (best-effort, no
requests) until it is told to return, then they leave after a drawn delay. A few drains and
returns are drawn to hang past their deadline, so the alerts are seen. The flash sale drives
checkout past the surge rule's threshold (and past the forecast, which knows nothing of it).

Shortfall is counted strictly: the cores the online pods request beyond the capacity of the nodes
in state Online (a draining node does not count, whatever still runs on it). Cores are treated as
a fluid across nodes: bin-packing is not simulated.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from metricsd.clock import ManualClock
from metricsd.consumers.actuators.base import InMemoryScale
from metricsd.consumers.colocation.controller import ColocationController
from metricsd.consumers.colocation.machine import Phase
from metricsd.consumers.colocation.observe import ColocationObserver
from metricsd.consumers.colocation.spec import load_colocation_yaml
from metricsd.consumers.hpa.parse import load_hpa_yaml
from metricsd.consumers.hpa.schedule import effective_limits
from metricsd.model import Labels, series_id, stale_marker
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.wire import labels_to_pb
from metricsd.store.api import LocalBackend, StoreAPI
from metricsd.store.engine import Store

__all__ = ["WEEK_PLAN", "WeekResult", "WeekSettings", "run_week"]

_MIN = 60_000
_HOUR = 3_600_000
_DAY = 24 * _HOUR
# 2024-01-01 00:00 UTC, a Monday.
WEEK_START_MS = 1_704_067_200_000

WEEK_PLAN = """
apiVersion: metricsd.io/v1alpha1
kind: ColocationPlan
metadata: {name: week}
spec:
  pools: [{name: shared, nodeRegex: "pool-[0-9]+", keepOnline: 2}]
  margin: 0.25
  drainMinutes: 10
  noticeMinutes: 15
  returnGraceMinutes: 5
  minLendMinutes: 120
  minOnlineMinutes: 30
  replicaCurves: [{hpa: shop/frontend, pool: shared, coresPerReplica: 4}]
  surge:
  - {name: flash-sale, service: {namespace: shop, workload: checkout}, threshold: 10, pool: shared, nodes: 4,
     order: largestFirst}
  surgeNoticeSeconds: 60
  intervalSeconds: 60
"""

WEEK_HPA = """
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: frontend, namespace: shop}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: frontend}
  minReplicas: 4
  maxReplicas: 120
  metrics:
  - {type: Resource, resource: {name: cpu, target: {type: Utilization, averageUtilization: 60}}}
  metricsd:
    schedules:
    - {name: evening, start: "19:00", end: "23:00", minReplicas: 40}
"""


@dataclass(frozen=True)
class WeekSettings:
    start_ms: int = WEEK_START_MS
    days: float = 7.0
    nodes: int = 12
    node_cores: float = 32.0
    request_cores: float = 4.0
    target: float = 0.6
    peak_load_cores: float = 130.0
    trough_share: float = 0.15
    checkout_cores: float = 6.0
    flash_day: int | None = 3
    flash_hour: float = 2.0
    flash_cores: float = 60.0
    flash_ramp_minutes: float = 60.0
    offline_pods_per_node: int = 2
    seed: int = 0
    spec_yaml: str = WEEK_PLAN
    hpa_yaml: str = WEEK_HPA


@dataclass
class WeekResult:
    """One row per period, plus the moves and alerts of the week."""

    times_ms: list[int] = field(default_factory=list)
    load_cores: list[float] = field(default_factory=list)
    checkout_cores: list[float] = field(default_factory=list)
    requested_cores: list[float] = field(default_factory=list)
    online_cores: list[float] = field(default_factory=list)
    need_cores: list[float | None] = field(default_factory=list)
    phases: list[dict[str, int]] = field(default_factory=list)
    surge: list[bool] = field(default_factory=list)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    errors: int = 0

    def summary(self, interval_ms: int, node_cores: float) -> dict[str, Any]:
        hours = interval_ms / _HOUR
        short = [max(0.0, r - o) for r, o in zip(self.requested_cores, self.online_cores, strict=True)]
        days = max(1, math.ceil((self.times_ms[-1] - self.times_ms[0] + interval_ms) / _DAY)) if self.times_ms else 1
        per_day: list[int] = [0] * days
        reasons: dict[str, int] = {}
        for t in self.transitions:
            per_day[(t["timeMs"] - self.times_ms[0]) // _DAY] += 1
            reasons[t["reason"]] = reasons.get(t["reason"], 0) + 1
        lent = sum(p["Offline"] for p in self.phases) * hours
        away = sum(p["Offline"] + p["OnlineToOffline"] + p["OfflineToOnline"] for p in self.phases) * hours
        total = len(self.phases) * hours * (sum(self.phases[0].values()) if self.phases else 0)
        return {
            "simulated_days": round(len(self.times_ms) * hours / 24, 2),
            "node_hours_lent": round(lent, 1), "node_hours_away_from_online": round(away, 1),
            "core_hours_lent": round(lent * node_cores, 1),
            "share_of_pool_node_hours_lent": round(lent / total, 3) if total else 0.0,
            "shortfall_core_minutes": round(sum(short) * interval_ms / _MIN, 3),
            "shortfall_max_cores": round(max(short, default=0.0), 3),
            "transitions": len(self.transitions), "transitions_per_day": per_day,
            "transitions_by_reason": dict(sorted(reasons.items())),
            "alerts": sum(1 for t in self.transitions if t["alert"]), "periods_with_surge": sum(self.surge),
            "backend_errors": self.errors,
        }


@dataclass
class _Pod:
    name: str
    node: str
    workload: str  # frontend, checkout; train for the offline pods
    counter: float = 0.0

    @property
    def online(self) -> bool:
        return self.workload != "train"


class _Cluster:
    """The simulated nodes and pods, written to the store as an agent and kube-state-metrics would."""

    def __init__(self, s: WeekSettings, api: StoreAPI) -> None:
        self.s = s
        self.api = api
        self.rng = random.Random(s.seed)
        self.nodes = [f"pool-{i:02d}" for i in range(s.nodes)]
        self.pods: list[_Pod] = []
        self.serial = 0
        self.known: set[int] = set()
        self.leave_at: dict[str, int] = {}  # node -> when the pods that must leave it are gone

    def _new(self, node: str, workload: str) -> _Pod:
        self.serial += 1
        pod = _Pod(f"{workload}-{self.serial:06d}", node, workload)
        self.pods.append(pod)
        return pod

    def online_pods(self) -> list[_Pod]:
        return [p for p in self.pods if p.online]

    def place(self, phases: dict[str, Phase]) -> str:
        online = [n for n in self.nodes if phases[n] is Phase.ONLINE] or self.nodes
        used = {n: 0.0 for n in online}
        for p in self.online_pods():
            if p.node in used:
                used[p.node] += self.s.request_cores
        return min(online, key=lambda n: (used[n], n))

    def step(self, now: int, replicas: dict[str, int], phases: dict[str, Phase]) -> None:
        """Pods follow the nodes' states and the replica count."""
        for node in self.nodes:
            ph = phases[node]
            due = self.leave_at.get(node)
            if ph is Phase.ONLINE_TO_OFFLINE and due is not None and now >= due:
                for p in [p for p in self.online_pods() if p.node == node]:  # the drain: moved elsewhere
                    self.pods.remove(p)
                    self._new(self.place(phases), p.workload)
            if ph is Phase.OFFLINE and not any(not p.online and p.node == node for p in self.pods):
                for _ in range(self.s.offline_pods_per_node):
                    self._new(node, "train")
            if (ph is Phase.OFFLINE_TO_ONLINE and due is not None and now >= due) or ph is Phase.ONLINE:
                self.pods = [p for p in self.pods if p.online or p.node != node]
        for workload, want in replicas.items():
            current = [p for p in self.pods if p.workload == workload]
            while len(current) < want:
                current.append(self._new(self.place(phases), workload))
            if len(current) > want:  # pods on draining nodes go first (their deletion cost is lower)
                order = sorted(current, key=lambda p: (phases[p.node] is Phase.ONLINE, p.name))
                for p in order[:len(current) - want]:
                    self.pods.remove(p)

    def write(self, now: int, load: dict[str, float], previous: list[_Pod]) -> None:
        req = pb.WriteRequest()
        s = self.s
        for node in self.nodes:
            self._add(req, (("__name__", "kube_node_status_capacity"), ("namespace", "kube-system"),
                            ("node", node), ("pod", f"node-{node}"), ("resource", "cpu"), ("unit", "core")),
                      now, s.node_cores)
        count = {w: sum(1 for p in self.pods if p.workload == w) for w in load}
        for p in self.pods:
            use = load[p.workload] / count[p.workload] if p.online else s.node_cores * 0.8 / s.offline_pods_per_node
            p.counter += use * 60.0
            ns = "shop" if p.online else "batch"
            base = (("container", "app"), ("namespace", ns), ("node", p.node), ("pod", p.name),
                    ("workload", p.workload))
            self._add(req, tuple(sorted((("__name__", "container_cpu_usage_seconds_total"), *base))), now, p.counter)
            if p.online:
                self._add(req, tuple(sorted((("__name__", "kube_pod_container_resource_requests"), *base,
                                             ("resource", "cpu"), ("unit", "core")))), now, s.request_cores)
        alive = {p.name for p in self.pods}
        for p in previous:
            if p.name in alive:
                continue
            ns = "shop" if p.online else "batch"
            base = (("container", "app"), ("namespace", ns), ("node", p.node), ("pod", p.name),
                    ("workload", p.workload))
            self._add(req, tuple(sorted((("__name__", "container_cpu_usage_seconds_total"), *base))), now,
                      stale_marker())
            if p.online:
                self._add(req, tuple(sorted((("__name__", "kube_pod_container_resource_requests"), *base,
                                             ("resource", "cpu"), ("unit", "core")))), now, stale_marker())
        self.api.write(req)

    def _add(self, req: pb.WriteRequest, labels: Labels, ts: int, value: float) -> None:
        sid = series_id(labels)
        req.ids.append(sid)
        req.counts.append(1)
        req.timestamps.append(ts)
        req.values.append(value)
        if sid not in self.known:
            self.known.add(sid)
            req.series.add(id=sid).labels.extend(labels_to_pb(labels))


def tide(s: WeekSettings, t_ms: int) -> float:
    """The frontend's load in cores: trough at 04:00, peak at 21:00 UTC, weekends 10 % busier."""
    hour = (t_ms % _DAY) / _HOUR
    day = (t_ms - s.start_ms) // _DAY
    # A smooth day: low at 04:00, high at 21:00 (two half-cosines of unequal length).
    if 4 <= hour < 21:
        x = (1 - math.cos(math.pi * (hour - 4) / 17)) / 2
    else:
        x = (1 + math.cos(math.pi * ((hour - 21) % 24) / 7)) / 2
    level = s.trough_share + (1 - s.trough_share) * x
    weekend = 1.1 if day % 7 in (5, 6) else 1.0
    wobble = 1 + 0.03 * math.sin(t_ms / (17 * _MIN)) + 0.02 * math.sin(t_ms / (5 * _MIN))
    return s.peak_load_cores * level * weekend * wobble


def checkout(s: WeekSettings, t_ms: int) -> float:
    """The shadow service: a few cores, and on the flash-sale night a ramp to flash_cores that holds
    for an hour after the ramp."""
    load = s.checkout_cores
    if s.flash_day is not None:
        start = s.start_ms + s.flash_day * _DAY + int(s.flash_hour * _HOUR)
        ramp_ms = s.flash_ramp_minutes * _MIN
        if start <= t_ms < start + ramp_ms + _HOUR:
            load += (s.flash_cores - s.checkout_cores) * min(1.0, (t_ms - start) / ramp_ms)
    return load


async def run_week(settings: WeekSettings | None = None) -> WeekResult:
    """The first day runs without lending (no yesterday yet) and is the history the rest plans on."""
    s = settings or WeekSettings()
    spec = load_colocation_yaml(s.spec_yaml)[0]
    hpa = load_hpa_yaml(s.hpa_yaml)
    interval = spec.settings.timing.interval_ms
    api = StoreAPI(Store())
    backend = LocalBackend(api)
    clock = ManualClock(s.start_ms)
    sink = InMemoryScale()
    ctl = ColocationController(spec, backend, sink, clock, hpas=hpa, observer=ColocationObserver(backend))
    cluster = _Cluster(s, api)
    result = WeekResult()
    floor_spec = hpa[0]
    end = s.start_ms + int(s.days * _DAY)
    now = s.start_ms
    phases = {n: Phase.ONLINE for n in cluster.nodes}
    while now < end:
        load = {"frontend": tide(s, now), "checkout": checkout(s, now)}
        floor = effective_limits(floor_spec, now / 1000).min_replicas
        replicas = {"frontend": max(floor, math.ceil(load["frontend"] / (s.request_cores * s.target))),
                    "checkout": max(2, math.ceil(load["checkout"] / (s.request_cores * s.target)))}
        previous = list(cluster.pods)
        cluster.step(now, replicas, phases)
        cluster.write(now, load, previous)
        clock.set(now)
        entry = await ctl.sync_once()
        result.errors += len(entry.get("result", {}).get("errors", []))
        result.transitions.extend(entry.get("result", {}).get("transitions", []))
        for name, st in ctl.states.items():
            if st.phase is not phases.get(name):
                phases[name] = st.phase
                if st.deadline_ms is not None:  # a new transition: when the pods that must go are gone
                    span = st.deadline_ms - now
                    hang = cluster.rng.random() < 0.04
                    cluster.leave_at[name] = now + (span + 30 * _MIN if hang else
                                                    int(cluster.rng.uniform(0.1, 0.6) * span))
        plan = ctl.last_plan
        need = None
        if plan is not None:
            row = next((r for r in plan.table if r.hour_start_ms == now // _HOUR * _HOUR), None)
            need = row.need_cores if row is not None else None
        counts = {ph.value: 0 for ph in Phase}
        for n in cluster.nodes:
            counts[phases[n].value] += 1
        result.times_ms.append(now)
        result.load_cores.append(load["frontend"])
        result.checkout_cores.append(load["checkout"])
        result.requested_cores.append(sum(replicas.values()) * s.request_cores)
        result.online_cores.append(counts["Online"] * s.node_cores)
        result.need_cores.append(need)
        result.phases.append(counts)
        result.surge.append(any(x.active for x in plan.surges) if plan is not None else False)
        if (now - s.start_ms) % _HOUR == 0:
            api.store.gc()
        now += interval
    return result
