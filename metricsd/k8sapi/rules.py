"""prometheus-adapter's rules (its ``docs/config.md``), read and checked, and the queries they make.

A rule file is YAML or JSON with ``rules`` (custom metrics) and ``externalRules`` (external
metrics); ``resourceRules`` is accepted and ignored (``metrics.k8s.io`` is built in). Each rule:

* ``seriesQuery``: a series selector (``{__name__=~"^container_.*",namespace!="",pod!=""}`` or
  ``http_requests_total{pod!=""}``): which metric names the rule exposes (asked as label values of
  ``__name__``, never as series);
* ``seriesFilters``: ``- is: REGEX`` / ``- isNot: REGEX`` on those names;
* ``resources.overrides``: series label -> ``{group, resource}``; the label's value names the
  object (``resources.template`` is refused: metricsd has no API discovery to expand it with);
  ``resources.namespaced: false`` on an external rule leaves the namespace out of its queries;
* ``name``: ``matches`` (a regex, default ``.*``) and ``as`` (Go's ``$1`` / ``${1}`` expansion;
  default ``$0`` without a capture group, ``$1`` with one, an error with more);
* ``metricsQuery``: PromQL with ``<<.Series>>``, ``<<.LabelMatchers>>`` and ``<<.GroupBy>>``.

metricsd answers a rule only from pushed-down aggregates, so a ``metricsQuery`` must render to a
shape ``metricsd/promql/pushdown.py`` plans (an aggregation ``by (...)`` of ``rate``,
``increase``, ``*_over_time`` or a selector, or the ratio of two); a custom rule's must group by
``<<.GroupBy>>``. Both are checked when the file is read, by rendering each rule with sample
objects: a rule that could not be answered stops the process at start, naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import promql_parser as pp
import yaml

from metricsd.k8sapi.labelselector import promql_matchers
from metricsd.promql.pushdown import PushdownPlan, plan
from metricsd.promql.selectors import to_matchers
from metricsd.selector import InvalidSelector, Matcher, MatchOp

__all__ = ["KINDS", "MAX_RULES", "GroupResource", "Query", "Rule", "RuleError", "RuleSet", "load_rules",
           "parse_rules", "render"]

MAX_RULES = 500
MAX_FILE_BYTES = 1 << 20
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_PLACEHOLDER = re.compile(r"<<\s*\.?([A-Za-z]*)\s*>>")
_GO_GROUP = re.compile(r"\$(\$|\{([A-Za-z0-9_]*)\}|([A-Za-z0-9_]+))")


class RuleError(ValueError):
    """A rule file that cannot be used; the message starts with the field's path (``rules[2].name.as``)."""


@dataclass(frozen=True)
class GroupResource:
    """A Kubernetes resource an override names: API group, plural resource, kind, scope."""

    group: str
    resource: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        """The ``describedObject.apiVersion`` prometheus-adapter writes: ``<group>/<version>``
        (``/v1`` for the core group)."""
        return f"{self.group}/v1"


# The resources an override may name, by any of the spellings kubectl accepts; metricsd has no
# access to the API server's discovery, so the list is fixed.
KINDS: dict[str, GroupResource] = {}
for _gr, _aliases in (
    (GroupResource("", "pods", "Pod", True), ("pod", "pods", "po")),
    (GroupResource("", "namespaces", "Namespace", False), ("namespace", "namespaces", "ns")),
    (GroupResource("", "nodes", "Node", False), ("node", "nodes", "no")),
    (GroupResource("", "services", "Service", True), ("service", "services", "svc")),
    (GroupResource("apps", "deployments", "Deployment", True), ("deployment", "deployments", "deploy")),
    (GroupResource("apps", "statefulsets", "StatefulSet", True), ("statefulset", "statefulsets", "sts")),
    (GroupResource("apps", "daemonsets", "DaemonSet", True), ("daemonset", "daemonsets", "ds")),
    (GroupResource("apps", "replicasets", "ReplicaSet", True), ("replicaset", "replicasets", "rs")),
    (GroupResource("batch", "jobs", "Job", True), ("job", "jobs")),
    (GroupResource("networking.k8s.io", "ingresses", "Ingress", True), ("ingress", "ingresses", "ing")),
):
    for _alias in _aliases:
        KINDS[_alias] = _gr


@dataclass(frozen=True)
class Rule:
    where: str  # "rules[0]" or "externalRules[1]"
    external: bool
    series_query: tuple[Matcher, ...]
    filters: tuple[tuple[bool, re.Pattern[str]], ...]  # (keep if it matches?, regex)
    overrides: Mapping[str, GroupResource]  # series label -> resource
    matches: re.Pattern[str]
    as_: str
    metrics_query: str
    namespaced: bool = True

    def api_name(self, series: str) -> str | None:
        """The API's name for a metric name, or None when this rule does not expose it."""
        for keep, regex in self.filters:
            if (regex.search(series) is not None) != keep:
                return None
        m = self.matches.search(series)
        if m is None:
            return None
        return _expand(self.as_, m)

    def label_of(self, resource: GroupResource) -> str | None:
        for label, gr in self.overrides.items():
            if gr == resource:
                return label
        return None

    @property
    def namespace_label(self) -> str | None:
        return self.label_of(KINDS["namespace"])


def _expand(template: str, m: re.Match[str]) -> str:
    """Go's ``Regexp.Expand``: ``$name`` takes the longest run of letters, digits and ``_``, so
    ``$1_total`` names group ``1_total`` (empty) and needs ``${1}_total``; unknown groups are empty."""
    def one(g: re.Match[str]) -> str:
        if g.group(1) == "$":
            return "$"
        name = g.group(2) if g.group(2) is not None else g.group(3)
        try:
            value = m.group(int(name)) if name.isdigit() else m.group(name)
        except IndexError:
            return ""
        return value or ""
    return _GO_GROUP.sub(one, template)


@dataclass(frozen=True)
class Query:
    """One question to a rule: the rendered PromQL and the pushed-down plan answering it."""

    promql: str
    plan: PushdownPlan


def render(rule: Rule, series: str, matchers: Sequence[Matcher], group_by: Sequence[str], at_ms: int,
           lookback_ms: int = 300_000) -> Query:
    """The rule's ``metricsQuery`` for these objects, planned as an aggregate at ``at_ms``. Raises
    RuleError when the text does not parse or cannot be pushed down."""
    values = {"Series": series, "LabelMatchers": promql_matchers(list(matchers)), "GroupBy": ",".join(group_by)}
    text = _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), rule.metrics_query)
    try:
        ast = pp.parse(text)
    except (ValueError, RuntimeError) as e:
        raise RuleError(f"{rule.where}.metricsQuery: {text!r} does not parse: {e}") from e
    p = plan(ast, at_ms, at_ms, 0, lookback_ms, instant=True)
    if p is None or p.select is not None:
        raise RuleError(f"{rule.where}.metricsQuery: {text!r} is not a shape metricsd answers from pushed-down "
                        f"aggregates: AGG by (...) (FN(<<.Series>>{{<<.LabelMatchers>>}}[w])) with AGG sum, avg, "
                        f"min, max or count and FN rate, increase or *_over_time (or a plain selector), or the "
                        f"ratio of two such")
    return Query(text, p)


# --- reading a rule file ---------------------------------------------------------------------


def _field(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, required: bool = False
           ) -> Any:
    value = doc.get(key)
    if value is None:
        if required:
            raise RuleError(f"{where}.{key}: required")
        return None
    if not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise RuleError(f"{where}.{key}: must be a {names}, got {type(value).__name__}")
    return value


def _regex(text: str, where: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as e:
        raise RuleError(f"{where}: bad regular expression {text!r}: {e}") from e


def _series_query(text: str, where: str) -> tuple[Matcher, ...]:
    try:
        ast: Any = pp.parse(text)
    except (ValueError, RuntimeError) as e:
        raise RuleError(f"{where}: {text!r} is not a series selector: {e}") from e
    if type(ast).__name__ != "VectorSelector" or ast.offset is not None or ast.at is not None:
        raise RuleError(f"{where}: {text!r} must be a plain series selector such as {{__name__=~\"^http_.*\"}}")
    if ast.matchers.or_matchers:
        raise RuleError(f"{where}: 'or' in a selector is not supported")
    try:
        return tuple(to_matchers(ast))
    except (InvalidSelector, ValueError) as e:
        raise RuleError(f"{where}: {e}") from e


_RULE_KEYS = {"seriesQuery", "seriesFilters", "resources", "name", "metricsQuery"}
_SAMPLE = "sample-object"


def _rule(doc: Any, where: str, external: bool) -> Rule:
    if not isinstance(doc, Mapping):
        raise RuleError(f"{where}: must be a mapping, got {type(doc).__name__}")
    unknown = sorted(set(doc) - _RULE_KEYS)
    if unknown:
        raise RuleError(f"{where}.{unknown[0]}: unknown field (known: {', '.join(sorted(_RULE_KEYS))})")
    series_query = _series_query(_field(doc, "seriesQuery", str, where, True), f"{where}.seriesQuery")
    filters = []
    for i, f in enumerate(_field(doc, "seriesFilters", list, where) or []):
        fw = f"{where}.seriesFilters[{i}]"
        if not isinstance(f, Mapping) or len(f) != 1 or next(iter(f)) not in ("is", "isNot") \
                or not isinstance(next(iter(f.values())), str):
            raise RuleError(f"{fw}: must be {{is: REGEX}} or {{isNot: REGEX}}")
        key, text = next(iter(f.items()))
        filters.append((key == "is", _regex(text, f"{fw}.{key}")))
    resources = _field(doc, "resources", Mapping, where) or {}
    rw = f"{where}.resources"
    unknown = sorted(set(resources) - {"overrides", "template", "namespaced"})
    if unknown:
        raise RuleError(f"{rw}.{unknown[0]}: unknown field (known: overrides, namespaced)")
    if resources.get("template") is not None:
        raise RuleError(f"{rw}.template: not supported (metricsd cannot list the cluster's resources to expand "
                        f"it); name each label under resources.overrides")
    namespaced = _field(resources, "namespaced", bool, rw)
    if namespaced is not None and not external:
        raise RuleError(f"{rw}.namespaced: only for externalRules")
    overrides: dict[str, GroupResource] = {}
    for label, target in (_field(resources, "overrides", Mapping, rw) or {}).items():
        ow = f"{rw}.overrides.{label}"
        if not isinstance(label, str) or not _LABEL.fullmatch(label):
            raise RuleError(f"{ow}: {label!r} is not a label name")
        if not isinstance(target, Mapping) or not isinstance(target.get("resource"), str):
            raise RuleError(f"{ow}.resource: required, a resource such as pod or deployment")
        gr = KINDS.get(target["resource"].lower())
        if gr is None:
            raise RuleError(f"{ow}.resource: unknown resource {target['resource']!r} "
                            f"(known: {', '.join(sorted({g.resource for g in KINDS.values()}))})")
        group = target.get("group")
        if group is not None and group != gr.group:
            raise RuleError(f"{ow}.group: {target['resource']} is in group {gr.group!r}, not {group!r}")
        if gr in overrides.values():
            raise RuleError(f"{ow}: {gr.resource} is already mapped to another label")
        overrides[label] = gr
    if not external and not overrides:
        raise RuleError(f"{rw}.overrides: a custom metrics rule must map at least one label to a resource")
    name = _field(doc, "name", Mapping, where) or {}
    nw = f"{where}.name"
    unknown = sorted(set(name) - {"matches", "as"})
    if unknown:
        raise RuleError(f"{nw}.{unknown[0]}: unknown field (known: matches, as)")
    matches = _regex(_field(name, "matches", str, nw) or ".*", f"{nw}.matches")
    as_ = _field(name, "as", str, nw) or ""
    if not as_:
        if matches.groups > 1:
            raise RuleError(f"{nw}.as: required when name.matches has more than one capture group")
        as_ = "$1" if matches.groups == 1 else "$0"
    metrics_query = _field(doc, "metricsQuery", str, where, True)
    for m in _PLACEHOLDER.finditer(metrics_query):
        if m.group(1) not in ("Series", "LabelMatchers", "GroupBy"):
            raise RuleError(f"{where}.metricsQuery: unknown template field {m.group(0)!r} "
                            f"(known: <<.Series>>, <<.LabelMatchers>>, <<.GroupBy>>)")
    rule = Rule(where, external, series_query, tuple(filters), overrides, matches, as_, metrics_query,
                namespaced if namespaced is not None else True)
    _check_answerable(rule)
    return rule


def _check_answerable(rule: Rule) -> None:
    """Render the query as a request would, with sample objects, and require a pushed-down plan
    (grouped by the object's label, for custom rules)."""
    if rule.external:
        matchers = [Matcher(MatchOp.EQ, rule.namespace_label, _SAMPLE)] if rule.namespace_label and rule.namespaced \
            else [Matcher(MatchOp.NEQ, "__sample_label", _SAMPLE)]
        render(rule, "sample_metric", matchers, [], 0)
        return
    for label, gr in rule.overrides.items():
        matchers = [Matcher(MatchOp.EQ, label, _SAMPLE)]
        ns = rule.namespace_label
        if gr.namespaced and ns is not None:
            matchers.insert(0, Matcher(MatchOp.EQ, ns, _SAMPLE))
        q = render(rule, "sample_metric", matchers, [label], 0)
        if label not in q.plan.request.group_by:
            raise RuleError(f"{rule.where}.metricsQuery: must group by <<.GroupBy>> (the object's label, "
                            f"{label!r} for {gr.resource}), so each object's value can be told apart")


@dataclass(frozen=True)
class RuleSet:
    custom: tuple[Rule, ...]
    external: tuple[Rule, ...]


def parse_rules(doc: Any, where: str = "rules file") -> RuleSet:
    """Raises RuleError naming the first field at fault."""
    if doc is None:
        return RuleSet((), ())
    if not isinstance(doc, Mapping):
        raise RuleError(f"{where}: must be a mapping with rules and/or externalRules")
    unknown = sorted(set(doc) - {"rules", "externalRules", "resourceRules"})
    if unknown:
        raise RuleError(f"{unknown[0]}: unknown field (known: rules, externalRules, resourceRules)")
    out: dict[str, list[Rule]] = {"rules": [], "externalRules": []}
    for key in out:
        items = doc.get(key) or []
        if not isinstance(items, list):
            raise RuleError(f"{key}: must be a list, got {type(items).__name__}")
        if len(items) > MAX_RULES:
            raise RuleError(f"{key}: {len(items)} rules, more than the limit of {MAX_RULES}")
        out[key] = [_rule(r, f"{key}[{i}]", key == "externalRules") for i, r in enumerate(items)]
    return RuleSet(tuple(out["rules"]), tuple(out["externalRules"]))


def load_rules(text: str, where: str = "rules file") -> RuleSet:
    """A rule file's text (YAML, of which JSON is a subset). Raises RuleError."""
    if len(text.encode()) > MAX_FILE_BYTES:
        raise RuleError(f"{where}: larger than {MAX_FILE_BYTES} bytes")
    try:
        doc = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as e:
        raise RuleError(f"{where}: not YAML: {e}") from e
    return parse_rules(doc, where)
