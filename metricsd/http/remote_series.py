"""What a remote-write series becomes before it is stored: the operator's relabel rules, then the
fallbacks that give a series without ``namespace`` / ``pod`` a node- or cluster-level key, then
the check that both are there.

metricsd keys every series by ``namespace/pod``; a Prometheus scraping itself or a node exporter
sends series with neither (``up{instance="localhost:9090",job="prometheus"}``). Unless the rules
set them, such a series gets ``namespace`` = HttpSettings.default_namespace (``_cluster`` by
default: Kubernetes namespace names cannot start with ``_``, so it never mixes with a real
namespace) and ``pod`` = the value of the first of HttpSettings.pod_labels it carries
(``instance``, then ``job``). A series still lacking either is refused, naming the series and the
rule that left it so. Pure: labels in, a verdict out.
"""

from __future__ import annotations

from dataclasses import dataclass

from metricsd.http.relabel import RelabelError, Rule, relabel
from metricsd.http.settings import HttpSettings
from metricsd.model import Labels, describe

__all__ = ["Verdict", "resolve"]


@dataclass(frozen=True)
class Verdict:
    """Exactly one of: ``labels`` to store; ``dropped_by`` a rule (not an error: the operator
    asked for it); ``refusal`` a message naming the series and the rule, with ``rule`` the rule's
    index ("fallback" when no relabel rule is to blame) for /metrics."""

    labels: Labels | None = None
    dropped_by: Rule | None = None
    refusal: str | None = None
    rule: str = ""


def resolve(raw: Labels, settings: HttpSettings) -> Verdict:
    labels = raw
    rules = settings.relabel_rules
    if rules:
        try:
            out = relabel(raw, rules)
        except RelabelError as e:
            return Verdict(refusal=f"series {describe(raw)}: {e}", rule=str(e.rule.index))
        if out.labels is None:
            return Verdict(dropped_by=out.dropped_by)
        labels = out.labels
    d = dict(labels)
    if "namespace" not in d and settings.default_namespace:
        d["namespace"] = settings.default_namespace
    if "pod" not in d:
        for name in settings.pod_labels:
            if d.get(name):
                d["pod"] = d[name]
                break
    if "namespace" in d and "pod" in d:
        return Verdict(labels=tuple(sorted(d.items())))
    after = f" after relabel rules 1-{len(rules)} (now {describe(labels)})" if rules else ""
    ns = repr(settings.default_namespace) if settings.default_namespace else "none"
    pods = ", ".join(settings.pod_labels) or "none"
    return Verdict(refusal=f"series {describe(raw)}{after} lacks the namespace/pod labels metricsd requires and no "
                           f"fallback applies (default namespace: {ns}; pod from labels: {pods})",
                   rule="fallback")

