"""From a container's histograms to target / lower / upper bounds, capped by the VPA's policy.

Mirrors vertical-pod-autoscaler/pkg/recommender/logic: recommender.go
(CreatePodResourceRecommender: target P90, lower P50, upper P95, 15% margin, the pod minimum of
25 millicores and 250 MiB shared evenly by the containers) and estimator.go (percentileEstimator,
marginEstimator, confidenceMultiplier with getConfidence, minResourcesEstimator), and
pkg/utils/vpa/capping.go for minAllowed / maxAllowed, controlledResources and mode Off.
Amounts are whole millicores and bytes, truncated at each step as upstream's ResourceAmount is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from metricsd.consumers.quantity import format_cpu, format_memory
from metricsd.consumers.vpa.model import ContainerAggregate
from metricsd.consumers.vpa.spec import VPASpec

__all__ = [
    "ContainerRecommendation",
    "Estimate",
    "RecommenderConfig",
    "confidence_factor",
    "estimate",
    "recommend",
    "to_status",
]

# Upstream MaxResourceAmount: the cap for an infinite upper bound (no history yet).
_MAX_AMOUNT = 10**14


@dataclass(frozen=True)
class RecommenderConfig:
    target_cpu_percentile: float = 0.9
    lower_cpu_percentile: float = 0.5
    upper_cpu_percentile: float = 0.95
    target_memory_percentile: float = 0.9
    lower_memory_percentile: float = 0.5
    upper_memory_percentile: float = 0.95
    safety_margin: float = 0.15
    pod_min_cpu_millicores: float = 25.0
    pod_min_memory_mb: float = 250.0
    # (multiplier, exponent) of WithConfidenceMultiplier for the upper and lower bounds.
    upper_confidence: tuple[float, float] = (1.0, 1.0)
    lower_confidence: tuple[float, float] = (0.001, -2.0)


@dataclass(frozen=True)
class Estimate:
    """Uncapped amounts: CPU in millicores, memory in bytes."""

    target: Mapping[str, int]
    lower_bound: Mapping[str, int]
    upper_bound: Mapping[str, int]


@dataclass(frozen=True)
class ContainerRecommendation:
    """One container's entry of the VPA status, in cores and bytes."""

    container_name: str
    target: Mapping[str, float]
    lower_bound: Mapping[str, float]
    upper_bound: Mapping[str, float]
    uncapped_target: Mapping[str, float]


def _amount(value: float) -> int:
    """resourceAmountFromFloat: truncate, cap at the maximum, and read NaN (0 * inf) as zero."""
    if math.isnan(value):
        return 0
    if value > _MAX_AMOUNT:
        return _MAX_AMOUNT
    return int(value)


def confidence_factor(multiplier: float, exponent: float, confidence: float) -> float:
    """(1 + multiplier / confidence) ^ exponent; with no history at all, inf (upper) or 0 (lower)."""
    if confidence <= 0:
        return math.inf if exponent > 0 else 0.0
    return (1.0 + multiplier / confidence) ** exponent


def estimate(agg: ContainerAggregate, config: RecommenderConfig, container_count: int = 1) -> Estimate:
    """The three estimators of CreatePodResourceRecommender, each wrapped in the pod minimum."""
    confidence = agg.confidence()
    margin = 1.0 + config.safety_margin
    fraction = 1.0 / max(container_count, 1)
    minimum = {
        "cpu": _amount(_amount(config.pod_min_cpu_millicores) * fraction),
        "memory": _amount(_amount(config.pod_min_memory_mb * 1024 * 1024) * fraction),
    }

    def one(cpu_p: float, mem_p: float, conf: tuple[float, float] | None) -> dict[str, int]:
        amounts = {
            "cpu": _amount(agg.cpu.percentile(cpu_p) * 1000.0),
            "memory": _amount(agg.memory.percentile(mem_p)),
        }
        amounts = {k: _amount(v * margin) for k, v in amounts.items()}
        if conf is not None:
            factor = confidence_factor(conf[0], conf[1], confidence)
            amounts = {k: _amount(0.0 if v == 0 else v * factor) for k, v in amounts.items()}
        return {k: max(v, minimum[k]) for k, v in amounts.items()}

    return Estimate(
        target=one(config.target_cpu_percentile, config.target_memory_percentile, None),
        lower_bound=one(config.lower_cpu_percentile, config.lower_memory_percentile, config.lower_confidence),
        upper_bound=one(config.upper_cpu_percentile, config.upper_memory_percentile, config.upper_confidence),
    )


def _units(amounts: Mapping[str, int], keep: tuple[str, ...]) -> dict[str, float]:
    return {k: (v / 1000.0 if k == "cpu" else float(v)) for k, v in amounts.items() if k in keep}


def _cap(values: Mapping[str, float], lo: Mapping[str, float], hi: Mapping[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in values.items():
        if name in lo:
            value = max(value, lo[name])
        if name in hi:
            value = min(value, hi[name])
        out[name] = value
    return out


def recommend(
    spec: VPASpec, aggregates: Mapping[str, ContainerAggregate], config: RecommenderConfig | None = None
) -> tuple[ContainerRecommendation, ...]:
    """Recommendations for every container of the workload, sorted by container name.

    Containers whose policy mode is Off get none; resources not in controlledResources are left
    out; target and bounds are clamped to [minAllowed, maxAllowed], and uncappedTarget keeps the
    model's own answer so an operator can see what the caps hid.
    """
    config = config or RecommenderConfig()
    out: list[ContainerRecommendation] = []
    for name in sorted(aggregates):
        policy = spec.policy_for(name)
        if policy.mode == "Off":
            continue
        est = estimate(aggregates[name], config, len(aggregates))
        keep = policy.controlled_resources
        lo, hi = policy.min_allowed, policy.max_allowed
        out.append(
            ContainerRecommendation(
                container_name=name,
                target=_cap(_units(est.target, keep), lo, hi),
                lower_bound=_cap(_units(est.lower_bound, keep), lo, hi),
                upper_bound=_cap(_units(est.upper_bound, keep), lo, hi),
                uncapped_target=_units(est.target, keep),
            )
        )
    return tuple(out)


def to_status(recommendations: tuple[ContainerRecommendation, ...]) -> dict[str, Any]:
    """The VPA object's `status.recommendation`, with quantities as Kubernetes prints them."""

    def fmt(values: Mapping[str, float]) -> dict[str, str]:
        return {k: format_cpu(v) if k == "cpu" else format_memory(v) for k, v in values.items()}

    return {
        "recommendation": {
            "containerRecommendations": [
                {
                    "containerName": r.container_name,
                    "target": fmt(r.target),
                    "lowerBound": fmt(r.lower_bound),
                    "upperBound": fmt(r.upper_bound),
                    "uncappedTarget": fmt(r.uncapped_target),
                }
                for r in recommendations
            ]
        }
    }
