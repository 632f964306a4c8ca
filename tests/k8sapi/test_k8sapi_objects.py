"""Aggregates mapped to the API objects metrics-server and prometheus-adapter return, field by field."""

from __future__ import annotations

from metricsd.k8sapi.custom import custom_resources, discover, external_resources, external_values, metric_values
from metricsd.k8sapi.resource import node_items, pod_items
from metricsd.k8sapi.rules import KINDS, load_rules
from metricsd.promql.values import Sample, Vector

AT = 1_700_000_000_000
RULES = load_rules("""
rules:
- seriesQuery: '{__name__=~"^http_.*_total$",namespace!="",pod!=""}'
  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
  name: {matches: "^(.*)_total$", as: "${1}_per_second"}
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)'
externalRules:
- seriesQuery: 'queue_depth'
  metricsQuery: 'max(<<.Series>>{<<.LabelMatchers>>}) by (queue)'
""")


def test_pod_metrics_keep_complete_containers_only() -> None:
    cpu = {("shop", "web-1", "app"): 0.25, ("shop", "web-1", "sidecar"): 0.001, ("shop", "web-2", "app"): 1.0}
    memory = {("shop", "web-1", "app"): 4096.0 * 1000, ("shop", "web-1", "sidecar"): 1024.0**2}
    assert pod_items(cpu, memory, AT, 60_000) == [{
        "metadata": {"name": "web-1", "namespace": "shop", "creationTimestamp": "2023-11-14T22:13:20Z"},
        "timestamp": "2023-11-14T22:13:20Z", "window": "1m0s",
        "containers": [{"name": "app", "usage": {"cpu": "250m", "memory": "4000Ki"}},
                       {"name": "sidecar", "usage": {"cpu": "1m", "memory": "1Mi"}}]}]


def test_node_metrics() -> None:
    assert node_items({("n1",): 2.5}, {("n1",): 8 * 1024.0**3}, AT, 30_000) == [{
        "metadata": {"name": "n1", "creationTimestamp": "2023-11-14T22:13:20Z"},
        "timestamp": "2023-11-14T22:13:20Z", "window": "30s", "usage": {"cpu": "2500m", "memory": "8Gi"}}]


def test_discovery_lists_each_metric_per_resource() -> None:
    found = discover(RULES, [["http_requests_total", "http_debug", "other"], ["queue_depth"]])
    assert [(e.name, e.namespaced, e.kind, e.verbs) for e in custom_resources(found)] == [
        ("namespaces/http_requests_per_second", False, "MetricValueList", ("get",)),
        ("pods/http_requests_per_second", True, "MetricValueList", ("get",))]
    assert [(e.name, e.kind) for e in external_resources(found)] == [("queue_depth", "ExternalMetricValueList")]


def test_metric_value_list_v1beta2() -> None:
    result = Vector(AT, [Sample((("pod", "web-2"),), 0.033), Sample((("pod", "web-1"),), 2.0),
                         Sample((("pod", "web-3"),), float("nan"))])
    doc = metric_values(result, "http_requests_per_second", KINDS["pod"], "pod", "shop", AT)
    assert doc == {"kind": "MetricValueList", "apiVersion": "custom.metrics.k8s.io/v1beta2", "metadata": {},
                   "items": [{"describedObject": {"kind": "Pod", "namespace": "shop", "name": name,
                                                  "apiVersion": "/v1"},
                              "metric": {"name": "http_requests_per_second", "selector": None},
                              "timestamp": "2023-11-14T22:13:20Z", "value": value}
                             for name, value in (("web-1", "2"), ("web-2", "33m"))]}
    ns = metric_values(Vector(AT, [Sample((("namespace", "shop"),), 5.0)]), "m", KINDS["namespace"], "namespace",
                       "shop", AT, "verb=GET,code in (200)")
    assert ns["items"][0]["describedObject"] == {"kind": "Namespace", "name": "shop", "apiVersion": "/v1"}
    assert ns["items"][0]["metric"]["selector"] == {
        "matchLabels": {"verb": "GET"}, "matchExpressions": [{"key": "code", "operator": "In", "values": ["200"]}]}


def test_external_metric_value_list() -> None:
    doc = external_values(Vector(AT, [Sample((("queue", "orders"),), 7.0), Sample((("queue", "billing"),), 3.5)]),
                          "queue_depth", AT)
    assert doc == {"kind": "ExternalMetricValueList", "apiVersion": "external.metrics.k8s.io/v1beta1", "metadata": {},
                   "items": [{"metricName": "queue_depth", "metricLabels": {"queue": q},
                              "timestamp": "2023-11-14T22:13:20Z", "value": v}
                             for q, v in (("billing", "3500m"), ("orders", "7"))]}
