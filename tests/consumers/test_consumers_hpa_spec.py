"""Reading HPA specs: the autoscaling/v2 shape, Kubernetes' defaults, our extension block, and
validation errors that name the field path."""

from __future__ import annotations

import pytest

from metricsd.consumers.hpa.parse import load_hpa_yaml
from metricsd.consumers.hpa.schedule import effective_limits, in_window
from metricsd.consumers.hpa.spec import (
    MaxStep,
    MetricTarget,
    ScalingPolicy,
    ScalingRules,
    Schedule,
)
from metricsd.consumers.specfields import SpecError

FULL = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: web, namespace: shop}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 2
  maxReplicas: 40
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 60}}
  - type: Resource
    resource: {name: memory, target: {type: AverageValue, averageValue: 512Mi}}
  - type: Pods
    pods:
      metric: {name: requests_per_second}
      target: {type: AverageValue, averageValue: 1k}
  - type: External
    external:
      metric: {name: queue_depth, selector: {matchLabels: {queue: orders}}}
      target: {type: Value, value: "30"}
  behavior:
    scaleUp:
      tolerance: 0.05
      policies: [{type: Pods, value: 2, periodSeconds: 60}]
    scaleDown:
      stabilizationWindowSeconds: 600
      selectPolicy: Min
  metricsd:
    schedules:
    - name: evening
      start: 19:00
      end: "23:00"
      utcOffset: "+08:00"
      days: [Mon, Tue, Wed, Thu, Fri]
      minReplicas: 10
      targets: {cpu: {averageUtilization: 40}}
    maxStep: {scaleUp: 8, scaleDown: 2}
    historyFallback: {enabled: true, minReportingRatio: 0.6}
    alertAtMaxForSeconds: 600
"""


def test_reads_every_field_of_a_full_spec() -> None:
    [spec] = load_hpa_yaml(FULL)
    assert (spec.name, spec.namespace, spec.scale_target_ref.name) == ("web", "shop", "web")
    assert (spec.min_replicas, spec.max_replicas) == (2, 40)
    assert [(m.key, m.target) for m in spec.metrics] == [
        ("Resource/cpu", MetricTarget("Utilization", 60)),
        ("Resource/memory", MetricTarget("AverageValue", 512 * 2**20)),
        ("Pods/requests_per_second", MetricTarget("AverageValue", 1000)),
        ("External/queue_depth", MetricTarget("Value", 30)),
    ]
    assert spec.metrics[3].selector == {"queue": "orders"}
    assert spec.behavior.scale_up == ScalingRules(0, "Max", (ScalingPolicy("Pods", 2, 60),), 0.05)
    assert spec.behavior.scale_down == ScalingRules(600, "Min", (ScalingPolicy("Percent", 100, 15),), None)
    ext = spec.metricsd
    assert ext.schedules == (
        Schedule("evening", 19 * 60, 23 * 60, 480, frozenset(range(5)), 10, None,
                 {"Resource/cpu": MetricTarget("Utilization", 40)}),
    )
    assert ext.max_step == MaxStep(8, 2)
    assert (ext.history_fallback.enabled, ext.history_fallback.min_reporting_ratio) == (True, 0.6)
    assert ext.alert_at_max_for_seconds == 600


def test_applies_kubernetes_defaults() -> None:
    [spec] = load_hpa_yaml("""
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: api}
spec:
  scaleTargetRef: {kind: Deployment, name: api}
  maxReplicas: 5
""")
    assert spec.namespace == "default" and spec.min_replicas == 1
    assert [(m.key, m.target) for m in spec.metrics] == [("Resource/cpu", MetricTarget("Utilization", 80))]
    up, down = spec.behavior.scale_up, spec.behavior.scale_down
    assert up == ScalingRules(0, "Max", (ScalingPolicy("Pods", 4, 15), ScalingPolicy("Percent", 100, 15)))
    assert down == ScalingRules(300, "Max", (ScalingPolicy("Percent", 100, 15),))
    assert not spec.metricsd.history_fallback.enabled and spec.metricsd.schedules == ()


BASE = """
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: api}
spec:
  scaleTargetRef: {kind: Deployment, name: api}
"""


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param("  minReplicas: 3\n  maxReplicas: 2\n",
                     "documents[0].spec.maxReplicas: must be >= minReplicas (3), got 2",
                     id="rejects a maximum below the minimum"),
        pytest.param("  minReplicas: 2\n", "documents[0].spec.maxReplicas: is required",
                     id="requires maxReplicas"),
        pytest.param("  maxReplicas: 2\n  metrics:\n  - type: Resource\n    resource: {name: cpu, target: {}}\n",
                     "documents[0].spec.metrics[0].resource.target: exactly one of averageUtilization, "
                     "averageValue is required", id="requires a target value"),
        pytest.param("  maxReplicas: 2\n  metrics:\n  - type: Pods\n    pods: {metric: {name: x}, target: "
                     "{averageUtilization: 5}}\n",
                     "documents[0].spec.metrics[0].pods.target.averageUtilization: not allowed here "
                     "(allowed: averageValue)", id="rejects a utilisation target on a Pods metric"),
        pytest.param("  maxReplicas: 2\n  metrics:\n  - type: Object\n",
                     "documents[0].spec.metrics[0].type: must be one of Resource, ContainerResource, Pods, "
                     "External, got 'Object'", id="names the supported metric types"),
        pytest.param("  maxReplicas: 2\n  behavior:\n    scaleDown:\n      stabilizationWindowSeconds: 4000\n",
                     "documents[0].spec.behavior.scaleDown.stabilizationWindowSeconds: must be <= 3600, got 4000",
                     id="bounds the stabilisation window to an hour"),
        pytest.param("  maxReplicas: 2\n  behavior:\n    scaleUp:\n      policies:\n      - {type: Pods, value: 0, "
                     "periodSeconds: 15}\n",
                     "documents[0].spec.behavior.scaleUp.policies[0].value: must be >= 1, got 0",
                     id="requires positive policy values"),
        pytest.param("  maxReplicas: 2\n  metricsd:\n    schedules:\n    - {start: '25:00', end: '23:00'}\n",
                     "documents[0].spec.metricsd.schedules[0].start: must be a time of day HH:MM, got '25:00'",
                     id="rejects an impossible time of day"),
        pytest.param("  maxReplicas: 2\n  metricsd:\n    schedules:\n    - {start: '19:00', end: '23:00', "
                     "targets: {gpu: {averageUtilization: 5}}}\n",
                     "documents[0].spec.metricsd.schedules[0].targets.gpu: names no metric of this HPA (have: cpu)",
                     id="rejects a schedule target for a metric the HPA does not have"),
        pytest.param("  maxReplicas: 2\n  metricsd:\n    maxstep: {scaleUp: 2}\n",
                     "documents[0].spec.metricsd.maxstep: unknown field", id="rejects a misspelt extension field"),
    ],
)
def test_validation_names_the_field(body: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        load_hpa_yaml(BASE + body)
    assert str(err.value).startswith(message)


MONDAY_NOON_UTC = 1_704_110_400  # 2024-01-01 12:00 UTC, a Monday


@pytest.mark.parametrize(
    ("schedule", "now", "inside"),
    [
        pytest.param(Schedule("s", 19 * 60, 23 * 60, 480), MONDAY_NOON_UTC, True,
                     id="12:00 UTC is 20:00 at UTC+08:00, inside 19:00-23:00"),
        pytest.param(Schedule("s", 19 * 60, 23 * 60, 0), MONDAY_NOON_UTC, False,
                     id="12:00 UTC is outside 19:00-23:00 UTC"),
        pytest.param(Schedule("s", 22 * 60, 2 * 60, 0), MONDAY_NOON_UTC + 13 * 3600, True,
                     id="01:00 is inside a window from 22:00 that wraps past midnight"),
        pytest.param(Schedule("s", 22 * 60, 2 * 60, 0, frozenset({0})), MONDAY_NOON_UTC + 13 * 3600, True,
                     id="a wrapped window belongs to the day it starts on, Monday"),
        pytest.param(Schedule("s", 22 * 60, 2 * 60, 0, frozenset({1})), MONDAY_NOON_UTC + 13 * 3600, False,
                     id="a Tuesday window has not started at 01:00 on Tuesday"),
        pytest.param(Schedule("s", 9 * 60, 17 * 60, 0, frozenset({5, 6})), MONDAY_NOON_UTC, False,
                     id="a weekend window is closed on Monday"),
    ],
)
def test_schedule_windows(schedule: Schedule, now: float, inside: bool) -> None:
    assert in_window(schedule, now) is inside


def test_a_schedule_floor_above_the_ceiling_lifts_the_ceiling() -> None:
    [spec] = load_hpa_yaml(BASE + "  maxReplicas: 5\n  metricsd:\n    schedules:\n"
                           "    - {start: '00:00', end: '00:00', minReplicas: 8}\n")
    limits = effective_limits(spec, MONDAY_NOON_UTC)
    assert (limits.min_replicas, limits.max_replicas) == (8, 8)
