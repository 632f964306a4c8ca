"""The HPA spec as plain, frozen data, with Kubernetes' defaults in one place.

The shape mirrors autoscaling/v2 HorizontalPodAutoscalerSpec; metricsd's own additions live in
`Extensions` (YAML field `spec.metricsd`). Defaults are those of the kube-controller-manager flags
and of SetDefaults_HorizontalPodAutoscaler / GenerateHPAScaleUpRules / GenerateHPAScaleDownRules
(pkg/apis/autoscaling/v2/defaults.go).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "DEFAULT_CPU_UTILIZATION",
    "Behavior",
    "ControllerSettings",
    "Extensions",
    "HPASpec",
    "HistoryFallback",
    "MaxStep",
    "MetricSpec",
    "MetricTarget",
    "Predictive",
    "ScaleTargetRef",
    "ScalingPolicy",
    "ScalingRules",
    "Schedule",
    "default_scale_down",
    "default_scale_up",
]

MetricType = Literal["Resource", "ContainerResource", "Pods", "External"]
TargetType = Literal["Utilization", "AverageValue", "Value"]
ForecastMethod = Literal["sameHour", "holtWinters"]
PolicyType = Literal["Pods", "Percent"]
SelectPolicy = Literal["Max", "Min", "Disabled"]

# autoscaling.DefaultCPUUtilization: the metric an HPA gets when it lists none.
DEFAULT_CPU_UTILIZATION = 80


@dataclass(frozen=True)
class ControllerSettings:
    """The kube-controller-manager flags that shape every HPA, with their upstream defaults.

    tolerance: --horizontal-pod-autoscaler-tolerance; sync_period_seconds: ...-sync-period;
    cpu_initialization_seconds: ...-cpu-initialization-period; initial_readiness_delay_seconds:
    ...-initial-readiness-delay; downscale_stabilization_seconds: ...-downscale-stabilization.
    """

    tolerance: float = 0.1
    sync_period_seconds: float = 15.0
    cpu_initialization_seconds: float = 300.0
    initial_readiness_delay_seconds: float = 30.0
    downscale_stabilization_seconds: int = 300


@dataclass(frozen=True)
class ScaleTargetRef:
    kind: str
    name: str
    api_version: str = "apps/v1"


@dataclass(frozen=True)
class MetricTarget:
    """One of the three target kinds; `value` holds the number in the target's unit.

    Utilization: percent of the request (averageUtilization); AverageValue: per pod, in base units
    (cores, bytes, or the metric's unit); Value: the total of an External metric.
    """

    type: TargetType
    value: float


@dataclass(frozen=True)
class MetricSpec:
    """One entry of spec.metrics. `name` is the resource name for Resource/ContainerResource."""

    type: MetricType
    name: str
    target: MetricTarget
    container: str | None = None
    selector: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """A stable identifier for inputs and proposals, e.g. `Resource/cpu`, `Pods/requests_per_second`."""
        if self.container:
            return f"{self.type}/{self.container}/{self.name}"
        return f"{self.type}/{self.name}"


@dataclass(frozen=True)
class ScalingPolicy:
    type: PolicyType
    value: int
    period_seconds: int


@dataclass(frozen=True)
class ScalingRules:
    """HPAScalingRules after defaulting. `tolerance` None means the controller's global tolerance."""

    stabilization_window_seconds: int
    select_policy: SelectPolicy
    policies: tuple[ScalingPolicy, ...]
    tolerance: float | None = None


def default_scale_up() -> ScalingRules:
    """GenerateHPAScaleUpRules: no stabilisation; add 4 pods or double, whichever is more, per 15 s."""
    return ScalingRules(
        stabilization_window_seconds=0,
        select_policy="Max",
        policies=(ScalingPolicy("Pods", 4, 15), ScalingPolicy("Percent", 100, 15)),
    )


def default_scale_down(settings: ControllerSettings | None = None) -> ScalingRules:
    """GenerateHPAScaleDownRules: 300 s stabilisation (the controller flag), remove up to 100% per 15 s."""
    window = (settings or ControllerSettings()).downscale_stabilization_seconds
    return ScalingRules(
        stabilization_window_seconds=window,
        select_policy="Max",
        policies=(ScalingPolicy("Percent", 100, 15),),
    )


@dataclass(frozen=True)
class Behavior:
    scale_up: ScalingRules = field(default_factory=default_scale_up)
    scale_down: ScalingRules = field(default_factory=default_scale_down)


@dataclass(frozen=True)
class Schedule:
    """A daily window (minutes after local midnight) that overrides min/max and metric targets.

    A window whose end is not after its start wraps past midnight (22:00-02:00). `days` holds the
    weekdays (0 = Monday) on which the window starts; None means every day.
    """

    name: str
    start_minute: int
    end_minute: int
    utc_offset_minutes: int = 0
    days: frozenset[int] | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None
    targets: Mapping[str, MetricTarget] = field(default_factory=dict)


@dataclass(frozen=True)
class MaxStep:
    """The most replicas one action may add or remove; None means no limit of ours."""

    scale_up: int | None = None
    scale_down: int | None = None


@dataclass(frozen=True)
class HistoryFallback:
    """When live data is missing, use the same hour yesterday from the hourly rollups.

    A metric counts as missing when the query failed or fewer than `min_reporting_ratio` of the
    running pods reported it. Scaling down on yesterday's numbers is off unless allowed, because
    missing live data often means an incident rather than a quiet hour.
    """

    enabled: bool = False
    min_reporting_ratio: float = 0.5
    allow_scale_down: bool = False


@dataclass(frozen=True)
class Predictive:
    """Scale up ahead of a forecast of the workload's demand (YAML `spec.metricsd.predictive`).

    horizon_seconds: how far ahead the forecast looks; the HPA prepares for the largest demand it
    expects within that time, so it should exceed the pods' start-up time. method: how the hourly
    history becomes a forecast (`predict.py`). weight: the forecast is multiplied by it before it
    becomes replicas (1 as forecast, 1.2 with 20% headroom, 0.8 leaving the rest to the reactive
    rule). days: how many past days feed the forecast. max_error: the forecast's relative error over
    the last hours above which the HPA falls back to the reactive rule alone.
    """

    horizon_seconds: float = 1800.0
    method: ForecastMethod = "sameHour"
    weight: float = 1.0
    days: int = 7
    max_error: float = 0.25


@dataclass(frozen=True)
class Extensions:
    """metricsd's additions, read from `spec.metricsd`."""

    schedules: tuple[Schedule, ...] = ()
    max_step: MaxStep = field(default_factory=MaxStep)
    history_fallback: HistoryFallback = field(default_factory=HistoryFallback)
    alert_at_max_for_seconds: float | None = None
    predictive: Predictive | None = None


@dataclass(frozen=True)
class HPASpec:
    name: str
    namespace: str
    scale_target_ref: ScaleTargetRef
    min_replicas: int
    max_replicas: int
    metrics: tuple[MetricSpec, ...]
    behavior: Behavior = field(default_factory=Behavior)
    metricsd: Extensions = field(default_factory=Extensions)
