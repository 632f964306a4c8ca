"""From the metrics' proposal to the replica count to set: stabilisation, rate policies, bounds, step.

Mirrors pkg/controller/podautoscaler/horizontal.go: stabilizeRecommendationWithBehaviors,
convertDesiredReplicasWithBehaviorRate, calculateScaleUpLimitWithScalingRules,
calculateScaleDownLimitWithBehaviors and getReplicasChangePerPeriod. Upstream keeps the
recommendation and scale-event histories inside the controller and reads time.Now(); here both
are passed in and the updated history is returned, so every step is a function of its inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from metricsd.consumers.hpa.spec import MaxStep, ScalingRules

__all__ = [
    "Normalized",
    "ScaleEvent",
    "TimestampedRecommendation",
    "apply_max_step",
    "convert_with_behavior_rate",
    "record_scale_event",
    "replicas_change_per_period",
    "scale_down_limit",
    "scale_up_limit",
    "stabilize",
]


@dataclass(frozen=True)
class TimestampedRecommendation:
    replicas: int
    timestamp: float


@dataclass(frozen=True)
class ScaleEvent:
    """A scaling action that happened: how many replicas it added (or removed) and when."""

    replica_change: int
    timestamp: float


@dataclass(frozen=True)
class Normalized:
    replicas: int
    reason: str
    message: str


def stabilize(
    current: int,
    desired: int,
    recommendations: Sequence[TimestampedRecommendation],
    scale_up: ScalingRules,
    scale_down: ScalingRules,
    now: float,
) -> tuple[Normalized, tuple[TimestampedRecommendation, ...]]:
    """stabilizeRecommendationWithBehaviors: the result lies between the lowest recommendation in the
    scale-up window and the highest in the scale-down window, and as close to `current` as they allow.

    Returns the stabilised count and the recommendation history with `desired` recorded and the
    entries older than both windows dropped.
    """
    up_cutoff = now - scale_up.stabilization_window_seconds
    down_cutoff = now - scale_down.stabilization_window_seconds
    up_rec = desired
    down_rec = desired
    kept: list[TimestampedRecommendation] = []
    for rec in recommendations:
        if rec.timestamp > up_cutoff:
            up_rec = min(rec.replicas, up_rec)
        if rec.timestamp > down_cutoff:
            down_rec = max(rec.replicas, down_rec)
        if not (rec.timestamp < up_cutoff and rec.timestamp < down_cutoff):
            kept.append(rec)
    kept.append(TimestampedRecommendation(desired, now))
    result = max(current, up_rec)
    result = min(result, down_rec)
    if result == desired:
        return Normalized(result, "ReadyForNewScale", "recommended size matches current size"), tuple(kept)
    if desired >= current:
        reason = "ScaleUpStabilized"
        message = "recent recommendations were lower than current one, applying the lowest recent recommendation"
    else:
        reason = "ScaleDownStabilized"
        message = "recent recommendations were higher than current one, applying the highest recent recommendation"
    return Normalized(result, reason, message), tuple(kept)


def replicas_change_per_period(period_seconds: int, events: Sequence[ScaleEvent], now: float) -> int:
    """getReplicasChangePerPeriod: the replicas changed by events strictly inside the last period."""
    cutoff = now - period_seconds
    return sum(e.replica_change for e in events if e.timestamp > cutoff)


def scale_up_limit(
    current: int, up_events: Sequence[ScaleEvent], down_events: Sequence[ScaleEvent], rules: ScalingRules, now: float
) -> int:
    """calculateScaleUpLimitWithScalingRules: the most replicas the policies allow right now.

    Each policy measures from the replica count at the start of its period; Max picks the most
    permissive policy, Min the strictest, Disabled forbids scaling up.
    """
    if rules.select_policy == "Disabled":
        return current
    results: list[int] = []
    for policy in rules.policies:
        added = replicas_change_per_period(policy.period_seconds, up_events, now)
        deleted = replicas_change_per_period(policy.period_seconds, down_events, now)
        start = current - added + deleted
        if policy.type == "Pods":
            results.append(start + policy.value)
        else:
            # Rounded up, or a small target could never grow by a percentage.
            results.append(math.ceil(start * (1 + policy.value / 100)))
    if not results:
        return current
    return min(results) if rules.select_policy == "Min" else max(results)


def scale_down_limit(
    current: int, up_events: Sequence[ScaleEvent], down_events: Sequence[ScaleEvent], rules: ScalingRules, now: float
) -> int:
    """calculateScaleDownLimitWithBehaviors: the fewest replicas the policies allow right now."""
    if rules.select_policy == "Disabled":
        return current
    results: list[int] = []
    for policy in rules.policies:
        added = replicas_change_per_period(policy.period_seconds, up_events, now)
        deleted = replicas_change_per_period(policy.period_seconds, down_events, now)
        start = current - added + deleted
        if policy.type == "Pods":
            results.append(start - policy.value)
        else:
            results.append(int(start * (1 - policy.value / 100)))  # Go's int32() truncates
    if not results:
        return current
    return max(results) if rules.select_policy == "Min" else min(results)


def convert_with_behavior_rate(
    current: int,
    desired: int,
    min_replicas: int,
    max_replicas: int,
    up_events: Sequence[ScaleEvent],
    down_events: Sequence[ScaleEvent],
    scale_up: ScalingRules,
    scale_down: ScalingRules,
    now: float,
) -> Normalized:
    """convertDesiredReplicasWithBehaviorRate: apply the rate policies and the min/max bounds."""
    if desired > current:
        limit = max(scale_up_limit(current, up_events, down_events, scale_up, now), current)
        if max_replicas > limit:
            allowed, reason = limit, "ScaleUpLimit"
            message = "the desired replica count is increasing faster than the maximum scale rate"
        else:
            allowed, reason = max_replicas, "TooManyReplicas"
            message = "the desired replica count is more than the maximum replica count"
        if desired > allowed:
            return Normalized(allowed, reason, message)
    elif desired < current:
        limit = min(scale_down_limit(current, up_events, down_events, scale_down, now), current)
        if min_replicas < limit:
            allowed, reason = limit, "ScaleDownLimit"
            message = "the desired replica count is decreasing faster than the maximum scale rate"
        else:
            allowed, reason = min_replicas, "TooFewReplicas"
            message = "the desired replica count is less than the minimum replica count"
        if desired < allowed:
            return Normalized(allowed, reason, message)
    return Normalized(desired, "DesiredWithinRange", "the desired count is within the acceptable range")


def apply_max_step(current: int, desired: int, step: MaxStep) -> Normalized | None:
    """metricsd's step limit: at most `step` replicas per action. None when it does not bind."""
    if step.scale_up is not None and desired - current > step.scale_up:
        return Normalized(
            current + step.scale_up, "MaxStepLimit", f"the step is limited to {step.scale_up} added replicas per action"
        )
    if step.scale_down is not None and current - desired > step.scale_down:
        return Normalized(
            current - step.scale_down,
            "MaxStepLimit",
            f"the step is limited to {step.scale_down} removed replicas per action",
        )
    return None


def record_scale_event(
    up_events: Sequence[ScaleEvent],
    down_events: Sequence[ScaleEvent],
    scale_up: ScalingRules,
    scale_down: ScalingRules,
    previous: int,
    new: int,
    now: float,
) -> tuple[tuple[ScaleEvent, ...], tuple[ScaleEvent, ...]]:
    """storeScaleEvent: remember an applied change, forgetting events older than the longest policy period."""
    up_keep = max((p.period_seconds for p in scale_up.policies), default=0)
    down_keep = max((p.period_seconds for p in scale_down.policies), default=0)
    ups = [e for e in up_events if e.timestamp >= now - up_keep]
    downs = [e for e in down_events if e.timestamp >= now - down_keep]
    if new > previous:
        ups.append(ScaleEvent(new - previous, now))
    elif new < previous:
        downs.append(ScaleEvent(previous - new, now))
    return tuple(ups), tuple(downs)
