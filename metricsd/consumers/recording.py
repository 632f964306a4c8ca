"""The consumers' decisions as series, so that dashboards can draw them next to the pod metrics.

A decision lives in a controller's bounded history (`/api/v1/metricsd/<kind>`), which no PromQL
query can reach; Grafana draws only series. So after each sync the consumers write their outputs
back into metricsd, as Prometheus' recording rules write theirs: these functions turn a sync's
result (the JSON-ready entries the controllers record) into (labels, value) samples, and
`publish.py` writes them through the same Write RPC as the agents. Pure: no I/O, no clock (the
timestamp is the entry's own `timeMs`).

How they are keyed (every stored series needs `namespace` and `pod`):

- Outputs about one workload (HPA, VPA, the overcommit advisor's request advice) keep the
  workload's own `namespace` and `workload` labels, so the dashboards' namespace and workload
  variables select them beside the pods' series. Their `pod` is `<consumer>:<object name>`
  (`hpa:feed-api`, `vpa:recommend`, `overcommit:sim`): Kubernetes pod names are DNS subdomains and
  cannot hold a ':', so no real pod shares the key.
- Cluster-wide outputs (the tidal table, borrowable capacity per node, the colocation plan) use
  `namespace="_cluster"`, as remote write does for series without a pod (no Kubernetes namespace
  can start with '_').

Every name starts with `metricsd_`. The consumers read cAdvisor's and kube-state-metrics' names and
select every question by metric name (`queries.py`), so a published series never enters the
aggregates they decide from; `tests/consumers/test_consumers_recording.py` checks both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from metricsd.consumers.quantity import QuantityError, parse_quantity
from metricsd.model import Labels, make_labels

__all__ = [
    "CLUSTER_NAMESPACE",
    "PREFIX",
    "Sample",
    "colocation_series",
    "decision_series",
    "hpa_series",
    "overcommit_series",
    "vpa_series",
]

PREFIX = "metricsd_"
CLUSTER_NAMESPACE = "_cluster"
Sample = tuple[Labels, float]

_VPA_BOUNDS = (("target", "target"), ("lowerBound", "lower"), ("upperBound", "upper"),
               ("uncappedTarget", "uncapped"))
# A store refuses label values over 1,024 bytes; words about long names are cut well before (bytes).
_WHY_MAX = 400
_PHASES = ("Online", "OnlineToOffline", "Offline", "OfflineToOnline")


def _number(value: object) -> float | None:
    """A finite float, or None for what a series cannot hold (missing, None, NaN, text)."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


class _Out:
    """Collects samples under a fixed set of base labels; a None value is left out."""

    def __init__(self, base: Mapping[str, str]) -> None:
        self.base = dict(base)
        self.samples: list[Sample] = []

    def add(self, name: str, value: object, **labels: str) -> None:
        v = _number(value)
        if v is not None:
            self.samples.append((make_labels(PREFIX + name, {**self.base, **labels}), v))


def _split(key: str) -> tuple[str, str]:
    """'namespace/name' -> (namespace, name); no slash: ('', key)."""
    ns, _, name = key.rpartition("/")
    return ns, name


def _target_name(target: object) -> str:
    """'Deployment/feed-api' -> 'feed-api'."""
    return str(target).rpartition("/")[2]


def hpa_series(entry: Mapping[str, Any]) -> list[Sample]:
    """One HPA decision: replicas now, wanted and allowed, the alert, and each metric against its target.

    `metricsd_hpa_decision{reason, action, why, schedule}` is the desired count again, labelled with
    the rule that set it (`why`: in words, wording.py) and what was done (`action`: none, dry-run,
    scaled, failed), so a dashboard can mark each scaling action with its reason. The words carry
    no per-sync numbers, so the labels take a few values per HPA, not one per sync.

    `metricsd_hpa_target_utilization_ratio{resource}` is a Utilization target over 100, the same
    unit as sum(usage) / sum(requests), so a dashboard draws the two on one axis. A predictive HPA
    adds its forecast: `hpa_predicted_replicas` (the floor the forecast asks for; absent while it
    falls back), `hpa_prediction_active` (0 while it falls back), and per metric the forecast peak
    within the horizon at the current replicas (`hpa_metric_predicted`, in the target's unit;
    `hpa_predicted_utilization_ratio{resource}` for a Utilization target, over 100), the replicas
    it asks for and the forecast's recent relative error.
    """
    ns, name = _split(str(entry.get("hpa", "")))
    out = _Out({"namespace": ns, "pod": f"hpa:{name}", "hpa": name, "workload": _target_name(entry.get("target"))})
    result = entry.get("result") or {}
    inputs = entry.get("inputs") or {}
    out.add("hpa_current_replicas", inputs.get("currentReplicas"))
    out.add("hpa_desired_replicas", result.get("desiredReplicas"))
    out.add("hpa_min_replicas", result.get("minReplicas"))
    out.add("hpa_max_replicas", result.get("maxReplicas"))
    decision = {"reason": str(entry.get("rule", "")), "action": str(result.get("action", "none"))}
    if entry.get("why"):
        decision["why"] = str(entry["why"]).encode()[:_WHY_MAX].decode("utf-8", "ignore")
    if result.get("schedule"):
        decision["schedule"] = str(result["schedule"])
    out.add("hpa_decision", result.get("desiredReplicas"), **decision)
    if "alert" in result:
        out.add("hpa_at_max_alert", bool(result["alert"]))
        out.add("hpa_used_history", bool(result.get("usedHistory")))
    prediction = result.get("prediction")
    if isinstance(prediction, Mapping):
        out.add("hpa_predicted_replicas", prediction.get("replicas"))
        out.add("hpa_prediction_active", bool(prediction.get("active")))
    for row in inputs.get("metrics") or []:
        metric = str(row.get("metric", ""))
        target = row.get("target") or {}
        kind = str(target.get("type", ""))
        out.add("hpa_metric_current", row.get("current"), metric=metric, target_type=kind)
        out.add("hpa_metric_target", target.get("value"), metric=metric, target_type=kind)
        out.add("hpa_metric_replicas", row.get("replicas"), metric=metric)
        source, _, resource = metric.partition("/")
        value = _number(target.get("value"))
        if source == "Resource" and kind == "Utilization" and value is not None:
            out.add("hpa_target_utilization_ratio", value / 100.0, resource=resource)
        predicted = row.get("prediction")
        if isinstance(predicted, Mapping):
            out.add("hpa_metric_predicted", predicted.get("value"), metric=metric, target_type=kind)
            out.add("hpa_metric_predicted_replicas", predicted.get("replicas"), metric=metric)
            out.add("hpa_forecast_error_ratio", predicted.get("error"), metric=metric)
            utilization = _number(predicted.get("value"))
            if source == "Resource" and kind == "Utilization" and utilization is not None:
                out.add("hpa_predicted_utilization_ratio", utilization / 100.0, resource=resource)
    return out.samples


def _quantity(value: object) -> float | None:
    try:
        return parse_quantity(value)
    except QuantityError:
        return None


def vpa_series(entry: Mapping[str, Any]) -> list[Sample]:
    """One VPA's recommendation per container and bound, in cores and bytes, and its confidence."""
    ns, name = _split(str(entry.get("vpa", "")))
    out = _Out({"namespace": ns, "pod": f"vpa:{name}", "vpa": name, "workload": _target_name(entry.get("target"))})
    recommendation = (entry.get("result") or {}).get("recommendation") or {}
    for rec in recommendation.get("containerRecommendations") or []:
        container = str(rec.get("containerName", ""))
        for field, bound in _VPA_BOUNDS:
            amounts = rec.get(field) or {}
            if "cpu" in amounts:
                out.add("vpa_recommendation_cores", _quantity(amounts["cpu"]), container=container, bound=bound)
            if "memory" in amounts:
                out.add("vpa_recommendation_bytes", _quantity(amounts["memory"]), container=container, bound=bound)
    for container, info in sorted(((entry.get("inputs") or {}).get("containers") or {}).items()):
        out.add("vpa_confidence", (info or {}).get("confidence"), container=str(container))
    return out.samples


_UNIT = {"cpu": "cores", "memory": "bytes"}


def overcommit_series(entry: Mapping[str, Any]) -> list[Sample]:
    """The advice: per workload container its weekly peak and recommended request; per node what
    offline work may borrow now; per hour of the day the cluster's peak and what can be lent."""
    advisor = str(entry.get("advisor", ""))
    result = entry.get("result") or {}
    pod = f"overcommit:{advisor}"
    cluster = _Out({"namespace": CLUSTER_NAMESPACE, "pod": pod, "advisor": advisor})
    for row in result.get("requests") or []:
        unit = _UNIT.get(str(row.get("resource")))
        if unit is None:
            continue
        w = _Out({"namespace": str(row.get("namespace", "")), "pod": pod, "advisor": advisor,
                  "workload": str(row.get("workload", "")), "container": str(row.get("container", ""))})
        w.add(f"overcommit_recommended_request_{unit}", row.get("recommended"))
        w.add(f"overcommit_weekly_peak_{unit}", row.get("weekly_peak"))
        w.add(f"overcommit_reclaimable_{unit}", row.get("reclaimable"))
        cluster.samples.extend(w.samples)
    for resource, unit in _UNIT.items():
        cluster.add(f"overcommit_cluster_reclaimable_{unit}", ((result.get("reclaimable") or {}).get("cluster") or {})
                    .get(resource))
        cluster.add(f"overcommit_capacity_{unit}", (result.get("capacity") or {}).get(resource))
        for node in result.get("nodes") or []:
            cluster.add(f"overcommit_borrowable_{unit}", (node.get("borrowable") or {}).get(resource),
                        node=str(node.get("node", "")))
        for row in result.get("tidal") or []:
            hour = f"{int(row.get('hour', 0)):02d}"
            cluster.add(f"overcommit_lendable_{unit}", (row.get("lendable") or {}).get(resource), hour=hour)
            cluster.add(f"overcommit_peak_usage_{unit}", (row.get("peakUsage") or {}).get(resource), hour=hour)
    return cluster.samples


def colocation_series(entry: Mapping[str, Any]) -> list[Sample]:
    """The lending plan: nodes per pool and phase, each node's phase (1 for the phase it is in, as
    kube-state-metrics draws a pod's phase), the cores lent, and the next 24 hours' planned lending."""
    plan = str(entry.get("plan", ""))
    result = entry.get("result") or {}
    out = _Out({"namespace": CLUSTER_NAMESPACE, "pod": f"colocation:{plan}", "plan": plan})
    for pool, counts in sorted((result.get("pools") or {}).items()):
        for phase in _PHASES:
            out.add("colocation_nodes", counts.get(phase), pool=str(pool), phase=phase)
        out.add("colocation_lent_cores", counts.get("lentCores"), pool=str(pool))
        out.add("colocation_online_cores", counts.get("onlineCores"), pool=str(pool))
    for node in result.get("nodes") or []:
        for phase in _PHASES:
            out.add("colocation_node_phase", node.get("phase") == phase, node=str(node.get("node", "")),
                    pool=str(node.get("pool", "")), phase=phase)
    for row in result.get("table") or []:
        labels = {"pool": str(row.get("pool", "")), "hour": f"{int(row.get('hour', 0)):02d}"}
        out.add("colocation_planned_lendable_cores", row.get("coresLendable"), **labels)
        out.add("colocation_planned_lendable_nodes", row.get("nodesLendable"), **labels)
        out.add("colocation_forecast_cores", row.get("forecastCores"), **labels)
    for surge in result.get("surges") or []:
        out.add("colocation_surge_active", bool(surge.get("active")), rule=str(surge.get("rule", "")),
                pool=str(surge.get("pool", "")))
    return out.samples


_BY_KIND = {"hpa": hpa_series, "vpa": vpa_series, "overcommit": overcommit_series, "colocation": colocation_series}


def decision_series(kind: str, result: object) -> list[tuple[int, list[Sample]]]:
    """What `sync_once` of a `kind` consumer returned (one entry, or a list of them) as
    (timestamp ms, samples) per entry; an entry without a time is left out. Raises KeyError for an
    unknown kind."""
    series = _BY_KIND[kind]
    entries: Sequence[object] = result if isinstance(result, list) else [result]
    out = []
    for entry in entries:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("timeMs"), int):
            continue
        samples = series(entry)
        if samples:
            out.append((int(entry["timeMs"]), samples))
    return out
