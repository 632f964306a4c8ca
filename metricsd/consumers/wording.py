"""Decisions in words an owner understands: for the logs, `metricsd <kind> status` and the dashboard.

The controllers record machine-readable reasons (upstream's condition reasons, BelowMinReplicas
and the like) and signed amounts (reclaimable memory of -48.42 GiB). An owner reading a log line
or the page should not need the Kubernetes source to know what they mean, nor guess what a
negative reclaimable amount is. Pure: values in, text out.

The HPA's words (`hpa_why`) leave out the numbers that change from sync to sync (replica counts,
current metric values): they name the rule, the schedule, and the bounds and targets the owner
configured. So the series that carries them as a label (`metricsd_hpa_decision{why}`, see
recording.py) takes a handful of values per HPA, not a new one per sync; `hpa_status_line` adds
the counts for people.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from metricsd.consumers.quantity import QuantityError, format_cpu, parse_quantity

__all__ = [
    "HPAContext",
    "amount_words",
    "hpa_context",
    "hpa_entry_why",
    "hpa_status_line",
    "hpa_why",
    "metric_words",
    "reclaimable_words",
]

_GIB = 2.0**30


# ---- overcommit: what the cluster could give back -------------------------------------------------


def _unit(value: float, resource: str) -> tuple[float, str]:
    """An amount in the unit the advisor's owner reads: cores for CPU, GiB for memory."""
    return (value, "cores") if resource == "cpu" else (value / _GIB, "GiB")


def _fixed2(value: float) -> str:
    """A non-negative amount with two decimals, rounded as JavaScript's toFixed(2) rounds (the exact
    binary value, halves up), so the dashboard's copy of these words (static/words.js) prints the
    same digits."""
    return str(Decimal(value).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def amount_words(value: float, resource: str, reclaimable_word: bool = True) -> str:
    """One resource's reclaimable amount: '54.53 cores reclaimable' or 'under-requested by 48.42 GiB'.

    Negative means the pods' weekly peaks need more than they request: nothing can be taken back,
    and the requests should rise by that much. An amount that prints as 0.00 is not negative.

    >>> amount_words(-48.42 * 2**30, "memory")
    'under-requested by 48.42 GiB'
    """
    amount, unit = _unit(value, resource)
    if amount < 0 and _fixed2(-amount) != "0.00":
        return f"under-requested by {_fixed2(-amount)} {unit}"
    return f"{_fixed2(amount if amount > 0 else 0.0)} {unit}" + (" reclaimable" if reclaimable_word else "")


def reclaimable_words(cluster: Mapping[str, float | None]) -> str:
    """The advisor's cluster total, {"cpu": cores, "memory": bytes}, as a phrase for its log line.

    >>> reclaimable_words({"cpu": 54.53, "memory": -48.42 * 2**30})
    'reclaimable now: 54.53 cores; memory under-requested by 48.42 GiB'
    """
    reclaim: list[str] = []
    short: list[str] = []
    for resource, name in (("cpu", "CPU"), ("memory", "memory")):
        value = cluster.get(resource)
        if value is None:
            continue
        words = amount_words(value, resource, reclaimable_word=False)
        if words.startswith("under-requested"):
            short.append(f"{name} {words}")
        else:
            reclaim.append(words)
    if not reclaim and not short:
        return "reclaimable now: nothing measured"
    if not reclaim:
        return "nothing reclaimable now: " + ", ".join(short)
    return "reclaimable now: " + ", ".join(reclaim) + "".join(f"; {s}" for s in short)


# ---- the HPA: why this replica count ---------------------------------------------------------------


@dataclass(frozen=True)
class HPAContext:
    """What the words of one HPA decision may name.

    min_replicas / max_replicas: the bounds in force (after any schedule); spec_min / spec_max: the
    spec's own, None when unknown; schedule: the time-of-day window in force; driver: the metric
    that set the count, in words (`metric_words`), None when no metric proposed one.
    """

    min_replicas: int
    max_replicas: int
    spec_min: int | None = None
    spec_max: int | None = None
    schedule: str | None = None
    driver: str | None = None


def _min_phrase(ctx: HPAContext) -> str:
    if ctx.schedule and ctx.spec_min is not None and ctx.min_replicas != ctx.spec_min:
        verb = "raises" if ctx.min_replicas > ctx.spec_min else "lowers"
        return f"schedule {ctx.schedule} {verb} the minimum from {ctx.spec_min} to {ctx.min_replicas}"
    return f"the minimum is {ctx.min_replicas}"


def _max_phrase(ctx: HPAContext) -> str:
    if ctx.schedule and ctx.spec_max is not None and ctx.max_replicas != ctx.spec_max:
        verb = "raises" if ctx.max_replicas > ctx.spec_max else "lowers"
        return f"schedule {ctx.schedule} {verb} the maximum from {ctx.spec_max} to {ctx.max_replicas}"
    return f"the maximum is {ctx.max_replicas}"


# Reasons whose words name no bound, so they read right for a sync that decided nothing.
_WITHOUT_BOUNDS = frozenset({"NoPods", "InvalidMetrics", "ScalingDisabled", "WithinTolerance", "HistoryNoScaleDown"})


def _split_camel(reason: str) -> str:
    words = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", reason)
    return " ".join(w.lower() for w in words) if words else reason


def hpa_why(reason: str, ctx: HPAContext) -> str:
    """Why an HPA chose its count, in words; free of per-sync numbers (see the module's docstring).

    `reason` is the decision's rule (upstream's condition reasons, metricsd's MaxStepLimit,
    HistoryNoScaleDown and NoPods); an unknown one is spelt out from its CamelCase.

    >>> hpa_why("BelowMinReplicas", HPAContext(36, 60, 10, 60, "evening-peak"))
    'schedule evening-peak raises the minimum from 10 to 36'
    """
    more = ctx.driver or "the metrics ask for more replicas"
    fewer = ctx.driver or "the metrics ask for fewer replicas"
    below_min = _min_phrase(ctx)
    above_max = _max_phrase(ctx)
    words = {
        "BelowMinReplicas": below_min if below_min.startswith("schedule")
        else f"below the minimum of {ctx.min_replicas}",
        "AboveMaxReplicas": above_max if above_max.startswith("schedule")
        else f"above the maximum of {ctx.max_replicas}",
        "TooManyReplicas": f"{more}, but {above_max}",
        "TooFewReplicas": f"{fewer}, but {below_min}",
        "ScaleUpLimit": f"{more}; adding replicas as fast as the scale-up policy allows",
        "ScaleDownLimit": f"{fewer}; removing replicas as fast as the scale-down policy allows",
        "MaxStepLimit": f"{ctx.driver or 'the metrics ask for a bigger change'}; one action may change the count by "
                        "at most the step limit",
        "ScaleUpStabilized": f"{more}, but the scale-up stabilisation window keeps the lowest recent recommendation",
        "ScaleDownStabilized": f"{fewer}, but the scale-down stabilisation window keeps the highest recent "
                               "recommendation",
        "WithinTolerance": "the metrics are within tolerance of their targets",
        "DesiredWithinRange": ctx.driver or "as the metrics ask",
        "ReadyForNewScale": ctx.driver or "as the metrics ask",
        "HistoryNoScaleDown": "live metrics are missing; yesterday's suggest fewer replicas, but the fallback never "
                              "scales down",
        "InvalidMetrics": "the metrics cannot be read, so the count is kept",
        "ScalingDisabled": "scaling is off while the target has 0 replicas",
        "NoPods": "no pods of the target report metrics",
    }
    return words.get(reason, _split_camel(reason))


def hpa_status_line(current: int | None, desired: int | None, min_replicas: int | None, max_replicas: int | None,
                    why: str) -> str:
    """'34 -> 36 replicas (bounds 36..60): schedule evening-peak raises the minimum from 10 to 36'."""
    lo, hi = ("?" if v is None else v for v in (min_replicas, max_replicas))
    bounds = f"(bounds {lo}..{hi})"
    if current is None:
        head = "no replica count"
    elif desired is None or desired == current:
        head = f"stays at {current} replicas"
    else:
        head = f"{current} -> {desired} replicas"
    return f"{head} {bounds}: {why}"


def _number(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e6 else f"{value:.3g}"


def _target_text(metric: str, target: Mapping[str, Any]) -> str:
    kind, value = target.get("type"), target.get("value")
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "its target"
    if kind == "Utilization":
        return f"its {_number(value)}% target"
    resource = metric.rsplit("/", 1)[-1]
    try:
        if resource == "memory":
            whole = parse_quantity(value)
            return f"its {whole / 2**20:.0f}Mi target" if whole >= 2**20 else f"its {_number(whole)} byte target"
        if resource == "cpu":
            return f"its {format_cpu(parse_quantity(value))} target"
    except QuantityError:
        pass
    return f"its {_number(float(value))} target"


def metric_words(metric: str, target: Mapping[str, Any], usage_ratio: object, source: str = "live",
                 rule: str | None = None) -> str:
    """One metric against its target: 'CPU utilisation above its 50% target'.

    `metric` is the spec's key (Resource/cpu, ContainerResource/app/cpu, Pods/qps, External/queue);
    the relation comes from the usage ratio (current / target) and the metric's own rule, so it
    needs no current value.
    """
    parts = metric.split("/")
    kind, name = parts[0], parts[-1]
    per = {"cpu": "CPU", "memory": "memory"}.get(name, name)
    if kind in ("Resource", "ContainerResource"):
        subject = f"{per} utilisation" if target.get("type") == "Utilization" else f"{per} per pod"
        if kind == "ContainerResource" and len(parts) == 3:
            subject += f" of container {parts[1]}"
    elif kind == "Pods":
        subject = f"{name} per pod"
    else:
        subject = name
    if source == "history":
        subject = f"yesterday's {subject}"
    if rule is not None and rule.endswith("WithinTolerance"):
        relation = "within tolerance of"
    elif isinstance(usage_ratio, int | float) and usage_ratio > 1.0:
        relation = "above"
    elif isinstance(usage_ratio, int | float) and usage_ratio < 1.0:
        relation = "below"
    else:
        relation = "at"
    return f"{subject} {relation} {_target_text(metric, target)}"


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _driver(rows: Sequence[Mapping[str, Any]], metric_replicas: object) -> str | None:
    """The metric whose proposal set the count (the largest, as Kubernetes takes), in words."""
    proposing = [r for r in rows if _int(r.get("replicas")) is not None]
    if not proposing:
        return None
    wanted = _int(metric_replicas)
    chosen = next((r for r in proposing if r.get("replicas") == wanted), None) if wanted is not None else None
    row = chosen or max(proposing, key=lambda r: r.get("replicas") or 0)
    return metric_words(str(row.get("metric", "")), row.get("target") or {}, row.get("usageRatio"),
                        str(row.get("source", "live")), row.get("rule"))


def hpa_context(entry: Mapping[str, Any], spec_min: int | None, spec_max: int | None) -> HPAContext | None:
    """The words' context from one HPA history entry (the controller's JSON), None without bounds
    (a sync that could not decide)."""
    result = entry.get("result") or {}
    lo, hi = _int(result.get("minReplicas")), _int(result.get("maxReplicas"))
    if lo is None or hi is None:
        return None
    rows = (entry.get("inputs") or {}).get("metrics") or []
    return HPAContext(lo, hi, spec_min, spec_max, result.get("schedule") or None,
                      _driver([r for r in rows if isinstance(r, Mapping)], result.get("metricReplicas")))


def hpa_entry_why(entry: Mapping[str, Any], spec_min: int | None = None, spec_max: int | None = None) -> str:
    """`hpa_why` of one HPA history entry (the controller's JSON), with the spec's bounds when known."""
    ctx = hpa_context(entry, spec_min, spec_max)
    rule = str(entry.get("rule", ""))
    if ctx is None:  # no decision was made (NoPods): words that need no bounds
        return hpa_why(rule, HPAContext(0, 0)) if rule in _WITHOUT_BOUNDS else _split_camel(rule)
    return hpa_why(rule, ctx)
