"""The whole HPA decision: several metrics, stabilisation, behaviour policies, bounds, and metricsd's
schedules, step limit, history fallback and alert. Numbers worked by hand from Kubernetes' rules.

Unless a case says otherwise: CPU target 50%, requests 1 core per pod, bounds 1..100, default
behaviour (scale-up 4 pods or 100% per 15 s; scale-down window 300 s, 100% per 15 s).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from metricsd.consumers.hpa.algorithm import HPAInput, HPAState, apply_scale, decide
from metricsd.consumers.hpa.normalize import ScaleEvent, TimestampedRecommendation
from metricsd.consumers.hpa.parse import parse_hpa
from metricsd.consumers.hpa.replicas import HistoryPoint, MetricObservation, PodInfo, PodSample
from metricsd.consumers.hpa.spec import HPASpec

# 2024-01-01 12:00:00 UTC, a Monday: 20:00 at UTC+08:00.
NOW = 1_704_110_400.0
CPU = "Resource/cpu"
RPS = "Pods/requests_per_second"


def make_spec(**spec_fields: Any) -> HPASpec:
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
        "minReplicas": 1,
        "maxReplicas": 100,
        "metrics": [{"type": "Resource",
                     "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}],
    }
    spec.update(spec_fields)
    return parse_hpa({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                      "metadata": {"name": "web", "namespace": "shop"}, "spec": spec})


CPU_METRIC = {"type": "Resource",
              "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}
RPS_METRIC = {"type": "Pods", "pods": {"metric": {"name": "requests_per_second"},
                                       "target": {"type": "AverageValue", "averageValue": "100"}}}


def pods(n: int) -> list[PodInfo]:
    return [PodInfo(f"p{i}", start_time=NOW - 3600, ready_transition=NOW - 3500) for i in range(n)]


def cpu(n: int, usage: float, reporting: int | None = None) -> MetricObservation:
    names = [p.name for p in pods(n)]
    return MetricObservation(
        samples={name: PodSample(usage) for name in names[: reporting if reporting is not None else n]},
        requests=dict.fromkeys(names, 1.0),
    )


def inputs(current: int, **metrics: MetricObservation) -> HPAInput:
    return HPAInput(now=NOW, current_replicas=current, pods=pods(current),
                    metrics={k.replace("_", "/", 1): v for k, v in metrics.items()})


def rps(n: int, value: float) -> MetricObservation:
    return MetricObservation(samples={p.name: PodSample(value) for p in pods(n)})


def rec(replicas: int, age: float) -> TimestampedRecommendation:
    return TimestampedRecommendation(replicas, NOW - age)


CASES = [
    pytest.param(make_spec(metrics=[CPU_METRIC, RPS_METRIC]),
                 inputs(4, Resource_cpu=cpu(4, 0.8), Pods_requests_per_second=rps(4, 120)),
                 HPAState(), 7, "DesiredWithinRange",
                 id="takes the largest proposal: cpu wants 7, requests per second want 5"),
    pytest.param(make_spec(metrics=[CPU_METRIC, RPS_METRIC]),
                 inputs(4, Resource_cpu=cpu(4, 0.2), Pods_requests_per_second=MetricObservation(available=False)),
                 HPAState(), 4, "InvalidMetrics",
                 id="refuses to scale down while another metric is invalid"),
    pytest.param(make_spec(metrics=[CPU_METRIC, RPS_METRIC]),
                 inputs(4, Resource_cpu=cpu(4, 0.8), Pods_requests_per_second=MetricObservation(available=False)),
                 HPAState(), 7, "DesiredWithinRange",
                 id="still scales up while another metric is invalid"),
    pytest.param(make_spec(), inputs(4, Resource_cpu=cpu(4, 0.54)), HPAState(), 4, "WithinTolerance",
                 id="holds the count when every metric is within tolerance"),
    pytest.param(make_spec(), inputs(8, Resource_cpu=cpu(8, 0.1)),
                 HPAState(recommendations=(rec(6, 100), rec(5, 200), rec(9, 400))), 6, "ScaleDownStabilized",
                 id="scale-down takes the highest recommendation of the last 300 s: 6, not the 9 from 400 s ago"),
    pytest.param(make_spec(behavior={"scaleUp": {"stabilizationWindowSeconds": 60}}),
                 inputs(4, Resource_cpu=cpu(4, 0.8)), HPAState(recommendations=(rec(5, 30),)), 5,
                 "ScaleUpStabilized", id="scale-up takes the lowest recommendation of its window"),
    pytest.param(make_spec(), inputs(2, Resource_cpu=cpu(2, 5.0)), HPAState(), 6, "ScaleUpLimit",
                 id="limits a scale-up from 2 to max(2 + 4 pods, 2 * 200%) = 6 per 15 s by default"),
    pytest.param(make_spec(), inputs(10, Resource_cpu=cpu(10, 2.5)), HPAState(), 20, "ScaleUpLimit",
                 id="limits a scale-up from 10 to max(14, 20) = 20 by default"),
    pytest.param(make_spec(), inputs(6, Resource_cpu=cpu(6, 2.0)),
                 HPAState(scale_up_events=(ScaleEvent(4, NOW - 10),)), 6, "ScaleUpLimit",
                 id="counts a scale event 10 s ago against the 15 s period: the period started at 2 so 6 is the cap"),
    pytest.param(make_spec(), inputs(6, Resource_cpu=cpu(6, 2.0)),
                 HPAState(scale_up_events=(ScaleEvent(4, NOW - 20),)), 12, "ScaleUpLimit",
                 id="forgets a scale event older than the period"),
    pytest.param(make_spec(behavior={"scaleUp": {"selectPolicy": "Min", "policies": [
                     {"type": "Pods", "value": 4, "periodSeconds": 60},
                     {"type": "Percent", "value": 100, "periodSeconds": 60}]}}),
                 inputs(10, Resource_cpu=cpu(10, 2.5)), HPAState(), 14, "ScaleUpLimit",
                 id="the Min select policy takes the strictest policy: min(14, 20) = 14"),
    pytest.param(make_spec(behavior={"scaleDown": {"selectPolicy": "Disabled"}}),
                 inputs(10, Resource_cpu=cpu(10, 0.1)), HPAState(), 10, "ScaleDownLimit",
                 id="the Disabled select policy forbids scaling down"),
    pytest.param(make_spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 0, "policies": [
                     {"type": "Pods", "value": 2, "periodSeconds": 60}]}}),
                 inputs(10, Resource_cpu=cpu(10, 0.1)),
                 HPAState(scale_down_events=(ScaleEvent(1, NOW - 30),)), 9, "ScaleDownLimit",
                 id="a Pods scale-down policy counts from the period start: 11 - 2 = 9"),
    pytest.param(make_spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 0, "policies": [
                     {"type": "Percent", "value": 50, "periodSeconds": 60}]}}),
                 inputs(5, Resource_cpu=cpu(5, 0.01)), HPAState(), 2, "ScaleDownLimit",
                 id="a Percent scale-down policy truncates: int(5 * 0.5) = 2"),
    pytest.param(make_spec(maxReplicas=10), inputs(8, Resource_cpu=cpu(8, 1.0)), HPAState(), 10,
                 "TooManyReplicas", id="clamps to maxReplicas"),
    pytest.param(make_spec(minReplicas=3), inputs(5, Resource_cpu=cpu(5, 0.05)), HPAState(), 3,
                 "TooFewReplicas", id="clamps to minReplicas"),
    pytest.param(make_spec(maxReplicas=10), inputs(15, Resource_cpu=cpu(15, 0.05)), HPAState(), 10,
                 "AboveMaxReplicas", id="brings a target above its maximum straight to the maximum"),
    pytest.param(make_spec(minReplicas=2), inputs(0), HPAState(), 0, "ScalingDisabled",
                 id="leaves a target scaled to zero alone"),
    pytest.param(make_spec(metricsd={"maxStep": {"scaleUp": 2}}), inputs(4, Resource_cpu=cpu(4, 0.8)),
                 HPAState(), 6, "MaxStepLimit", id="our maxStep lets one action add at most 2 replicas"),
    pytest.param(make_spec(metricsd={"maxStep": {"scaleDown": 1}}), inputs(4, Resource_cpu=cpu(4, 0.05)),
                 HPAState(), 3, "MaxStepLimit", id="our maxStep lets one action remove at most 1 replica"),
]


@pytest.mark.parametrize(("spec", "given", "state", "want", "reason"), CASES)
def test_decision_rules(spec: HPASpec, given: HPAInput, state: HPAState, want: int, reason: str) -> None:
    decision = decide(spec, given, state)
    assert (decision.desired_replicas, decision.reason) == (want, reason), decision.message


EVENING = {"schedules": [{"name": "evening", "start": "19:00", "end": "23:00", "utcOffset": "+08:00",
                          "minReplicas": 10, "targets": {"cpu": {"averageUtilization": 40}}}]}


@pytest.mark.parametrize(
    ("now", "current", "usage", "want", "reason"),
    [
        pytest.param(NOW, 4, 0.2, 10, "BelowMinReplicas",
                     id="a schedule raises the floor to 10 inside 19:00-23:00 at UTC+08:00"),
        pytest.param(NOW, 10, 0.6, 15, "DesiredWithinRange",
                     id="a schedule's target of 40% turns 60% into ceil(1.5 * 10) = 15"),
        pytest.param(NOW + 4 * 3600, 10, 0.6, 12, "DesiredWithinRange",
                     id="outside the window the spec's 50% target applies: ceil(1.2 * 10) = 12"),
    ],
)
def test_schedules(now: float, current: int, usage: float, want: int, reason: str) -> None:
    spec = make_spec(metricsd=EVENING)
    given = replace(inputs(current, Resource_cpu=cpu(current, usage)), now=now)
    decision = decide(spec, given, HPAState())
    assert (decision.desired_replicas, decision.reason) == (want, reason), decision.message


FALLBACK = {"historyFallback": {"enabled": True, "minReportingRatio": 0.5}}


@pytest.mark.parametrize(
    ("extensions", "target", "observation", "want", "reason", "used_history"),
    [
        pytest.param(FALLBACK, 45, MetricObservation(available=False, yesterday=HistoryPoint(90, 4)), 8,
                     "DesiredWithinRange", True,
                     id="uses the same hour yesterday when the live metric is unavailable: 90% on 4 pods is 8 at 45%"),
        pytest.param(FALLBACK, 50, replace(cpu(4, 0.9, reporting=1), yesterday=HistoryPoint(75, 4)), 6,
                     "DesiredWithinRange", True,
                     id="uses history when fewer than half the pods report: 75% on 4 pods is 6 at 50%"),
        pytest.param(FALLBACK, 50, MetricObservation(available=False, yesterday=HistoryPoint(20, 4)), 4,
                     "HistoryNoScaleDown", True, id="does not scale down on yesterday's numbers by default"),
        pytest.param({"historyFallback": {"allowScaleDown": True}}, 50,
                     MetricObservation(available=False, yesterday=HistoryPoint(20, 4)), 2, "DesiredWithinRange",
                     True, id="scales down on yesterday's numbers when allowed: 20% on 4 pods is 2 at 50%"),
        pytest.param({}, 50, MetricObservation(available=False, yesterday=HistoryPoint(90, 4)), 4, "InvalidMetrics",
                     False, id="without the fallback an unavailable metric keeps the count"),
        pytest.param(FALLBACK, 50, cpu(4, 0.8, reporting=1), 4, "InvalidMetrics", False,
                     id="too few reporting pods and no history keeps the count"),
    ],
)
def test_history_fallback(
    extensions: dict[str, Any],
    target: int,
    observation: MetricObservation,
    want: int,
    reason: str,
    used_history: bool,
) -> None:
    spec = make_spec(metrics=[{"type": "Resource", "resource": {"name": "cpu", "target": {
        "type": "Utilization", "averageUtilization": target}}}], metricsd=extensions)
    decision = decide(spec, inputs(4, Resource_cpu=observation), HPAState())
    assert (decision.desired_replicas, decision.reason, decision.used_history) == (want, reason, used_history)


@pytest.mark.parametrize(
    ("since", "usage", "alert", "since_after"),
    [
        pytest.param(NOW - 600, 0.8, True, NOW - 600,
                     id="alerts once the target has sat at max above target for the configured 600 s"),
        pytest.param(NOW - 100, 0.8, False, NOW - 100, id="does not alert before the time has passed"),
        pytest.param(None, 0.8, False, NOW, id="starts the timer when the target first sits at max above target"),
        pytest.param(NOW - 900, 0.3, False, None, id="resets the timer when utilisation falls below target"),
    ],
)
def test_alert_at_max(since: float | None, usage: float, alert: bool, since_after: float | None) -> None:
    spec = make_spec(maxReplicas=10, metricsd={"alertAtMaxForSeconds": 600})
    decision = decide(spec, inputs(10, Resource_cpu=cpu(10, usage)), HPAState(at_max_above_target_since=since))
    assert (decision.alert, decision.state.at_max_above_target_since) == (alert, since_after)


def test_decision_state_feeds_the_next_sync() -> None:
    spec = make_spec()
    first = decide(spec, inputs(4, Resource_cpu=cpu(4, 0.8)), HPAState())
    assert first.rescale and first.desired_replicas == 7
    assert first.state.recommendations == (TimestampedRecommendation(7, NOW),)
    state = apply_scale(spec, first.state, 4, 7, NOW)
    assert state.scale_up_events == (ScaleEvent(3, NOW),)
    # 5 s later, load doubles again: the period began at 4, so the cap is max(4 + 4, 8) = 8.
    later = replace(inputs(7, Resource_cpu=cpu(7, 2.0)), now=NOW + 5)
    second = decide(spec, later, state)
    assert (second.desired_replicas, second.reason) == (8, "ScaleUpLimit")
    assert [p.replicas for p in second.proposals] == [28]
    assert "7 -> 8 replicas" in second.message
