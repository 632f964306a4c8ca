"""The ColocationPlan document (our own kind), read into plain settings; errors name the field.

    apiVersion: metricsd.io/v1alpha1
    kind: ColocationPlan
    metadata: {name: night}
    spec:
      pools:                            # the nodes online services may lend, by name or pattern
      - {name: shared, nodeRegex: "node-[0-9]+", keepOnline: 1}
      margin: 0.2                       # online keeps forecast * (1 + margin)
      drainMinutes: 10                  # OnlineToOffline deadline
      drain: wait                       # wait for online pods to leave, or evict them
      noticeMinutes: 15                 # how early offline schedulers are told a node goes back
      returnGraceMinutes: 5             # OfflineToOnline deadline = notice + grace
      minLendMinutes: 120               # no lend shorter than this
      minOnlineMinutes: 30              # a node back online stays so this long before the next lend
      replicaCurves:                    # today's planned replicas: an HPA's target on a pool
      - {hpa: default/frontend, pool: shared, coresPerReplica: 0.5}
      surge:                            # shadow services: take nodes back at once
      - {name: checkout, service: {namespace: shop, workload: checkout}, threshold: 40,
         pool: shared, nodes: 3, order: newestLent}
      surgeNoticeSeconds: 60
      nodeMarks: {stateLabel: metricsd.io/colocation-state, lentTaint: metricsd.io/lent,
                  returnTaint: metricsd.io/returning}
      utcOffset: "+08:00"               # hours of the time-share table
      intervalSeconds: 60
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from metricsd.consumers.colocation.machine import Timing
from metricsd.consumers.colocation.planner import SURGE_ORDERS, PlanSettings, SurgeRule
from metricsd.consumers.overcommit.config import _offset
from metricsd.consumers.specfields import Node, SpecError, load_documents

__all__ = ["ColocationSpec", "CurveSpec", "NodeMarks", "PoolSelector", "load_colocation_yaml", "parse_colocation"]

_MIN = 60_000
# Kubernetes label keys: an optional DNS-subdomain prefix and a name of up to 63 characters.
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_MAX_POOLS = 100
_MAX_NODES = 10_000
_MAX_RULES = 100


@dataclass(frozen=True)
class PoolSelector:
    """A pool's nodes: listed names, or every node whose name fully matches the pattern."""

    name: str
    nodes: tuple[str, ...] = ()
    node_regex: re.Pattern[str] | None = None
    keep_online: int = 0

    def select(self, names: list[str]) -> tuple[str, ...]:
        if self.node_regex is None:
            return self.nodes
        pattern = self.node_regex
        return tuple(sorted(n for n in names if pattern.fullmatch(n)))


@dataclass(frozen=True)
class CurveSpec:
    namespace: str
    hpa: str
    pool: str
    cores_per_replica: float
    share: float = 1.0


@dataclass(frozen=True)
class NodeMarks:
    """The Kubernetes names the backend puts on nodes: the state label and the two NoSchedule
    taints (lent: keeps online pods off; returning: keeps new offline pods off)."""

    state_label: str = "metricsd.io/colocation-state"
    lent_taint: str = "metricsd.io/lent"
    return_taint: str = "metricsd.io/returning"


@dataclass(frozen=True)
class ColocationSpec:
    name: str = "colocation"
    pools: tuple[PoolSelector, ...] = ()
    settings: PlanSettings = field(default_factory=PlanSettings)
    evict: bool = False
    curves: tuple[CurveSpec, ...] = ()
    surge: tuple[SurgeRule, ...] = ()
    surge_services: dict[str, tuple[str, str]] = field(default_factory=dict)
    marks: NodeMarks = field(default_factory=NodeMarks)
    interval_s: float = 60.0


def load_colocation_yaml(text: str) -> list[ColocationSpec]:
    """Every ColocationPlan document of a YAML text; other kinds are skipped. Raises SpecError."""
    return load_documents(text, "ColocationPlan", parse_colocation)


def _minutes(spec: Node, key: str, default: float, minimum: float = 0.0) -> int:
    return int(spec.number(key, default, minimum=minimum, maximum=7 * 24 * 60) * _MIN)


def _label_key(node: Node, key: str, default: str) -> str:
    value = node.string(key, default)
    if not _LABEL_KEY.match(value) or len(value) > 316:
        raise SpecError(node.at(key), f"must be a Kubernetes label key like example.com/name, got {value!r}")
    return value


def _pool(node: Node) -> PoolSelector:
    node.reject_unknown(("name", "nodes", "nodeRegex", "keepOnline"))
    name = node.string("name")
    nodes = node.strings("nodes")
    raw = node.value.get("nodeRegex")
    if (nodes is None) == (raw is None):
        raise SpecError(node.path, "exactly one of nodes, nodeRegex is required")
    pattern = None
    if raw is not None:
        text = node.string("nodeRegex")
        if len(text) > 1000:
            raise SpecError(node.at("nodeRegex"), "must be at most 1000 characters")
        try:
            pattern = re.compile(text)
        except re.error as e:
            raise SpecError(node.at("nodeRegex"), f"is not a regular expression: {e}") from None
    if nodes is not None and len(nodes) > _MAX_NODES:
        raise SpecError(node.at("nodes"), f"at most {_MAX_NODES} nodes, got {len(nodes)}")
    keep = node.integer("keepOnline", 0, minimum=0)
    return PoolSelector(name, tuple(dict.fromkeys(nodes or ())), pattern, keep)


def parse_colocation(doc: dict[str, Any]) -> ColocationSpec:
    root = Node(doc, "")
    version = root.string("apiVersion", "metricsd.io/v1alpha1")
    if version != "metricsd.io/v1alpha1":
        raise SpecError("apiVersion", f"must be metricsd.io/v1alpha1, got {version!r}")
    meta = root.child("metadata")
    spec = root.need("spec")
    spec.reject_unknown(("pools", "margin", "drainMinutes", "drain", "noticeMinutes", "returnGraceMinutes",
                         "minLendMinutes", "minOnlineMinutes", "replicaCurves", "surge", "surgeNoticeSeconds",
                         "nodeMarks", "utcOffset", "intervalSeconds"))
    pool_nodes = spec.items("pools")
    if not pool_nodes:
        raise SpecError(spec.at("pools"), "at least one pool is required")
    if len(pool_nodes) > _MAX_POOLS:
        raise SpecError(spec.at("pools"), f"at most {_MAX_POOLS} pools, got {len(pool_nodes)}")
    pools = tuple(_pool(p) for p in pool_nodes)
    names = [p.name for p in pools]
    for i, p in enumerate(pools):
        if p.name in names[:i]:
            raise SpecError(f"{spec.at('pools')}[{i}].name", f"pool {p.name!r} is named twice")
        for node_name in p.nodes:
            other = next((q.name for q in pools[:i] if node_name in q.nodes), None)
            if other is not None:
                raise SpecError(f"{spec.at('pools')}[{i}].nodes", f"node {node_name!r} is already in pool {other!r}")
    interval = spec.number("intervalSeconds", 60.0, minimum=1.0, maximum=3600.0)
    timing = Timing(
        drain_ms=_minutes(spec, "drainMinutes", 10, minimum=1 / 60),
        notice_ms=_minutes(spec, "noticeMinutes", 15),
        return_grace_ms=_minutes(spec, "returnGraceMinutes", 5, minimum=1 / 60),
        min_lend_ms=_minutes(spec, "minLendMinutes", 120),
        min_online_ms=_minutes(spec, "minOnlineMinutes", 30),
        interval_ms=int(interval * 1000),
    )
    settings = PlanSettings(
        margin=spec.number("margin", 0.2, minimum=0.0, maximum=10.0),
        timing=timing,
        surge_notice_ms=int(spec.number("surgeNoticeSeconds", 60.0, minimum=0.0, maximum=86_400.0) * 1000),
        utc_offset_minutes=_offset(spec),
    )
    curves = []
    for key in ("replicaCurves", "surge"):
        if len(spec.items(key)) > _MAX_RULES:
            raise SpecError(spec.at(key), f"at most {_MAX_RULES} entries, got {len(spec.items(key))}")
    for c in spec.items("replicaCurves"):
        c.reject_unknown(("hpa", "pool", "coresPerReplica", "share"))
        ref = c.string("hpa")
        if ref.count("/") != 1 or not all(ref.split("/")):
            raise SpecError(c.at("hpa"), f"must be namespace/name, got {ref!r}")
        ns, hpa = ref.split("/")
        curves.append(CurveSpec(ns, hpa, pool=_known_pool(c, "pool", names),
                                cores_per_replica=c.number("coresPerReplica", minimum=0.0),
                                share=c.number("share", 1.0, minimum=0.0, maximum=1.0)))
    rules, services = [], {}
    for r in spec.items("surge"):
        r.reject_unknown(("name", "service", "threshold", "pool", "nodes", "order"))
        rule_name = r.string("name")
        if rule_name in services:
            raise SpecError(r.at("name"), f"surge rule {rule_name!r} is named twice")
        svc = r.need("service")
        svc.reject_unknown(("namespace", "workload"))
        ns, workload = svc.string("namespace"), svc.string("workload")
        services[rule_name] = (ns, workload)
        rules.append(SurgeRule(rule_name, f"{ns}/{workload}", _known_pool(r, "pool", names),
                               r.number("threshold", minimum=0.0), r.integer("nodes", minimum=1),
                               r.string("order", "newestLent", choices=SURGE_ORDERS)))  # type: ignore[arg-type]
    marks_node = spec.child("nodeMarks") or Node({}, spec.at("nodeMarks"))
    marks_node.reject_unknown(("stateLabel", "lentTaint", "returnTaint"))
    defaults = NodeMarks()
    marks = NodeMarks(_label_key(marks_node, "stateLabel", defaults.state_label),
                      _label_key(marks_node, "lentTaint", defaults.lent_taint),
                      _label_key(marks_node, "returnTaint", defaults.return_taint))
    if marks.lent_taint == marks.return_taint:
        raise SpecError(marks_node.at("returnTaint"), "must differ from lentTaint")
    return ColocationSpec(
        name=meta.string("name", "colocation") if meta is not None else "colocation",
        pools=pools, settings=settings,
        evict=spec.string("drain", "wait", choices=("wait", "evict")) == "evict",
        curves=tuple(curves), surge=tuple(rules), surge_services=services, marks=marks, interval_s=interval,
    )


def _known_pool(node: Node, key: str, pools: list[str]) -> str:
    name = node.string(key)
    if name not in pools:
        raise SpecError(node.at(key), f"names no pool of this plan (have: {', '.join(pools)})")
    return name
