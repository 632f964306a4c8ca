"""The replica calculator for one metric: Kubernetes' rule, step for step.

Mirrors pkg/controller/podautoscaler/replica_calculator.go (GetResourceReplicas,
calcPlainMetricReplicas, GetExternalMetricReplicas, GetExternalPerPodMetricReplicas, groupPods)
and metrics/utilization.go (GetResourceUtilizationRatio, GetMetricUsageRatio), including its
integer arithmetic: values are milli-units (Quantity.MilliValue rounds up) and utilisation is a
whole percent, truncated. Matching the truncation matters at the tolerance edges, where a float
version would disagree with a real cluster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from metricsd.consumers.hpa.spec import ControllerSettings, MetricSpec, MetricTarget

__all__ = [
    "HistoryPoint",
    "MetricError",
    "MetricObservation",
    "PodInfo",
    "PodSample",
    "ReplicaProposal",
    "Tolerances",
    "external_replicas",
    "history_replicas",
    "plain_replicas",
    "ready_pod_count",
    "resource_replicas",
]

PodPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"]


class MetricError(Exception):
    """This metric cannot propose a replica count now (upstream: the metric is invalid)."""


@dataclass(frozen=True)
class PodInfo:
    """What the controller knows about one pod of the target, from its status.

    ready: the Ready condition's status, None when the pod has no Ready condition yet;
    ready_transition: that condition's lastTransitionTime; times are Unix seconds.
    """

    name: str
    phase: PodPhase = "Running"
    ready: bool | None = True
    ready_transition: float = 0.0
    start_time: float | None = 0.0
    deleting: bool = False


@dataclass(frozen=True)
class PodSample:
    """One pod's value for a metric: usage in base units (cores, bytes) or the Pods metric's value.

    timestamp / window describe the sample's collection window (metrics-server's Timestamp and
    Window); a None timestamp means the sample is newer than any readiness change.
    """

    value: float
    timestamp: float | None = None
    window: float = 30.0


@dataclass(frozen=True)
class HistoryPoint:
    """The metric at the same hour yesterday, in the target's unit, and the replicas it was measured on."""

    value: float
    replicas: int | None = None


@dataclass(frozen=True)
class MetricObservation:
    """Everything the loop gathered for one metric of the spec.

    samples: pod -> sample (Resource, ContainerResource, Pods); requests: pod -> request of the
    resource, summed over the pod's containers or for the named container (Resource kinds);
    external: the External metric's values; available: False when the query failed (no quorum);
    yesterday: the rollup value used by the history fallback.
    """

    samples: Mapping[str, PodSample] = field(default_factory=dict)
    requests: Mapping[str, float] = field(default_factory=dict)
    external: tuple[float, ...] = ()
    available: bool = True
    yesterday: HistoryPoint | None = None


@dataclass(frozen=True)
class Tolerances:
    """Per-direction tolerances (KEP-4951); upstream Tolerances.isWithin."""

    scale_down: float = 0.1
    scale_up: float = 0.1

    def is_within(self, ratio: float) -> bool:
        return (1.0 - self.scale_down) <= ratio <= (1.0 + self.scale_up)


@dataclass(frozen=True)
class ReplicaProposal:
    """One metric's answer. `current` is in the target's unit; `rule` says which branch decided."""

    replicas: int
    usage_ratio: float
    current: float
    rule: str


def _milli(value: float) -> int:
    """Quantity.MilliValue: milli-units rounded up (a tiny guard absorbs float noise like 0.1*3)."""
    return math.ceil(round(value * 1000.0, 6))


def ready_pod_count(pods: Sequence[PodInfo]) -> int:
    """getReadyPodsCount: running pods whose Ready condition is true."""
    return sum(1 for p in pods if p.phase == "Running" and p.ready is True)


def _group_pods(
    pods: Sequence[PodInfo],
    samples: Mapping[str, PodSample],
    cpu: bool,
    now: float,
    settings: ControllerSettings,
) -> tuple[int, set[str], set[str], set[str]]:
    """groupPods: (ready count, unready, missing, ignored). Readiness only matters for CPU."""
    ready = 0
    unready: set[str] = set()
    missing: set[str] = set()
    ignored: set[str] = set()
    for pod in pods:
        if pod.deleting or pod.phase == "Failed":
            ignored.add(pod.name)
            continue
        if pod.phase == "Pending":
            unready.add(pod.name)
            continue
        sample = samples.get(pod.name)
        if sample is None:
            missing.add(pod.name)
            continue
        if cpu:
            if pod.ready is None or pod.start_time is None:
                is_unready = True
            elif pod.start_time + settings.cpu_initialization_seconds > now:
                # Still initialising: ignore the sample if the pod is unready or no full metric
                # window was collected since the last readiness transition.
                stamp = now if sample.timestamp is None else sample.timestamp
                is_unready = pod.ready is False or stamp < pod.ready_transition + sample.window
            else:
                # Ignore it if it is unready and has never been ready.
                is_unready = (
                    pod.ready is False
                    and pod.start_time + settings.initial_readiness_delay_seconds > pod.ready_transition
                )
            if is_unready:
                unready.add(pod.name)
                continue
        ready += 1
    return ready, unready, missing, ignored


def _utilization_ratio(
    metrics: Mapping[str, int], requests: Mapping[str, int], target: int
) -> tuple[float, int]:
    """GetResourceUtilizationRatio: whole-percent utilisation of the summed requests."""
    metrics_total = 0
    requests_total = 0
    for pod, value in metrics.items():
        if pod in requests:
            metrics_total += value
            requests_total += requests[pod]
    if requests_total == 0:
        raise MetricError("no metrics returned matched known pods")
    utilization = metrics_total * 100 // requests_total
    return utilization / target, utilization


def _usage_ratio(metrics: Mapping[str, int], target: int) -> tuple[float, int]:
    """GetMetricUsageRatio: the integer mean per pod, in milli-units."""
    current = sum(metrics.values()) // len(metrics)
    return current / target, current


def resource_replicas(
    current_replicas: int,
    target_utilization: int,
    pods: Sequence[PodInfo],
    obs: MetricObservation,
    resource: str,
    tolerances: Tolerances,
    now: float,
    settings: ControllerSettings,
) -> ReplicaProposal:
    """GetResourceReplicas: a Resource metric with an averageUtilization target."""
    if not pods:
        raise MetricError("no pods returned by selector while calculating replica count")
    ready, unready, missing, ignored = _group_pods(pods, obs.samples, resource == "cpu", now, settings)
    metrics = {p.name: _milli(obs.samples[p.name].value) for p in pods if p.name in obs.samples}
    for name in ignored | unready:
        metrics.pop(name, None)
    if not metrics:
        raise MetricError("did not receive metrics for targeted pods (pods might be unready)")
    requests: dict[str, int] = {}
    for pod in pods:
        if pod.name not in obs.requests:
            raise MetricError(f"missing request for {resource} in pod {pod.name}")
        requests[pod.name] = _milli(obs.requests[pod.name])

    ratio, utilization = _utilization_ratio(metrics, requests, target_utilization)
    scale_up_with_unready = bool(unready) and ratio > 1.0
    if not scale_up_with_unready and not missing:
        if tolerances.is_within(ratio):
            return ReplicaProposal(current_replicas, ratio, utilization, "WithinTolerance")
        return ReplicaProposal(math.ceil(ratio * ready), ratio, utilization, "Scaled")

    if missing:
        if ratio < 1.0:
            # Scaling down: a pod without metrics is assumed to use its whole request (or the
            # target, for targets above 100%), so it cannot drag the average down.
            fallback = max(100, target_utilization)
            for name in missing:
                metrics[name] = requests[name] * fallback // 100
        elif ratio > 1.0:
            for name in missing:
                metrics[name] = 0
    if scale_up_with_unready:
        for name in unready:
            metrics[name] = 0

    new_ratio, _ = _utilization_ratio(metrics, requests, target_utilization)
    return _rebalanced(current_replicas, ratio, new_ratio, len(metrics), utilization, tolerances)


def _rebalanced(
    current_replicas: int, ratio: float, new_ratio: float, count: int, current: float, tolerances: Tolerances
) -> ReplicaProposal:
    """The tail shared by GetResourceReplicas and calcPlainMetricReplicas after filling in pods."""
    if tolerances.is_within(new_ratio):
        return ReplicaProposal(current_replicas, new_ratio, current, "WithinTolerance")
    if (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return ReplicaProposal(current_replicas, new_ratio, current, "DirectionFlipped")
    new_replicas = math.ceil(new_ratio * count)
    if (new_ratio < 1.0 and new_replicas > current_replicas) or (new_ratio > 1.0 and new_replicas < current_replicas):
        return ReplicaProposal(current_replicas, new_ratio, current, "DirectionFlipped")
    return ReplicaProposal(new_replicas, new_ratio, current, "Scaled")


def plain_replicas(
    current_replicas: int,
    target_value: float,
    pods: Sequence[PodInfo],
    obs: MetricObservation,
    resource: str | None,
    tolerances: Tolerances,
    now: float,
    settings: ControllerSettings,
) -> ReplicaProposal:
    """calcPlainMetricReplicas: a per-pod AverageValue target (Pods metrics, or Resource averageValue).

    `resource` is the resource name for Resource metrics (CPU readiness rules apply), None for Pods.
    """
    if not pods:
        raise MetricError("no pods returned by selector while calculating replica count")
    target = _milli(target_value)
    ready, unready, missing, ignored = _group_pods(pods, obs.samples, resource == "cpu", now, settings)
    metrics = {p.name: _milli(obs.samples[p.name].value) for p in pods if p.name in obs.samples}
    for name in ignored | unready:
        metrics.pop(name, None)
    if not metrics:
        raise MetricError("did not receive metrics for targeted pods (pods might be unready)")
    ratio, usage = _usage_ratio(metrics, target)
    current = usage / 1000.0
    scale_up_with_unready = bool(unready) and ratio > 1.0
    if not scale_up_with_unready and not missing:
        if tolerances.is_within(ratio):
            return ReplicaProposal(current_replicas, ratio, current, "WithinTolerance")
        return ReplicaProposal(math.ceil(ratio * ready), ratio, current, "Scaled")
    if missing:
        if ratio < 1.0:
            for name in missing:
                metrics[name] = target
        elif ratio > 1.0:
            for name in missing:
                metrics[name] = 0
    if scale_up_with_unready:
        for name in unready:
            metrics[name] = 0
    new_ratio, _ = _usage_ratio(metrics, target)
    return _rebalanced(current_replicas, ratio, new_ratio, len(metrics), current, tolerances)


def external_replicas(
    current_replicas: int,
    status_replicas: int,
    target: MetricTarget,
    pods: Sequence[PodInfo],
    obs: MetricObservation,
    tolerances: Tolerances,
) -> ReplicaProposal:
    """GetExternalMetricReplicas (Value) and GetExternalPerPodMetricReplicas (AverageValue)."""
    if not obs.external:
        raise MetricError("no metrics returned from external metrics API")
    usage = sum(_milli(v) for v in obs.external)
    target_milli = _milli(target.value)
    if target.type == "AverageValue":
        if status_replicas <= 0:
            raise MetricError("no replicas to average an external metric over")
        ratio = usage / (target_milli * status_replicas)
        if tolerances.is_within(ratio):
            return ReplicaProposal(status_replicas, ratio, usage / 1000.0, "WithinTolerance")
        return ReplicaProposal(math.ceil(usage / target_milli), ratio, usage / 1000.0, "Scaled")
    ratio = usage / target_milli
    return _usage_ratio_replicas(current_replicas, ready_pod_count(pods), ratio, usage / 1000.0, tolerances)


def _usage_ratio_replicas(
    current_replicas: int, ready: int, ratio: float, current: float, tolerances: Tolerances
) -> ReplicaProposal:
    """getUsageRatioReplicaCount: scale the ready pods by the ratio; from zero, scale to ceil(ratio)."""
    if current_replicas == 0:
        return ReplicaProposal(math.ceil(ratio), ratio, current, "Scaled")
    if tolerances.is_within(ratio):
        return ReplicaProposal(current_replicas, ratio, current, "WithinTolerance")
    return ReplicaProposal(math.ceil(ratio * ready), ratio, current, "Scaled")


def history_replicas(
    spec: MetricSpec,
    target: MetricTarget,
    current_replicas: int,
    pods: Sequence[PodInfo],
    point: HistoryPoint,
    tolerances: Tolerances,
) -> ReplicaProposal:
    """Replicas from the same hour yesterday, when live data is missing (metricsd's addition).

    Yesterday's per-pod value times the replicas it was measured on is yesterday's total load; the
    proposal is the replica count that carries that load at the target. Without the replica count,
    the ready pods stand in, as upstream's getUsageRatioReplicaCount does. Totals (External Value)
    use upstream's rule for that target unchanged.
    """
    ratio = point.value / target.value
    if spec.type == "External" and target.type == "Value":
        return _usage_ratio_replicas(current_replicas, ready_pod_count(pods), ratio, point.value, tolerances)
    base = point.replicas if point.replicas is not None else ready_pod_count(pods) or current_replicas
    wanted = ratio * base
    relative = wanted / current_replicas if current_replicas else math.inf
    if current_replicas and tolerances.is_within(relative):
        return ReplicaProposal(current_replicas, relative, point.value, "WithinTolerance")
    return ReplicaProposal(math.ceil(round(wanted, 9)), relative, point.value, "Scaled")
