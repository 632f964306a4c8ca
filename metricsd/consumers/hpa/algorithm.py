"""One HPA decision: inputs and state in, a Decision (with the next state) out. No I/O, no clock.

The order is upstream's reconcileAutoscaler: a target scaled to zero is left alone; a target
outside [min, max] is brought to the bound; otherwise every metric proposes a count
(computeReplicasForMetrics: the largest wins, and invalid metrics forbid a scale-down), the
proposal is stabilised and rate-limited (normalizeDesiredReplicasWithBehaviors). metricsd then
applies its own step limit, and tracks the "at max above target" alert. Behaviour is always
defaulted, as the autoscaling/v2 API server does for an object that sets it; upstream's older
no-behaviour path (scale-up capped at max(2x, 4)) is not reproduced.

A predictive HPA (`spec.metricsd.predictive`) also forecasts each metric's demand over its horizon
(`predict.py`); the replicas that forecast needs are a floor under the metrics' proposal, taken
before stabilisation. So a forecast can only raise the recommendation or hold the replicas there
are, never lower it, never beyond the maximum, and it changes nothing when it falls back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from metricsd.consumers.hpa.normalize import (
    Normalized,
    ScaleEvent,
    TimestampedRecommendation,
    apply_max_step,
    convert_with_behavior_rate,
    record_scale_event,
    stabilize,
)
from metricsd.consumers.hpa.predict import Forecast, forecast, predicted_replicas
from metricsd.consumers.hpa.replicas import (
    MetricError,
    MetricObservation,
    PodInfo,
    ReplicaProposal,
    Tolerances,
    external_replicas,
    history_replicas,
    plain_replicas,
    resource_replicas,
)
from metricsd.consumers.hpa.schedule import Limits, effective_limits
from metricsd.consumers.hpa.spec import ControllerSettings, HPASpec, MetricSpec, MetricTarget, Predictive

__all__ = [
    "Decision",
    "HPAInput",
    "HPAState",
    "MetricPrediction",
    "MetricProposal",
    "Prediction",
    "apply_scale",
    "decide",
]

Source = Literal["live", "history", "none"]


@dataclass(frozen=True)
class HPAState:
    """What one HPA carries from one decision to the next; the loop stores it between syncs."""

    recommendations: tuple[TimestampedRecommendation, ...] = ()
    scale_up_events: tuple[ScaleEvent, ...] = ()
    scale_down_events: tuple[ScaleEvent, ...] = ()
    at_max_above_target_since: float | None = None


@dataclass(frozen=True)
class HPAInput:
    """One sync's observations. `metrics` is keyed by MetricSpec.key; times are Unix seconds.

    current_replicas is the scale subresource's spec.replicas, status_replicas its status.replicas
    (used by External AverageValue targets; defaults to current_replicas). demand holds, per
    metric key, the workload's demand per closed hour (hour start ms -> mean total) that a
    predictive HPA forecasts from.
    """

    now: float
    current_replicas: int
    pods: Sequence[PodInfo] = ()
    metrics: Mapping[str, MetricObservation] = field(default_factory=dict)
    status_replicas: int | None = None
    demand: Mapping[str, Mapping[int, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class MetricProposal:
    """One metric's contribution, as shown in the decision history."""

    metric: str
    target: MetricTarget
    replicas: int | None
    usage_ratio: float | None
    current: float | None
    source: Source
    rule: str
    error: str | None = None


@dataclass(frozen=True)
class MetricPrediction:
    """One metric's forecast and what it asks for.

    capacity: what one replica carries at the target, in demand units (its request times the
    target utilisation, or the AverageValue); value: the weighted forecast peak in the target's unit
    at the current replica count (a utilisation percent, or a value per pod); replicas: the floor
    it asks for, None unless the forecast is usable.
    """

    metric: str
    forecast: Forecast
    capacity: float | None = None
    value: float | None = None
    replicas: int | None = None


@dataclass(frozen=True)
class Prediction:
    """The predictive part of one decision: the largest floor the metrics' forecasts ask for (None
    when none is usable: the reactive rule decides alone) and whether it raised the recommendation."""

    settings: Predictive
    metrics: tuple[MetricPrediction, ...]
    replicas: int | None
    raised: bool = False


@dataclass(frozen=True)
class Decision:
    """The outcome of one sync. `reason` is machine-readable (upstream condition reasons where one
    exists), `message` a sentence for people; `state` is the state to pass to the next decision."""

    current_replicas: int
    desired_replicas: int
    reason: str
    message: str
    proposals: tuple[MetricProposal, ...]
    metric_replicas: int | None
    used_history: bool
    alert: bool
    limits: Limits
    state: HPAState
    prediction: Prediction | None = None

    @property
    def rescale(self) -> bool:
        return self.desired_replicas != self.current_replicas


def decide(
    spec: HPASpec, inputs: HPAInput, state: HPAState, settings: ControllerSettings | None = None
) -> Decision:
    """Decide the replica count for one sync.

    The returned state records this recommendation and the alert timer but no scale event:
    call `apply_scale` once the backend has applied the change, as upstream stores its scale
    events only after a successful update.
    """
    settings = settings or ControllerSettings()
    now = inputs.now
    current = inputs.current_replicas
    limits = effective_limits(spec, now)
    tolerances = Tolerances(
        scale_down=_tolerance(spec.behavior.scale_down.tolerance, settings),
        scale_up=_tolerance(spec.behavior.scale_up.tolerance, settings),
    )
    proposals = tuple(_propose(spec, m, limits.targets[m.key], inputs, tolerances, settings) for m in spec.metrics)
    used_history = any(p.source == "history" for p in proposals)
    prediction = _predict(spec, limits, inputs, tolerances)
    alert_since, alert = _alert(spec, limits, current, proposals, state.at_max_above_target_since, now)
    state = replace(state, at_max_above_target_since=alert_since)

    def done(desired: int, reason: str, message: str, metric_replicas: int | None, st: HPAState) -> Decision:
        return Decision(current, desired, reason, message, proposals, metric_replicas, used_history, alert,
                        limits, st, prediction)

    if current == 0 and limits.min_replicas != 0:
        return done(0, "ScalingDisabled", "scaling is disabled since the replica count of the target is zero",
                    None, state)
    if current > limits.max_replicas or current < limits.min_replicas:
        bound = limits.max_replicas if current > limits.max_replicas else limits.min_replicas
        if current > limits.max_replicas:
            base = Normalized(bound, "AboveMaxReplicas", f"the current replica count is above the maximum {bound}")
        else:
            base = Normalized(bound, "BelowMinReplicas", f"the current replica count is below the minimum {bound}")
        final = apply_max_step(current, bound, spec.metricsd.max_step) or base
        return done(final.replicas, final.reason, _sentence(final, current, bound, limits), None, state)

    valid = [p for p in proposals if p.replicas is not None]
    metric_replicas = max((p.replicas for p in valid if p.replicas is not None), default=None)
    invalid = len(proposals) - len(valid)
    if metric_replicas is None or (invalid and metric_replicas < current):
        first = next(p for p in proposals if p.replicas is None)
        message = (f"invalid metrics ({invalid} invalid out of {len(proposals)}), first error is: "
                   f"{first.error}; keeping {current} replicas")
        return done(current, "InvalidMetrics", message, metric_replicas, state)

    wanted = metric_replicas
    if prediction is not None and prediction.replicas is not None and prediction.replicas > metric_replicas:
        wanted = prediction.replicas
        prediction = replace(prediction, raised=True)
    stabilized, recommendations = stabilize(
        current, wanted, state.recommendations, spec.behavior.scale_up, spec.behavior.scale_down, now
    )
    state = replace(state, recommendations=recommendations)
    rated = convert_with_behavior_rate(
        current,
        stabilized.replicas,
        limits.min_replicas,
        limits.max_replicas,
        state.scale_up_events,
        state.scale_down_events,
        spec.behavior.scale_up,
        spec.behavior.scale_down,
        now,
    )
    final = apply_max_step(current, rated.replicas, spec.metricsd.max_step) or rated
    if final is rated and rated.reason == "DesiredWithinRange":
        if stabilized.replicas != wanted:
            final = Normalized(rated.replicas, stabilized.reason, stabilized.message)
        elif wanted != metric_replicas:
            final = _predicted(spec, rated.replicas, current)
        elif rated.replicas == current and all(p.rule.endswith("WithinTolerance") for p in valid):
            final = Normalized(current, "WithinTolerance", "the metrics are within tolerance of their targets")
        elif rated.replicas == current and any(p.rule == "HistoryNoScaleDown" for p in valid):
            final = Normalized(current, "HistoryNoScaleDown",
                               "yesterday's numbers suggest fewer replicas, but the fallback may not scale down")
    return done(final.replicas, final.reason, _sentence(final, current, metric_replicas, limits),
                metric_replicas, state)


def apply_scale(spec: HPASpec, state: HPAState, previous: int, new: int, now: float) -> HPAState:
    """Record a scale change that the backend applied, for the behaviour policies' periods."""
    ups, downs = record_scale_event(
        state.scale_up_events, state.scale_down_events, spec.behavior.scale_up, spec.behavior.scale_down,
        previous, new, now,
    )
    return replace(state, scale_up_events=ups, scale_down_events=downs)


def _predict(spec: HPASpec, limits: Limits, inputs: HPAInput, tolerances: Tolerances) -> Prediction | None:
    """Each metric's forecast, and the largest floor the usable ones ask for; None when not opted in."""
    settings = spec.metricsd.predictive
    if settings is None:
        return None
    rows = tuple(_predict_metric(m, limits.targets[m.key], inputs, tolerances, settings, limits.max_replicas)
                 for m in spec.metrics if m.type != "External")
    floors = [r.replicas for r in rows if r.replicas is not None]
    return Prediction(settings, rows, max(floors) if floors else None)


def _predict_metric(metric: MetricSpec, target: MetricTarget, inputs: HPAInput, tolerances: Tolerances,
                    settings: Predictive, max_replicas: int) -> MetricPrediction:
    fc = forecast(inputs.demand.get(metric.key, {}), int(inputs.now * 1000), settings)
    per_pod = 1.0  # a forecast in demand units per pod becomes the target's unit through this
    if target.type == "Utilization":
        obs = inputs.metrics.get(metric.key)
        requests = [v for v in obs.requests.values() if v > 0] if obs is not None else []
        if not requests:
            return MetricPrediction(metric.key, replace(fc, usable=False, reason="NoRequests",
                                                        message="no pod reports a request to size replicas by"))
        per_pod = 100.0 / (sum(requests) / len(requests))
    capacity = target.value / per_pod
    current = inputs.current_replicas
    if fc.peak is None or current <= 0:
        return MetricPrediction(metric.key, fc, capacity)
    demand = fc.peak * settings.weight
    value = demand / current * per_pod
    if not fc.usable:
        return MetricPrediction(metric.key, fc, capacity, value)
    floor = predicted_replicas(demand, capacity, current, max_replicas, tolerances.scale_up)
    return MetricPrediction(metric.key, fc, capacity, value, floor)


def _predicted(spec: HPASpec, replicas: int, current: int) -> Normalized:
    """The reason when the forecast, not the metrics, set the recommendation."""
    predictive = spec.metricsd.predictive
    horizon = f"{predictive.horizon_seconds / 60:g} min" if predictive is not None else "its horizon"
    if replicas > current:
        return Normalized(replicas, "PredictedScaleUp", f"the forecast needs more replicas within {horizon}")
    return Normalized(replicas, "PredictionHolds", f"the forecast needs these replicas within {horizon}")


def _tolerance(value: float | None, settings: ControllerSettings) -> float:
    return settings.tolerance if value is None else value


def _sentence(final: Normalized, current: int, wanted: int | None, limits: Limits) -> str:
    wanted_text = f", metrics wanted {wanted}" if wanted is not None else ""
    schedule = f", schedule {limits.schedule}" if limits.schedule else ""
    return (f"{final.message}: {current} -> {final.replicas} replicas{wanted_text} "
            f"(bounds {limits.min_replicas}..{limits.max_replicas}{schedule})")


def _propose(
    spec: HPASpec,
    metric: MetricSpec,
    target: MetricTarget,
    inputs: HPAInput,
    tolerances: Tolerances,
    settings: ControllerSettings,
) -> MetricProposal:
    obs = inputs.metrics.get(metric.key)
    fallback = spec.metricsd.history_fallback
    error: str | None = None
    if obs is None:
        error = f"no observation for metric {metric.key}"
    elif not obs.available:
        error = f"metric {metric.key} is unavailable"
    elif fallback.enabled and metric.type != "External":
        error = _too_few_reporting(inputs.pods, obs, fallback.min_reporting_ratio)
    if error is None and obs is not None:
        try:
            live = _live(metric, target, inputs, obs, tolerances, settings)
            return MetricProposal(metric.key, target, live.replicas, live.usage_ratio, live.current, "live", live.rule)
        except MetricError as e:
            error = str(e)
    if fallback.enabled and obs is not None and obs.yesterday is not None:
        past = history_replicas(metric, target, inputs.current_replicas, inputs.pods, obs.yesterday, tolerances)
        replicas = past.replicas
        rule = f"History{past.rule}"
        if not fallback.allow_scale_down and replicas < inputs.current_replicas:
            replicas, rule = inputs.current_replicas, "HistoryNoScaleDown"
        return MetricProposal(metric.key, target, replicas, past.usage_ratio, past.current, "history", rule, error)
    return MetricProposal(metric.key, target, None, None, None, "none", "Invalid", error)


def _too_few_reporting(pods: Sequence[PodInfo], obs: MetricObservation, ratio: float) -> str | None:
    running = [p for p in pods if p.phase == "Running" and not p.deleting]
    if not running:
        return None
    reporting = sum(1 for p in running if p.name in obs.samples)
    if reporting < ratio * len(running):
        return f"only {reporting} of {len(running)} running pods reported"
    return None


def _live(
    metric: MetricSpec,
    target: MetricTarget,
    inputs: HPAInput,
    obs: MetricObservation,
    tolerances: Tolerances,
    settings: ControllerSettings,
) -> ReplicaProposal:
    current = inputs.current_replicas
    if metric.type in ("Resource", "ContainerResource"):
        if target.type == "Utilization":
            return resource_replicas(current, int(target.value), inputs.pods, obs, metric.name, tolerances,
                                     inputs.now, settings)
        return plain_replicas(current, target.value, inputs.pods, obs, metric.name, tolerances, inputs.now,
                              settings)
    if metric.type == "Pods":
        return plain_replicas(current, target.value, inputs.pods, obs, None, tolerances, inputs.now, settings)
    status = inputs.status_replicas if inputs.status_replicas is not None else current
    return external_replicas(current, status, target, inputs.pods, obs, tolerances)


def _alert(
    spec: HPASpec,
    limits: Limits,
    current: int,
    proposals: Sequence[MetricProposal],
    since: float | None,
    now: float,
) -> tuple[float | None, bool]:
    """Track how long the target has sat at its maximum with a metric above target."""
    above = any(p.usage_ratio is not None and p.usage_ratio > 1.0 for p in proposals)
    if current < limits.max_replicas or not above:
        return None, False
    started = now if since is None else since
    threshold = spec.metricsd.alert_at_max_for_seconds
    return started, threshold is not None and now - started >= threshold
