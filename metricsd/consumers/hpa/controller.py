"""The HPA controller loop: observe through a MetricsBackend, `decide`, act through an Actuator.

One sync per HPA every `interval_s` (15 s, the kube-controller-manager default). The pure
`decide` holds every rule; this shell only gathers inputs, keeps each HPA's state between syncs,
applies the decision, raises the at-max alert once when it starts, and records every decision.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from metricsd.clock import Clock
from metricsd.consumers.actuators.base import Actuator, ActuatorError, ScaleRequest, WorkloadRef
from metricsd.consumers.history import DecisionLog, iso_time
from metricsd.consumers.hpa.algorithm import Decision, HPAInput, HPAState, Prediction, apply_scale, decide
from metricsd.consumers.hpa.observe import HPAObserver, ObserveSettings
from metricsd.consumers.hpa.replicas import MetricObservation, PodInfo
from metricsd.consumers.hpa.spec import ControllerSettings, HPASpec
from metricsd.consumers.wording import hpa_entry_why
from metricsd.rpc.backend import BadRequest, MetricsBackend, Unavailable

__all__ = ["HPAController", "HPAControllerSettings"]

log = logging.getLogger("metricsd.consumers.hpa")


@dataclass(frozen=True)
class HPAControllerSettings:
    controller: ControllerSettings = field(default_factory=ControllerSettings)
    observe: ObserveSettings = field(default_factory=ObserveSettings)
    history: int = 500

    @property
    def interval_s(self) -> float:
        return self.controller.sync_period_seconds


@dataclass
class _Target:
    spec: HPASpec
    ref: WorkloadRef
    state: HPAState = field(default_factory=HPAState)
    pods: list[str] = field(default_factory=list)
    alerting: bool = False
    alerts_total: int = 0
    syncs: int = 0
    scales: int = 0
    errors: int = 0
    last: dict[str, Any] | None = None


class HPAController:
    """Not safe to share across event loops; `sync_once` must not run concurrently with itself."""

    name = "hpa"

    def __init__(
        self,
        specs: Sequence[HPASpec],
        backend: MetricsBackend,
        actuator: Actuator,
        clock: Clock,
        settings: HPAControllerSettings | None = None,
        alerts: Actuator | None = None,
    ) -> None:
        self.settings = settings or HPAControllerSettings()
        self.backend = backend
        self.actuator = actuator
        self.alerts = alerts or actuator
        self.clock = clock
        self.observer = HPAObserver(backend, self.settings.observe)
        self.log = DecisionLog(self.settings.history)
        self.targets = [
            _Target(s, WorkloadRef(s.namespace, s.scale_target_ref.kind, s.scale_target_ref.name,
                                   s.scale_target_ref.api_version))
            for s in specs
        ]

    @property
    def interval_s(self) -> float:
        return self.settings.interval_s

    async def sync_once(self) -> list[dict[str, Any]]:
        """One sync of every HPA; returns the decisions recorded."""
        return [await self.sync_target(t) for t in self.targets]

    async def sync_target(self, t: _Target) -> dict[str, Any]:
        now_ms = self.clock.now_ms()
        now = now_ms / 1000.0
        t.syncs += 1
        errors: list[str] = []
        try:
            t.pods = await self.observer.pods(t.spec, now_ms)
        except (Unavailable, BadRequest) as e:
            errors.append(f"listing pods: {e}; using the last {len(t.pods)} known")
        metrics = {m.key: await self.observer.observe(t.spec, m, now_ms) for m in t.spec.metrics}
        demand: dict[str, dict[int, float]] = {}
        if t.spec.metricsd.predictive is not None:
            for m in t.spec.metrics:
                if m.type == "External":
                    continue
                try:
                    demand[m.key] = await self.observer.demand(t.spec, m, now_ms)
                except (Unavailable, BadRequest) as e:
                    errors.append(f"reading the hourly demand of {m.key}: {e}")
        # Kubernetes lists a target's pods and ignores metrics of pods it does not know; without
        # requests series (a Pods metric only), the pods reporting the metric stand in.
        pods = t.pods or sorted(set().union(*(o.samples for o in metrics.values())))
        current: int | None = None
        try:
            current = await self.actuator.get_scale(t.ref)
        except ActuatorError as e:
            errors.append(f"reading the scale: {e}")
        if current is None and pods:
            current = len(pods)
        if current is None:
            message = f"no pods of {t.ref} report metrics and the backend does not know its scale"
            return self._record(t, now_ms, self._entry(t, now_ms, None, "NoPods", message, metrics, errors))
        decision = decide(t.spec, HPAInput(now, current, [PodInfo(p) for p in pods], metrics, demand=demand),
                          t.state, self.settings.controller)
        t.state = decision.state
        entry = self._entry(t, now_ms, decision, decision.reason, decision.message, metrics, errors)
        if decision.rescale:
            entry["result"]["action"] = await self._scale(t, decision, entry, now)
        if decision.alert and not t.alerting:
            t.alerts_total += 1
            entry["result"]["alertRaised"] = True
            log.warning("%s has been at its maximum of %d replicas above target since %s", entry["hpa"],
                        decision.limits.max_replicas, iso_time(int((t.state.at_max_above_target_since or now) * 1000)))
            try:
                await self.alerts.publish("hpa.alert", entry)
            except ActuatorError as e:
                entry["result"]["errors"].append(f"sending the alert: {e}")
        t.alerting = decision.alert
        return self._record(t, now_ms, entry)

    async def _scale(self, t: _Target, decision: Decision, entry: dict[str, Any], now: float) -> str:
        request = ScaleRequest(t.ref, decision.current_replicas, decision.desired_replicas, entry)
        try:
            await self.actuator.scale(request)
        except ActuatorError as e:
            entry["result"]["errors"].append(f"scaling: {e}")
            return "failed"
        if self.actuator.dry_run:
            return "dry-run"
        t.scales += 1
        t.state = apply_scale(t.spec, t.state, decision.current_replicas, decision.desired_replicas, now)
        return "scaled"

    def _entry(self, t: _Target, now_ms: int, decision: Decision | None, rule: str, message: str,
               metrics: dict[str, MetricObservation], errors: list[str]) -> dict[str, Any]:
        proposals = {p.metric: p for p in decision.proposals} if decision is not None else {}
        prediction = decision.prediction if decision is not None else None
        predicted = _metric_predictions(prediction)
        rows = []
        for m in t.spec.metrics:
            obs = metrics.get(m.key)
            p = proposals.get(m.key)
            target = p.target if p is not None else m.target
            rows.append({
                "metric": m.key, "target": {"type": target.type, "value": target.value},
                "current": p.current if p else None, "usageRatio": p.usage_ratio if p else None,
                "replicas": p.replicas if p else None, "source": p.source if p else "none",
                "rule": p.rule if p else None, "error": p.error if p else None,
                "podsReporting": len(obs.samples) if obs else 0, "available": obs.available if obs else False,
            })
            if m.key in predicted:
                rows[-1]["prediction"] = predicted[m.key]
        result: dict[str, Any] = {"action": "none", "errors": list(errors)}
        if decision is not None:
            result.update({
                "desiredReplicas": decision.desired_replicas, "metricReplicas": decision.metric_replicas,
                "rescale": decision.rescale, "usedHistory": decision.used_history, "alert": decision.alert,
                "minReplicas": decision.limits.min_replicas, "maxReplicas": decision.limits.max_replicas,
                "schedule": decision.limits.schedule,
            })
            if prediction is not None:
                result["prediction"] = _prediction(prediction)
        entry = {
            "time": iso_time(now_ms), "timeMs": now_ms, "consumer": "hpa",
            "hpa": f"{t.spec.namespace}/{t.spec.name}", "target": f"{t.ref.kind}/{t.ref.name}",
            "inputs": {"currentReplicas": decision.current_replicas if decision else None, "pods": len(t.pods),
                       "metrics": rows},
            "rule": rule, "message": message, "result": result,
        }
        entry["why"] = hpa_entry_why(entry, t.spec.min_replicas, t.spec.max_replicas)  # the rule in words
        return entry

    def _record(self, t: _Target, now_ms: int, entry: dict[str, Any]) -> dict[str, Any]:
        if entry["result"]["errors"]:
            t.errors += 1
        t.last = self.log.record(entry)
        return t.last

    def history(self) -> list[dict[str, Any]]:
        """Every decision kept, oldest first, JSON-ready."""
        return self.log.entries()

    def status(self) -> dict[str, Any]:
        """Per HPA: the last decision and counters (syncs, scales, errors, alerts), JSON-ready."""
        targets = []
        for t in self.targets:
            last = t.last or {}
            result = last.get("result", {})
            targets.append({
                "hpa": f"{t.spec.namespace}/{t.spec.name}", "target": f"{t.ref.kind}/{t.ref.name}",
                "minReplicas": t.spec.min_replicas, "maxReplicas": t.spec.max_replicas,
                "currentReplicas": last.get("inputs", {}).get("currentReplicas"),
                "desiredReplicas": result.get("desiredReplicas"), "schedule": result.get("schedule"),
                "rule": last.get("rule"), "message": last.get("message"), "why": last.get("why"),
                "lastSync": last.get("time"),
                "alerting": t.alerting, "alertsTotal": t.alerts_total, "syncs": t.syncs, "scales": t.scales,
                "errors": t.errors,
            })
            if "prediction" in result:
                targets[-1]["prediction"] = result["prediction"]
        return {"consumer": "hpa", "backend": self.actuator.name, "intervalSeconds": self.interval_s,
                "decisions": self.log.recorded, "targets": targets}


def _prediction(p: Prediction) -> dict[str, Any]:
    """The decision's predictive part for the history and status: whether a forecast was in use
    (`active`), the floor it asked for, and, when it fell back, the first metric's reason and error."""
    usable = [m for m in p.metrics if m.forecast.usable]
    first = usable[0] if usable else (p.metrics[0] if p.metrics else None)
    return {
        "method": p.settings.method, "horizonSeconds": p.settings.horizon_seconds, "weight": p.settings.weight,
        "active": bool(usable), "replicas": p.replicas, "raised": p.raised,
        "reason": first.forecast.reason if first else "NoMetrics",
        "message": first.forecast.message if first else "no metric can be forecast",
        "error": first.forecast.error if first else None,
    }


def _metric_predictions(p: Prediction | None) -> dict[str, dict[str, Any]]:
    """Per metric key: the forecast in demand units (now and its peak within the horizon), what it
    means in the target's unit at the current replicas, the floor it asks for and its recent error."""
    if p is None:
        return {}
    out = {}
    for m in p.metrics:
        fc = m.forecast
        out[m.metric] = {
            "usable": fc.usable, "reason": fc.reason, "message": fc.message, "error": fc.error,
            "demandNow": fc.now, "demandPeak": fc.peak,
            "peakAt": iso_time(fc.peak_at_ms) if fc.peak_at_ms is not None else None,
            "capacityPerReplica": m.capacity, "value": m.value, "replicas": m.replicas, "days": list(fc.days),
        }
    return out
