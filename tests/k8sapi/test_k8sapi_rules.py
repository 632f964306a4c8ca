"""prometheus-adapter rule files: what is read, how names map, which queries they make, and the
error each kind of bad rule gets (naming its field)."""

from __future__ import annotations

import re

import pytest

from metricsd.k8sapi.rules import KINDS, RuleError, load_rules, render
from metricsd.proto import metricsd_pb2 as pb
from metricsd.selector import Matcher, MatchOp

GOOD = """
rules:
- seriesQuery: '{__name__=~"^http_.*_total$",namespace!="",pod!=""}'
  seriesFilters: [{isNot: "^http_debug_.*"}]
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
      workload: {group: apps, resource: deployment}
  name: {matches: "^(.*)_total$", as: "${1}_per_second"}
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)'
externalRules:
- seriesQuery: 'queue_depth{namespace!=""}'
  resources: {overrides: {namespace: {resource: namespace}}}
  metricsQuery: 'max(<<.Series>>{<<.LabelMatchers>>}) by (queue)'
resourceRules: {cpu: {}}
"""


def test_a_good_file_reads_and_names_metrics_as_the_adapter_does() -> None:
    rs = load_rules(GOOD)
    rule, ext = rs.custom[0], rs.external[0]
    assert rule.api_name("http_requests_total") == "http_requests_per_second"
    assert rule.api_name("http_debug_total") is None  # seriesFilters isNot
    assert rule.api_name("grpc_calls") is None  # name.matches is a filter too
    assert ext.api_name("queue_depth") == "queue_depth"  # default as: $0
    assert rule.overrides["workload"] == KINDS["deployment"]
    assert [(m.op, m.name) for m in rule.series_query] == [(MatchOp.RE, "__name__"), (MatchOp.NEQ, "namespace"),
                                                          (MatchOp.NEQ, "pod")]


def test_go_expansion_takes_the_longest_name() -> None:
    rule = load_rules(GOOD.replace("${1}_per_second", "$1_per_second")).custom[0]
    assert rule.api_name("http_requests_total") == ""  # Go reads ${1_per_second}: empty, as the adapter


def test_render_fills_the_template_and_plans_a_pushed_down_aggregate() -> None:
    rule = load_rules(GOOD).custom[0]
    q = render(rule, "http_requests_total", [Matcher(MatchOp.EQ, "namespace", "shop"),
                                             Matcher(MatchOp.NEQ, "pod", "")], ["pod"], 1_000)
    assert q.promql == 'sum(rate(http_requests_total{namespace="shop",pod!=""}[2m])) by (pod)'
    req = q.plan.request
    assert list(req.group_by) == ["pod"] and req.across == pb.ACROSS_SUM and req.start_ms == req.end_ms == 1_000
    assert req.query.series_fn == pb.SERIES_RATE and req.query.window_ms == 120_000


@pytest.mark.parametrize(("change", "says"), [
    (("seriesQuery: '{__name__", "seriesQueryX: '{__name__"), "rules[0].seriesQueryX: unknown field"),
    (("metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)'", ""),
     "rules[0].metricsQuery: required"),
    (("by (<<.GroupBy>>)'\nexternal", "by (<<.GroupBy>>) + 1'\nexternal"), "rules[0].metricsQuery: "),
    (("by (<<.GroupBy>>)'\nexternal", "'\nexternal"), "rules[0].metricsQuery: must group by <<.GroupBy>>"),
    (("[2m])) by (<<.GroupBy>>)", "[2m])) by (<<.Group>>)"), "rules[0].metricsQuery: unknown template field"),
    (("{resource: pod}", "{resource: widget}"), "rules[0].resources.overrides.pod.resource: unknown resource"),
    (("{group: apps, resource: deployment}", "{group: batch, resource: deployment}"),
     "rules[0].resources.overrides.workload.group"),
    (("    overrides:\n", "    template: '<<.Resource>>'\n    overrides:\n"), "rules[0].resources.template"),
    (('"^(.*)_total$", as: "${1}_per_second"', '"^(.*)_(.*)$"'), "rules[0].name.as: required"),
    (('{isNot: "^http_debug_.*"}', '{isNot: "(("}'), "rules[0].seriesFilters[0].isNot: bad regular expression"),
    (("{isNot:", "{maybe:"), "rules[0].seriesFilters[0]: must be"),
    (("'queue_depth{namespace!=\"\"}'", "'rate(x[1m])'"), "externalRules[0].seriesQuery: "),
    (("resourceRules", "otherRules"), "otherRules: unknown field"),
    (("max(<<.Series>>", "max(sum(<<.Series>>{<<.LabelMatchers>>}) + <<.Series>>"), "externalRules[0].metricsQuery"),
])
def test_bad_rules_name_the_field(change: tuple[str, str], says: str) -> None:
    text = GOOD.replace(*change)
    assert text != GOOD
    with pytest.raises(RuleError, match="^" + re.escape(says)):
        load_rules(text)


def test_not_yaml_and_wrong_types_are_refused() -> None:
    with pytest.raises(RuleError, match="not YAML"):
        load_rules("rules: [")
    with pytest.raises(RuleError, match="rules: must be a list"):
        load_rules("rules: {a: 1}")
    with pytest.raises(RuleError, match=re.escape("rules[0].seriesQuery: must be a str")):
        load_rules("rules: [{seriesQuery: 3}]")
    with pytest.raises(RuleError, match="more than the limit"):
        load_rules("rules:\n" + "- {}\n" * 501)
