"""``custom.metrics.k8s.io/v1beta2`` and ``external.metrics.k8s.io/v1beta1`` from rules.

Discovery asks the backend for the metric names each rule's ``seriesQuery`` matches (label values
of ``__name__``: no samples), and keeps them for ``relist_s`` (prometheus-adapter's
``--metrics-relist-interval``); a name not yet seen triggers one early relist, at most once a
second. A value request renders the rule's ``metricsQuery`` for the objects asked and sends the
pushed-down aggregate it plans to. Objects are matched by their label (``pod="web-1"``, or
``pod!=""`` for ``*``: metricsd cannot list the cluster's pods, so ``*`` means every object with
data), plus the namespace's label and the request's ``metricSelector`` / ``labelSelector``.

The mapping from answers to ``MetricValueList`` / ``ExternalMetricValueList`` is pure
(``metric_values``, ``external_values``); ``CustomMetrics`` holds the cache and does the I/O.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from metricsd.k8sapi.discovery import CUSTOM, EXTERNAL, ResourceEntry
from metricsd.k8sapi.labelselector import parse_label_selector
from metricsd.k8sapi.quantity import milli_quantity, rfc3339
from metricsd.k8sapi.rules import KINDS, GroupResource, Query, Rule, RuleError, RuleSet, render
from metricsd.model import METRIC_NAME
from metricsd.promql.pushdown import result_of
from metricsd.promql.values import Vector
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import MetricsBackend
from metricsd.rpc.wire import matchers_to_pb
from metricsd.selector import Matcher, MatchOp

__all__ = ["CustomMetrics", "Discovered", "MetricNotFound", "custom_resources", "external_resources",
           "external_values", "metric_values", "object_matchers"]


class MetricNotFound(LookupError):
    """No rule exposes the metric for that resource, or no object has a value (HTTP 404)."""


@dataclass(frozen=True)
class Discovered:
    """Per API metric name, the rule exposing it and the series name it comes from."""

    custom: dict[str, tuple[Rule, str]]
    external: dict[str, tuple[Rule, str]]


def discover(rules: RuleSet, names_per_rule: Sequence[Sequence[str]]) -> Discovered:
    """Pure: the API names of the series names each rule's seriesQuery found (custom rules first,
    then external, as in ``rules``); the first rule to expose a name wins."""
    custom: dict[str, tuple[Rule, str]] = {}
    external: dict[str, tuple[Rule, str]] = {}
    for rule, names in zip((*rules.custom, *rules.external), names_per_rule, strict=True):
        target = external if rule.external else custom
        for series in sorted(names):
            api = rule.api_name(series)
            if api and api not in target:
                target[api] = (rule, series)
    return Discovered(custom, external)


def custom_resources(d: Discovered) -> list[ResourceEntry]:
    """``<resource>/<metric>`` per resource a rule maps, as prometheus-adapter lists them."""
    out = {ResourceEntry(f"{gr.resource}/{api}", gr.namespaced, "MetricValueList", ("get",))
           for api, (rule, _) in d.custom.items() for gr in rule.overrides.values()}
    return sorted(out, key=lambda e: e.name)


def external_resources(d: Discovered) -> list[ResourceEntry]:
    return [ResourceEntry(api, True, "ExternalMetricValueList", ("get",)) for api in sorted(d.external)]


def object_matchers(rule: Rule, resource: GroupResource, namespace: str | None, name: str,
                    selector: Sequence[Matcher]) -> tuple[list[Matcher], str]:
    """The matchers selecting one object (or every object, for ``*``) of ``resource`` and the
    label naming it. Raises MetricNotFound when the rule does not map that resource."""
    label = rule.label_of(resource)
    if label is None:
        raise MetricNotFound(f"the metric is not available for {resource.resource}")
    out: list[Matcher] = []
    ns_label = rule.namespace_label
    if namespace is not None and ns_label is not None and ns_label != label:
        out.append(Matcher(MatchOp.EQ, ns_label, namespace))
    out.append(Matcher(MatchOp.NEQ, label, "") if name == "*" else Matcher(MatchOp.EQ, label, name))
    out.extend(selector)
    return out, label


def _selector_doc(selector_text: str | None) -> dict[str, Any] | None:
    """``metric.selector`` as a LabelSelector object (matchLabels for equality only; otherwise the
    text is kept in matchExpressions form by the caller); None when the request had none."""
    if not selector_text:
        return None
    match_labels: dict[str, str] = {}
    expressions: list[dict[str, Any]] = []
    ops = {"in": "In", "notin": "NotIn", "exists": "Exists", "!exists": "DoesNotExist", "!=": "NotIn"}
    for r in parse_label_selector(selector_text):
        if r.op == "=":
            match_labels[r.key] = r.values[0]
        else:
            expr: dict[str, Any] = {"key": r.key, "operator": ops[r.op]}
            if r.values:
                expr["values"] = list(r.values)
            expressions.append(expr)
    out: dict[str, Any] = {}
    if match_labels:
        out["matchLabels"] = match_labels
    if expressions:
        out["matchExpressions"] = expressions
    return out


def metric_values(result: Vector, api_name: str, resource: GroupResource, label: str, namespace: str | None,
                  at_ms: int, selector_text: str | None = None) -> dict[str, Any]:
    """A ``MetricValueList`` (v1beta2) of every object in the answer, sorted by name."""
    items = []
    selector = _selector_doc(selector_text)
    for s in sorted(result.samples, key=lambda s: dict(s.labels).get(label, "")):
        name = dict(s.labels).get(label, "")
        if not name or s.value != s.value or s.value in (float("inf"), float("-inf")):
            continue
        obj: dict[str, Any] = {"kind": resource.kind}
        if resource.namespaced and namespace is not None:
            obj["namespace"] = namespace
        obj["name"] = name
        obj["apiVersion"] = resource.api_version
        items.append({"describedObject": obj, "metric": {"name": api_name, "selector": selector},
                      "timestamp": rfc3339(at_ms), "value": milli_quantity(s.value)})
    return {"kind": "MetricValueList", "apiVersion": CUSTOM.group_version, "metadata": {}, "items": items}


def external_values(result: Vector, api_name: str, at_ms: int) -> dict[str, Any]:
    """An ``ExternalMetricValueList``: one item per group of the answer, its labels as metricLabels."""
    items = []
    for s in sorted(result.samples, key=lambda s: s.labels):
        if s.value != s.value or s.value in (float("inf"), float("-inf")):
            continue
        items.append({"metricName": api_name, "metricLabels": {k: v for k, v in s.labels if k != METRIC_NAME},
                      "timestamp": rfc3339(at_ms), "value": milli_quantity(s.value)})
    return {"kind": "ExternalMetricValueList", "apiVersion": EXTERNAL.group_version, "metadata": {}, "items": items}


class CustomMetrics:
    def __init__(self, backend: MetricsBackend, rules: RuleSet, relist_s: float = 60.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.backend = backend
        self.rules = rules
        self.relist_s = relist_s
        self.monotonic = monotonic
        self._found = Discovered({}, {})
        self._at = -1e18
        self._lock = asyncio.Lock()

    async def _relist(self) -> None:
        names = []
        for rule in (*self.rules.custom, *self.rules.external):
            req = pb.LabelValuesRequest(name=METRIC_NAME)
            req.matchers.extend(matchers_to_pb(list(rule.series_query)))
            names.append(list((await self.backend.label_values(req)).values))
        self._found = discover(self.rules, names)
        self._at = self.monotonic()

    async def discovered(self, need: str | None = None, external: bool = False) -> Discovered:
        """The discovered names, relisted when older than ``relist_s`` or when ``need`` is missing
        (then at most once a second)."""
        async with self._lock:
            age = self.monotonic() - self._at
            table = self._found.external if external else self._found.custom
            if age >= self.relist_s or (need is not None and need not in table and age >= 1.0):
                await self._relist()
            return self._found

    async def _ask(self, q: Query) -> Vector:
        result = result_of(q.plan, await self.backend.aggregate(q.plan.request))
        assert isinstance(result, Vector)
        return result

    async def custom(self, api_name: str, resource_name: str, namespace: str | None, name: str,
                     selector: Sequence[Matcher], selector_text: str | None, at_ms: int) -> dict[str, Any]:
        """Raises MetricNotFound; RuleError (a 500: the rule was checked at start) is not expected."""
        resource = KINDS.get(resource_name)
        if resource is None:
            raise MetricNotFound(f"unknown resource {resource_name!r}")
        found = (await self.discovered(api_name)).custom.get(api_name)
        if found is None:
            raise MetricNotFound(f"the server could not find the metric {api_name} for {resource.resource}")
        rule, series = found
        matchers, label = object_matchers(rule, resource, namespace if resource.namespaced else None, name,
                                          selector)
        doc = metric_values(await self._ask(render(rule, series, matchers, [label], at_ms)), api_name, resource,
                            label, namespace, at_ms, selector_text)
        if name != "*" and not doc["items"]:
            raise MetricNotFound(f"the server could not find the metric {api_name} for {resource.resource} {name}")
        return doc

    async def external(self, api_name: str, namespace: str, selector: Sequence[Matcher], at_ms: int
                       ) -> dict[str, Any]:
        found = (await self.discovered(api_name, external=True)).external.get(api_name)
        if found is None:
            raise MetricNotFound(f"the server could not find the external metric {api_name}")
        rule, series = found
        matchers = list(selector)
        if rule.namespaced and rule.namespace_label is not None:
            matchers.insert(0, Matcher(MatchOp.EQ, rule.namespace_label, namespace))
        if not matchers:
            matchers = [Matcher(MatchOp.EQ, METRIC_NAME, series)]  # PromQL needs one matcher inside {}
        try:
            query = render(rule, series, matchers, [], at_ms)
        except RuleError as e:
            raise MetricNotFound(str(e)) from e
        return external_values(await self._ask(query), api_name, at_ms)
