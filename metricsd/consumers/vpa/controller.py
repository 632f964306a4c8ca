"""The VPA recommender loop: feed each container's usage into its aggregate, recommend, act, checkpoint.

Every `interval_s` (60 s, upstream's recommender interval), for each VerticalPodAutoscaler: ask
metricsd for the minutes not yet fed, one value per container per `step_ms` (the CPU usage rate
over the step, the working set's peak over the step, OOM kills counted by
`container_oom_events_total`), feed them to `ContainerAggregate` in time order, and recommend.
Auto and Recreate modes hand the target to the backend when a running container's request lies
outside [lowerBound, upperBound], once per new target (the updater's rule, pure, in updater.py). The aggregates are
saved to a CheckpointStore every `checkpoint_interval_s` and on `stop`, and loaded on start, so a
restart keeps the history and recommends the same.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from metricsd.clock import Clock
from metricsd.consumers.actuators.base import Actuator, ActuatorError, ResourceUpdate, WorkloadRef
from metricsd.consumers.history import DecisionLog, iso_time
from metricsd.consumers.queries import CPU_USAGE, OOM_EVENTS, REQUESTS, WORKING_SET, eq, group_instant, group_range
from metricsd.consumers.vpa.checkpoint import CheckpointStore, MemoryCheckpointStore
from metricsd.consumers.vpa.model import AggregationConfig, ContainerAggregate
from metricsd.consumers.vpa.recommender import ContainerRecommendation, RecommenderConfig, recommend, to_status
from metricsd.consumers.vpa.spec import VPASpec
from metricsd.consumers.vpa.updater import decide_update
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import BadRequest, MetricsBackend, Unavailable

__all__ = ["VPAController", "VPAControllerSettings"]

log = logging.getLogger("metricsd.consumers.vpa")
_LIMITS = "kube_pod_container_resource_limits"
_MAX_STEPS = 10_000  # below the store's 11,000 evaluation times per query


@dataclass(frozen=True)
class VPAControllerSettings:
    interval_s: float = 60.0
    step_ms: int = 60_000
    initial_history_ms: int = 24 * 3_600_000
    checkpoint_interval_s: float = 600.0
    history: int = 200
    aggregation: AggregationConfig = field(default_factory=AggregationConfig)
    recommender: RecommenderConfig = field(default_factory=RecommenderConfig)


@dataclass
class _Target:
    spec: VPASpec
    ref: WorkloadRef
    aggregates: dict[str, ContainerAggregate] = field(default_factory=dict)
    fed_until_ms: int | None = None
    samples_fed: int = 0
    applied: dict[str, dict[str, float]] | None = None
    recommendation: dict[str, Any] | None = None
    last: dict[str, Any] | None = None
    syncs: int = 0
    updates: int = 0
    errors: int = 0

    @property
    def key(self) -> str:
        return f"{self.spec.namespace}/{self.spec.name}"


class VPAController:
    """Not safe to share across event loops; `sync_once` must not run concurrently with itself."""

    name = "vpa"

    def __init__(self, specs: Sequence[VPASpec], backend: MetricsBackend, actuator: Actuator, clock: Clock,
                 checkpoints: CheckpointStore | None = None, settings: VPAControllerSettings | None = None) -> None:
        self.settings = settings or VPAControllerSettings()
        self.backend = backend
        self.actuator = actuator
        self.clock = clock
        self.checkpoints = checkpoints if checkpoints is not None else MemoryCheckpointStore()
        self.log = DecisionLog(self.settings.history)
        self.targets = [_Target(s, WorkloadRef(s.namespace, s.target_ref.kind, s.target_ref.name,
                                               s.target_ref.api_version)) for s in specs]
        self._loaded = False
        self._saved_at: float | None = None

    @property
    def interval_s(self) -> float:
        return self.settings.interval_s

    async def load(self) -> int:
        """Restore the aggregates from the checkpoint; returns how many VPAs it covered."""
        self._loaded = True
        try:
            doc = await self.checkpoints.load()
        except (OSError, ValueError) as e:
            log.warning("ignoring an unreadable VPA checkpoint: %s", e)
            return 0
        if not doc or doc.get("version") != 1:
            return 0
        restored = 0
        for t in self.targets:
            saved = doc.get("vpas", {}).get(t.key)
            if saved is None:
                continue
            try:
                t.aggregates = {c: ContainerAggregate.from_dict(a, self.settings.aggregation)
                                for c, a in saved["containers"].items()}
                t.fed_until_ms = saved.get("fedUntilMs")
            except (KeyError, TypeError, ValueError) as e:
                log.warning("ignoring the checkpoint of VPA %s: %s", t.key, e)
                continue
            restored += 1
        return restored

    def checkpoint(self) -> dict[str, Any]:
        return {
            "version": 1, "savedAtMs": self.clock.now_ms(),
            "vpas": {t.key: {"fedUntilMs": t.fed_until_ms,
                             "containers": {c: a.to_dict() for c, a in t.aggregates.items()}}
                     for t in self.targets},
        }

    async def save(self) -> None:
        await self.checkpoints.save(self.checkpoint())
        self._saved_at = self.clock.monotonic()

    async def sync_once(self) -> list[dict[str, Any]]:
        if not self._loaded:
            await self.load()
        entries = [await self.sync_target(t) for t in self.targets]
        due = self._saved_at is None or self.clock.monotonic() - self._saved_at >= self.settings.checkpoint_interval_s
        if due:
            try:
                await self.save()
            except OSError as e:
                log.warning("could not save the VPA checkpoint: %s", e)
        return entries

    async def sync_target(self, t: _Target) -> dict[str, Any]:
        now_ms = self.clock.now_ms()
        t.syncs += 1
        errors: list[str] = []
        fed = 0
        requests: dict[str, dict[str, float]] = {}
        limits: dict[str, dict[str, float]] = {}
        try:
            fed = await self._feed(t, now_ms)
            requests = await self._resources(t, REQUESTS, now_ms)
            limits = await self._resources(t, _LIMITS, now_ms)
        except (Unavailable, BadRequest) as e:
            errors.append(f"querying metrics: {e}")
        for agg in t.aggregates.values():
            agg.expire(now_ms / 1000.0)
        recs = recommend(t.spec, t.aggregates, self.settings.recommender)
        t.recommendation = to_status(recs)["recommendation"]
        rule, message, action = await self._act(t, recs, requests, limits, errors)
        containers = {c: {"confidence": a.confidence(), "totalSamples": a.total_samples,
                          "firstSample": iso_time(int(a.first_sample * 1000)) if a.first_sample else None,
                          "currentRequests": requests.get(c, {})}
                      for c, a in sorted(t.aggregates.items())}
        entry = {
            "time": iso_time(now_ms), "timeMs": now_ms, "consumer": "vpa", "vpa": t.key,
            "target": f"{t.ref.kind}/{t.ref.name}", "updateMode": t.spec.update_mode,
            "inputs": {"samplesFed": fed, "fedUntil": iso_time(t.fed_until_ms) if t.fed_until_ms else None,
                       "containers": containers},
            "rule": rule, "message": message,
            "result": {"recommendation": t.recommendation, "action": action, "errors": errors},
        }
        if errors:
            t.errors += 1
        t.last = self.log.record(entry)
        return t.last

    def _matchers(self, t: _Target, name: str) -> list[pb.Matcher]:
        return [eq("__name__", name), eq("namespace", t.spec.namespace), eq("workload", t.spec.target_ref.name)]

    async def _feed(self, t: _Target, now_ms: int) -> int:
        """Feed every step after fed_until up to now; returns the samples fed. Raises Unavailable."""
        step = self.settings.step_ms
        end = now_ms // step * step
        start = (t.fed_until_ms + step) if t.fed_until_ms is not None else end - self.settings.initial_history_ms
        fed = 0
        while start <= end:
            chunk_end = min(end, start + (_MAX_STEPS - 1) * step)
            fed += await self._feed_range(t, start, chunk_end)
            t.fed_until_ms = chunk_end
            start = chunk_end + step
        t.samples_fed += fed
        return fed

    async def _feed_range(self, t: _Target, start: int, end: int) -> int:
        step = self.settings.step_ms
        by = ["pod", "container"]
        times, cpu = await group_range(self.backend, self._matchers(t, CPU_USAGE), pb.SERIES_RATE, step, by,
                                       start, end, step)
        _, mem = await group_range(self.backend, self._matchers(t, WORKING_SET), pb.SERIES_MAX, step, by,
                                   start, end, step)
        _, ooms = await group_range(self.backend, self._matchers(t, OOM_EVENTS), pb.SERIES_INCREASE, step, by,
                                    start, end, step)
        requests = await self._resources(t, REQUESTS, end, per_pod=True)
        fed = 0
        keys = sorted(k for k in set(cpu) | set(mem) if k[1] and k[1] != "POD")
        for i, ts_ms in enumerate(times):
            ts = ts_ms / 1000.0
            for pod, container in keys:
                agg = t.aggregates.get(container)
                if agg is None:
                    agg = t.aggregates[container] = ContainerAggregate(self.settings.aggregation)
                req = requests.get(f"{pod}/{container}", {})
                cpu_v = cpu.get((pod, container), [])
                if i < len(cpu_v) and not math.isnan(cpu_v[i]):
                    agg.add_cpu_sample(cpu_v[i], req.get("cpu", 0.0), ts)
                    fed += 1
                mem_v = mem.get((pod, container), [])
                if i < len(mem_v) and not math.isnan(mem_v[i]):
                    agg.add_memory_sample(pod, mem_v[i], ts)
                    fed += 1
                oom_v = ooms.get((pod, container), [])
                if i < len(oom_v) and oom_v[i] >= 0.5:
                    agg.record_oom(pod, ts, req.get("memory", 0.0))
        return fed

    async def _resources(self, t: _Target, metric: str, at_ms: int, per_pod: bool = False
                         ) -> dict[str, dict[str, float]]:
        """container (or pod/container) -> resource -> the largest value among the running pods."""
        found = await group_instant(self.backend, self._matchers(t, metric), pb.SERIES_LAST, 5 * 60_000,
                                    ["pod", "container", "resource"], at_ms)
        out: dict[str, dict[str, float]] = defaultdict(dict)
        for (pod, container, resource), value in found.items():
            key = f"{pod}/{container}" if per_pod else container
            out[key][resource] = max(value, out[key].get(resource, 0.0))
        return dict(out)

    async def _act(self, t: _Target, recs: tuple[ContainerRecommendation, ...],
                   requests: dict[str, dict[str, float]], limits: dict[str, dict[str, float]],
                   errors: list[str]) -> tuple[str, str, str]:
        decision = decide_update(t.spec, recs, requests, limits, t.applied)
        if decision.containers is None:
            return decision.rule, decision.reason, "none"
        try:
            await self.actuator.update_resources(ResourceUpdate(t.ref, t.spec.update_mode, decision.containers,
                                                                {"vpa": t.key, "recommendation": t.recommendation}))
        except ActuatorError as e:
            errors.append(f"updating resources: {e}")
            return decision.rule, decision.reason, "failed"
        t.applied = decision.wanted
        t.updates += 1
        return decision.rule, decision.reason, "dry-run" if self.actuator.dry_run else "updated"

    def recommendations(self) -> dict[str, dict[str, Any] | None]:
        """Each VPA's status.recommendation as Kubernetes would print it."""
        return {t.key: t.recommendation for t in self.targets}

    def history(self) -> list[dict[str, Any]]:
        return self.log.entries()

    def status(self) -> dict[str, Any]:
        return {
            "consumer": "vpa", "backend": self.actuator.name, "intervalSeconds": self.interval_s,
            "decisions": self.log.recorded,
            "targets": [{"vpa": t.key, "target": f"{t.ref.kind}/{t.ref.name}", "updateMode": t.spec.update_mode,
                         "recommendation": t.recommendation, "rule": (t.last or {}).get("rule"),
                         "lastSync": (t.last or {}).get("time"), "samplesFed": t.samples_fed,
                         "fedUntil": iso_time(t.fed_until_ms) if t.fed_until_ms else None,
                         "syncs": t.syncs, "updates": t.updates, "errors": t.errors} for t in self.targets],
        }
