"""The replica calculator, one case per rule of Kubernetes' replica_calculator.go, worked by hand.

Unless a case says otherwise: target 50% CPU, every pod requests 1 core, tolerance 0.1.
"""

from __future__ import annotations

import pytest

from metricsd.consumers.hpa.replicas import (
    MetricError,
    MetricObservation,
    PodInfo,
    PodSample,
    Tolerances,
    external_replicas,
    plain_replicas,
    resource_replicas,
)
from metricsd.consumers.hpa.spec import ControllerSettings, MetricTarget

NOW = 1_000_000.0
SETTINGS = ControllerSettings()  # CPU initialisation 300 s, initial readiness delay 30 s


def running(n: int, prefix: str = "p") -> list[PodInfo]:
    return [PodInfo(f"{prefix}{i}", start_time=NOW - 3600, ready_transition=NOW - 3500) for i in range(n)]


def obs(pods: list[PodInfo], usages: dict[str, float], request: float = 1.0) -> MetricObservation:
    return MetricObservation(
        samples={name: PodSample(v) for name, v in usages.items()},
        requests={p.name: request for p in pods},
    )


def usages(pods: list[PodInfo], value: float, skip: int = 0) -> dict[str, float]:
    return {p.name: value for p in pods[skip:]}


FOUR = running(4)
FIVE = running(5)
TEN = running(10)
UNREADY_YOUNG = PodInfo("young", start_time=NOW - 60, ready=False, ready_transition=NOW - 60)
WARMING = PodInfo("warming", start_time=NOW - 60, ready=True, ready_transition=NOW - 20)
DELETING = PodInfo("gone", start_time=NOW - 3600, deleting=True)
FAILED = PodInfo("failed", phase="Failed", start_time=NOW - 3600)
PENDING = PodInfo("pending", phase="Pending", start_time=None, ready=None)

RESOURCE_CASES = [
    pytest.param(4, FOUR, usages(FOUR, 0.8), 50, 7, "Scaled",
                 id="scales up to ceil of ratio times ready pods: 80% of 50% on 4 pods gives ceil(6.4) = 7"),
    pytest.param(4, FOUR, usages(FOUR, 0.2), 50, 2, "Scaled",
                 id="scales down to ceil of ratio times ready pods: 20% of 50% on 4 pods gives ceil(1.6) = 2"),
    pytest.param(4, FOUR, usages(FOUR, 0.54), 50, 4, "WithinTolerance",
                 id="keeps the count when the ratio 1.08 is within the 0.1 tolerance"),
    pytest.param(4, FOUR, usages(FOUR, 0.559), 50, 4, "WithinTolerance",
                 id="truncates utilisation to a whole percent so 55.9% is 55% and ratio 1.1 stays within tolerance"),
    pytest.param(5, FIVE, usages(FIVE, 0.1, skip=1), 50, 3, "Scaled",
                 id="assumes a pod without metrics uses its full request when scaling down: 1400m of 5000m is "
                    "28%, ceil(0.56 * 5) = 3"),
    pytest.param(10, TEN, usages(TEN, 0.6, skip=1), 50, 10, "WithinTolerance",
                 id="assumes a pod without metrics uses nothing when scaling up, which brings 60% down to 54% "
                    "and within tolerance"),
    pytest.param(4, FOUR, usages(FOUR, 0.4, skip=2), 50, 4, "DirectionFlipped",
                 id="keeps the count when filling in missing pods flips a scale-down into a scale-up"),
    pytest.param(4, running(10), usages(running(10), 0.3, skip=1), 50, 4, "DirectionFlipped",
                 id="keeps the count when the recomputed proposal 8 would grow while the ratio says shrink"),
    pytest.param(10, [*running(9), UNREADY_YOUNG], usages(running(9), 0.6), 50, 10, "WithinTolerance",
                 id="counts an unready pod as idle when scaling up: 5400m of 10000m is 54%, within tolerance"),
    pytest.param(4, [*running(3), UNREADY_YOUNG], {**usages(running(3), 0.2), "young": 1.0}, 50, 2, "Scaled",
                 id="ignores an unready pod when scaling down: 20% on the 3 ready pods gives ceil(1.2) = 2"),
    pytest.param(4, [*running(3), WARMING], {**usages(running(3), 0.2), "warming": 1.0}, 50, 2, "Scaled",
                 id="ignores a pod in its CPU initialisation period until a full metric window follows readiness"),
    pytest.param(4, [*running(3), DELETING, FAILED], {**usages(running(3), 0.2), "gone": 1.0, "failed": 1.0},
                 50, 2, "Scaled", id="ignores pods being deleted and failed pods"),
    pytest.param(4, [*running(4), PENDING], usages(running(4), 0.8), 50, 7, "Scaled",
                 id="counts a pending pod as idle when scaling up: 3200m of 5000m is 64%, ceil(1.28 * 5) = 7"),
]


@pytest.mark.parametrize(("current", "pods", "values", "target", "want", "rule"), RESOURCE_CASES)
def test_resource_utilization_rules(
    current: int, pods: list[PodInfo], values: dict[str, float], target: int, want: int, rule: str
) -> None:
    got = resource_replicas(current, target, pods, obs(pods, values), "cpu", Tolerances(), NOW, SETTINGS)
    assert (got.replicas, got.rule) == (want, rule)


def test_a_pod_that_was_ready_before_counts_once_past_its_initialisation_period() -> None:
    # Unready now, but it became ready after start + 30 s once: upstream counts its sample.
    flapping = PodInfo("flap", start_time=NOW - 3600, ready=False, ready_transition=NOW - 100)
    pods = [*running(3), flapping]
    got = resource_replicas(4, 50, pods, obs(pods, {**usages(running(3), 0.2), "flap": 1.0}), "cpu",
                            Tolerances(), NOW, SETTINGS)
    # (600m + 1000m) / 4000m = 40% -> ratio 0.8 -> ceil(0.8 * 4) = 4
    assert got.replicas == 4


def test_memory_ignores_readiness_rules() -> None:
    pods = [*running(3), UNREADY_YOUNG]
    values = {**usages(running(3), 0.2), "young": 1.0}
    got = resource_replicas(4, 50, pods, obs(pods, values), "memory", Tolerances(), NOW, SETTINGS)
    # All four count: 1600m / 4000m = 40% -> 0.8 -> ceil(3.2) = 4
    assert got.replicas == 4


@pytest.mark.parametrize(
    ("pods", "values", "per_pod_request", "message"),
    [
        pytest.param([], {}, 1.0, "no pods returned by selector", id="fails with no pods"),
        pytest.param([UNREADY_YOUNG], {"young": 1.0}, 1.0, "did not receive metrics for targeted pods",
                     id="fails when only unready pods have metrics"),
    ],
)
def test_resource_errors(
    pods: list[PodInfo], values: dict[str, float], per_pod_request: float, message: str
) -> None:
    with pytest.raises(MetricError, match=message):
        resource_replicas(4, 50, pods, obs(pods, values, per_pod_request), "cpu", Tolerances(), NOW, SETTINGS)


def test_missing_request_is_an_error_naming_the_pod() -> None:
    pods = running(2)
    observation = MetricObservation(samples={"p0": PodSample(0.5), "p1": PodSample(0.5)}, requests={"p0": 1.0})
    with pytest.raises(MetricError, match="missing request for cpu in pod p1"):
        resource_replicas(2, 50, pods, observation, "cpu", Tolerances(), NOW, SETTINGS)


@pytest.mark.parametrize(
    ("tolerances", "current", "value", "want"),
    [
        pytest.param(Tolerances(scale_up=0.5), 4, 0.8, 4,
                     id="a scale-up tolerance of 0.5 holds ratio 1.33 at the current count"),
        pytest.param(Tolerances(scale_down=0.05), 10, 0.54, 9,
                     id="a scale-down tolerance of 0.05 lets ratio 0.9 scale down to ceil(9.0) = 9"),
        pytest.param(Tolerances(), 10, 0.54, 10, id="the default tolerance holds ratio 0.9 exactly at its edge"),
    ],
)
def test_per_direction_tolerance(tolerances: Tolerances, current: int, value: float, want: int) -> None:
    pods = running(current)
    got = resource_replicas(current, 60, pods, obs(pods, usages(pods, value)), "cpu", tolerances, NOW, SETTINGS)
    assert got.replicas == want


PLAIN_CASES = [
    pytest.param(4, "cpu", 0.5, usages(FOUR, 0.8), 7,
                 id="an averageValue of 500m with 800m per pod scales to ceil(1.6 * 4) = 7"),
    pytest.param(4, None, 100.0, usages(FOUR, 150.0), 6,
                 id="a Pods metric at 150 against 100 per pod scales to ceil(1.5 * 4) = 6"),
    pytest.param(4, None, 100.0, usages(FOUR, 20.0, skip=1), 2,
                 id="a Pods metric assumes a silent pod sits at the target when scaling down: ceil(0.4 * 4) = 2"),
    pytest.param(4, None, 100.0, usages(FOUR, 105.0), 4, id="a Pods metric within tolerance keeps the count"),
]


@pytest.mark.parametrize(("current", "resource", "target", "values", "want"), PLAIN_CASES)
def test_average_value_rules(
    current: int, resource: str | None, target: float, values: dict[str, float], want: int
) -> None:
    pods = running(current)
    got = plain_replicas(current, target, pods, obs(pods, values), resource, Tolerances(), NOW, SETTINGS)
    assert got.replicas == want


@pytest.mark.parametrize(
    ("target", "values", "status", "want"),
    [
        pytest.param(MetricTarget("Value", 30), (90.0,), 4, 12,
                     id="an External Value target scales the ready pods by the ratio: ceil(3 * 4) = 12"),
        pytest.param(MetricTarget("Value", 30), (31.0,), 4, 4, id="an External Value within tolerance keeps the count"),
        pytest.param(MetricTarget("AverageValue", 30), (200.0, 100.0), 4, 10,
                     id="an External AverageValue target asks for ceil(total / per-pod target) = 10"),
    ],
)
def test_external_rules(target: MetricTarget, values: tuple[float, ...], status: int, want: int) -> None:
    got = external_replicas(4, status, target, FOUR, MetricObservation(external=values), Tolerances())
    assert got.replicas == want
