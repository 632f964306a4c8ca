"""Read HPA specs from YAML in the shape of autoscaling/v2 HorizontalPodAutoscaler.

Mirrors the defaulting of pkg/apis/autoscaling/v2/defaults.go and the checks of
pkg/apis/autoscaling/validation (stabilisation 0..3600 s, policy period 1..1800 s, values > 0,
maxReplicas >= minReplicas), and adds our `spec.metricsd` block. Every error names its field path.
"""

from __future__ import annotations

import re
from typing import Any

from metricsd.consumers.hpa.spec import (
    DEFAULT_CPU_UTILIZATION,
    Behavior,
    ControllerSettings,
    Extensions,
    HistoryFallback,
    HPASpec,
    MaxStep,
    MetricSpec,
    MetricTarget,
    Predictive,
    ScaleTargetRef,
    ScalingPolicy,
    ScalingRules,
    Schedule,
    default_scale_down,
    default_scale_up,
)
from metricsd.consumers.specfields import Node, SpecError, load_documents
from metricsd.durations import parse_duration_ms

__all__ = ["load_hpa_yaml", "parse_hpa"]

_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_CLOCK = re.compile(r"^([01]?\d|2[0-4]):([0-5]\d)$")
_OFFSET = re.compile(r"^([+-])(\d{2}):?(\d{2})$")
_METRIC_FIELD = {"Resource": "resource", "ContainerResource": "containerResource", "Pods": "pods",
                 "External": "external"}


def load_hpa_yaml(text: str, settings: ControllerSettings | None = None) -> list[HPASpec]:
    """Parse every HorizontalPodAutoscaler document in a (multi-document) YAML text.

    Documents of other kinds are skipped, so one file can hold an HPA next to its Deployment.
    Raises SpecError (naming `documents[i]...`) for a malformed HPA, yaml.YAMLError for bad YAML.
    """
    return load_documents(text, "HorizontalPodAutoscaler", lambda doc: parse_hpa(doc, settings))



def parse_hpa(doc: dict[str, Any], settings: ControllerSettings | None = None) -> HPASpec:
    """Build an HPASpec from one decoded HorizontalPodAutoscaler object. Raises SpecError."""
    settings = settings or ControllerSettings()
    root = Node(doc, "")
    api_version = root.string("apiVersion", "autoscaling/v2")
    if api_version != "autoscaling/v2":
        raise SpecError("apiVersion", f"must be autoscaling/v2, got {api_version!r}")
    meta = root.need("metadata")
    spec = root.need("spec")
    spec.reject_unknown(("scaleTargetRef", "minReplicas", "maxReplicas", "metrics", "behavior", "metricsd"))
    ref = spec.need("scaleTargetRef")
    target_ref = ScaleTargetRef(
        kind=ref.string("kind"), name=ref.string("name"), api_version=ref.string("apiVersion", "apps/v1")
    )
    min_replicas = spec.integer("minReplicas", 1, minimum=1)
    max_replicas = spec.integer("maxReplicas", minimum=1)
    if max_replicas < min_replicas:
        raise SpecError(spec.at("maxReplicas"), f"must be >= minReplicas ({min_replicas}), got {max_replicas}")
    metrics = tuple(_metric(m) for m in spec.items("metrics"))
    if not metrics:
        metrics = (MetricSpec("Resource", "cpu", MetricTarget("Utilization", DEFAULT_CPU_UTILIZATION)),)
    keys = [m.key for m in metrics]
    for i, key in enumerate(keys):
        if key in keys[:i]:
            raise SpecError(spec.at(f"metrics[{i}]"), f"duplicate metric {key}")
    behavior_node = spec.child("behavior")
    behavior = Behavior(
        scale_up=_rules(behavior_node, "scaleUp", default_scale_up()),
        scale_down=_rules(behavior_node, "scaleDown", default_scale_down(settings)),
    )
    extensions = _extensions(spec.child("metricsd"), metrics, max_replicas)
    return HPASpec(
        name=meta.string("name"),
        namespace=meta.string("namespace", "default"),
        scale_target_ref=target_ref,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        metrics=metrics,
        behavior=behavior,
        metricsd=extensions,
    )


def _metric(node: Node) -> MetricSpec:
    mtype = node.string("type", choices=tuple(_METRIC_FIELD))
    body = node.need(_METRIC_FIELD[mtype])
    container: str | None = None
    selector: dict[str, str] = {}
    if mtype in ("Resource", "ContainerResource"):
        name = body.string("name")
        if mtype == "ContainerResource":
            container = body.string("container")
        allowed: tuple[str, ...] = ("Utilization", "AverageValue")
    else:
        metric = body.need("metric")
        name = metric.string("name")
        sel = metric.child("selector")
        labels = sel.child("matchLabels") if sel is not None else None
        if labels is not None:
            for k, v in labels.value.items():
                if not isinstance(v, str):
                    raise SpecError(labels.at(str(k)), f"must be a string, got {v!r}")
                selector[str(k)] = v
        allowed = ("AverageValue",) if mtype == "Pods" else ("Value", "AverageValue")
    target = _target(body.need("target"), allowed)
    return MetricSpec(mtype, name, target, container, selector)  # type: ignore[arg-type]


def _target(node: Node, allowed: tuple[str, ...]) -> MetricTarget:
    fields = {"Utilization": "averageUtilization", "AverageValue": "averageValue", "Value": "value"}
    present = [t for t in allowed if node.has(fields[t])]
    stray = [fields[t] for t in fields if t not in allowed and node.has(fields[t])]
    if stray:
        raise SpecError(node.at(stray[0]), f"not allowed here (allowed: {', '.join(fields[t] for t in allowed)})")
    if len(present) != 1:
        names = ", ".join(fields[t] for t in allowed)
        raise SpecError(node.path, f"exactly one of {names} is required")
    ttype = node.string("type", present[0], choices=allowed)
    if ttype != present[0]:
        raise SpecError(node.at("type"), f"is {ttype} but the target sets {fields[present[0]]}")
    if ttype == "Utilization":
        return MetricTarget("Utilization", float(node.integer("averageUtilization", minimum=1)))
    value = node.number(fields[ttype])
    if value <= 0:
        raise SpecError(node.at(fields[ttype]), f"must be > 0, got {value}")
    return MetricTarget(ttype, value)  # type: ignore[arg-type]


def _rules(behavior: Node | None, key: str, default: ScalingRules) -> ScalingRules:
    node = behavior.child(key) if behavior is not None else None
    if node is None:
        return default
    node.reject_unknown(("stabilizationWindowSeconds", "selectPolicy", "policies", "tolerance"))
    window = node.integer("stabilizationWindowSeconds", default.stabilization_window_seconds, minimum=0,
                          maximum=3600)
    select = node.string("selectPolicy", "Max", choices=("Max", "Min", "Disabled"))
    policies = default.policies
    if "policies" in node.value and node.value["policies"] is not None:
        items = node.items("policies")
        if not items and select != "Disabled":
            raise SpecError(node.at("policies"), "must list at least one policy")
        policies = tuple(
            ScalingPolicy(
                type=p.string("type", choices=("Pods", "Percent")),  # type: ignore[arg-type]
                value=p.integer("value", minimum=1),
                period_seconds=p.integer("periodSeconds", minimum=1, maximum=1800),
            )
            for p in items
        )
    tolerance = node.optional_number("tolerance", minimum=0.0)
    return ScalingRules(window, select, policies, tolerance)  # type: ignore[arg-type]


def _extensions(node: Node | None, metrics: tuple[MetricSpec, ...], max_replicas: int) -> Extensions:
    if node is None:
        return Extensions()
    node.reject_unknown(("schedules", "maxStep", "historyFallback", "alertAtMaxForSeconds", "predictive"))
    schedules = tuple(_schedule(s, metrics) for s in node.items("schedules"))
    step_node = node.child("maxStep")
    max_step = MaxStep()
    if step_node is not None:
        step_node.reject_unknown(("scaleUp", "scaleDown"))
        max_step = MaxStep(
            step_node.optional_integer("scaleUp", minimum=1), step_node.optional_integer("scaleDown", minimum=1)
        )
    fb_node = node.child("historyFallback")
    fallback = HistoryFallback()
    if fb_node is not None:
        fb_node.reject_unknown(("enabled", "minReportingRatio", "allowScaleDown"))
        fallback = HistoryFallback(
            enabled=fb_node.boolean("enabled", True),
            min_reporting_ratio=fb_node.number("minReportingRatio", 0.5, minimum=0.0, maximum=1.0),
            allow_scale_down=fb_node.boolean("allowScaleDown", False),
        )
    alert = node.optional_number("alertAtMaxForSeconds", minimum=0.0)
    pred_node = node.child("predictive")
    predictive = _predictive(pred_node, metrics) if pred_node is not None else None
    return Extensions(schedules, max_step, fallback, alert, predictive)


_FORECAST_METHODS = ("sameHour", "holtWinters")
_HORIZON_S = (60, 6 * 3600)


def _predictive(node: Node, metrics: tuple[MetricSpec, ...]) -> Predictive | None:
    """The opt-in to predictive scale-up; None when `enabled: false`."""
    node.reject_unknown(("enabled", "horizon", "method", "weight", "days", "maxError"))
    if not node.boolean("enabled", True):
        return None
    if not any(m.type != "External" for m in metrics):
        raise SpecError(node.path, "needs a Resource, ContainerResource or Pods metric: External metrics are "
                                   "not forecast")
    horizon = _seconds(node, "horizon", 1800.0)
    lo, hi = _HORIZON_S
    if not lo <= horizon <= hi:
        raise SpecError(node.at("horizon"), f"must be between 1m and 6h, got {node.value.get('horizon')!r}")
    method = node.string("method", "sameHour", choices=_FORECAST_METHODS)
    weight = node.number("weight", 1.0, maximum=2.0)
    if weight <= 0:
        raise SpecError(node.at("weight"), f"must be > 0, got {weight}")
    # Rollups are kept eight days; a forecast reads `days` back plus the hours it compares today on.
    days = node.integer("days", 7, minimum=1, maximum=7)
    if method == "holtWinters" and days < 2:
        raise SpecError(node.at("days"), f"holtWinters needs at least 2 (the first day seeds the season), got {days}")
    max_error = node.number("maxError", 0.25, maximum=1.0)
    if max_error <= 0:
        raise SpecError(node.at("maxError"), f"must be > 0, got {max_error}")
    return Predictive(horizon, method, weight, days, max_error)  # type: ignore[arg-type]


def _seconds(node: Node, key: str, default: float) -> float:
    """A duration: a string like 30m or 1h30m, or a number of seconds."""
    raw = node.value.get(key)
    if raw is None:
        return default
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return float(raw)
    if isinstance(raw, str):
        try:
            return parse_duration_ms(raw) / 1000.0
        except ValueError:
            pass
    raise SpecError(node.at(key), f"must be a duration like 30m or 1h, got {raw!r}")


def _schedule(node: Node, metrics: tuple[MetricSpec, ...]) -> Schedule:
    node.reject_unknown(("name", "start", "end", "utcOffset", "days", "minReplicas", "maxReplicas", "targets"))
    start = _clock(node, "start")
    end = _clock(node, "end")
    offset = _offset(node)
    days_raw = node.strings("days", choices=_DAYS)
    days = frozenset(_DAYS.index(d) for d in days_raw) if days_raw is not None else None
    lo = node.optional_integer("minReplicas", minimum=1)
    hi = node.optional_integer("maxReplicas", minimum=1)
    if lo is not None and hi is not None and hi < lo:
        raise SpecError(node.at("maxReplicas"), f"must be >= minReplicas ({lo}), got {hi}")
    targets: dict[str, MetricTarget] = {}
    tnode = node.child("targets")
    if tnode is not None:
        by_name = {m.name: m for m in metrics}
        for name in tnode.value:
            metric = by_name.get(str(name))
            if metric is None:
                raise SpecError(tnode.at(str(name)), f"names no metric of this HPA (have: {', '.join(by_name)})")
            allowed = (metric.target.type,)
            targets[metric.key] = _target(tnode.need(str(name)), allowed)
    return Schedule(node.string("name", f"{node.value.get('start')}-{node.value.get('end')}"), start, end,
                    offset, days, lo, hi, targets)


def _clock(node: Node, key: str) -> int:
    raw_value = node.value.get(key)
    # YAML 1.1 reads an unquoted 19:00 as the base-60 integer 1140, which is already minutes.
    if isinstance(raw_value, int) and not isinstance(raw_value, bool) and 0 <= raw_value <= 1440:
        return raw_value
    raw = node.string(key)
    m = _CLOCK.match(raw)
    if m is None or (m.group(1) == "24" and m.group(2) != "00"):
        raise SpecError(node.at(key), f"must be a time of day HH:MM, got {raw!r}")
    return int(m.group(1)) * 60 + int(m.group(2))


def _offset(node: Node) -> int:
    raw = node.value.get("utcOffset")
    if raw is None or raw == "Z":
        return 0
    if isinstance(raw, int) and not isinstance(raw, bool) and abs(raw) <= 14 * 60:
        return raw  # YAML 1.1 base-60: an unquoted +08:00 arrives as 480 minutes
    m = _OFFSET.match(str(raw))
    if m is None or int(m.group(2)) > 14 or int(m.group(3)) > 59:
        raise SpecError(node.at("utcOffset"), f"must look like +08:00 or -05:30, got {raw!r}")
    minutes = int(m.group(2)) * 60 + int(m.group(3))
    return -minutes if m.group(1) == "-" else minutes
