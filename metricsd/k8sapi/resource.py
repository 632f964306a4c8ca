"""``metrics.k8s.io/v1beta1``: PodMetrics and NodeMetrics from pushed-down aggregates.

metrics-server reports, per container, the CPU usage rate over its window in nanocores and the
memory working set in bytes; per node, the same for the node's root cgroup. Here each is one
aggregate over the store: ``sum by (namespace, pod, container) (rate(cpu[window]))`` and the
newest working set per container; for nodes, the agent's node series
(``node_cpu_usage_seconds_total``, ``node_memory_working_set_bytes``) by ``node``, and for a node
without them (the simulator has none) the sum of its containers. A container is reported only
with both values and a pod only with a container, as metrics-server leaves out pods whose metrics
are incomplete (the HPA would drop them anyway).

The requests (``*_requests``) and the mapping of answers (``pod_items``, ``node_items``) are pure;
``ResourceMetrics`` only sends them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from metricsd.k8sapi.discovery import METRICS
from metricsd.k8sapi.quantity import binary_quantity, go_duration, nano_quantity, rfc3339
from metricsd.model import METRIC_NAME
from metricsd.proto import metricsd_pb2 as pb
from metricsd.rpc.backend import MetricsBackend
from metricsd.rpc.wire import matchers_to_pb
from metricsd.selector import Matcher, MatchOp

__all__ = ["Names", "ResourceMetrics", "container_request", "node_items", "node_request", "pod_items",
           "pod_metrics_list", "single"]


@dataclass(frozen=True)
class Names:
    """The series each value comes from (cAdvisor's and metricsd's agent's names)."""

    container_cpu: str = "container_cpu_usage_seconds_total"
    container_memory: str = "container_memory_working_set_bytes"
    node_cpu: str = "node_cpu_usage_seconds_total"
    node_memory: str = "node_memory_working_set_bytes"


Values = dict[tuple[str, ...], float]


def _request(metric: str, extra: Sequence[Matcher], fn: int, window_ms: int, by: Sequence[str],
             at_ms: int) -> pb.AggregateRequest:
    req = pb.AggregateRequest(across=pb.ACROSS_SUM, start_ms=at_ms, end_ms=at_ms, group_by=list(by))
    req.query.matchers.extend(matchers_to_pb([Matcher(MatchOp.EQ, METRIC_NAME, metric), *extra]))
    req.query.series_fn = fn  # type: ignore[assignment]
    req.query.window_ms = window_ms
    return req


_REAL_CONTAINER = [Matcher(MatchOp.NEQ, "container", ""), Matcher(MatchOp.NEQ, "container", "POD")]
POD_KEYS = ("namespace", "pod", "container")


def container_request(metric: str, cpu: bool, window_ms: int, at_ms: int, namespace: str | None = None,
                      pod: str | None = None, node: str | None = None, by: Sequence[str] = POD_KEYS,
                      selector: Sequence[Matcher] = ()) -> pb.AggregateRequest:
    """Per container (or per ``by``): the CPU rate over the window, or the newest memory value."""
    extra = list(_REAL_CONTAINER) + list(selector)
    for name, value in (("namespace", namespace), ("pod", pod), ("node", node)):
        if value is not None:
            extra.append(Matcher(MatchOp.EQ, name, value))
    return _request(metric, extra, pb.SERIES_RATE if cpu else pb.SERIES_LAST, window_ms, by, at_ms)


def node_request(metric: str, cpu: bool, window_ms: int, at_ms: int, node: str | None = None
                 ) -> pb.AggregateRequest:
    extra = [Matcher(MatchOp.NEQ, "node", "")] + ([Matcher(MatchOp.EQ, "node", node)] if node is not None else [])
    return _request(metric, extra, pb.SERIES_RATE if cpu else pb.SERIES_LAST, window_ms, ["node"], at_ms)


def values_of(req: pb.AggregateRequest, resp: pb.AggregateResponse) -> Values:
    """Group key (the values of ``group_by``, in its order) -> value, for groups with data."""
    by = list(req.group_by)
    n = len(resp.timestamps)
    out: Values = {}
    if n == 0 or not resp.groups:
        return out
    # the newest evaluation time of every group at once; Python work only for groups with a value
    last = np.array(resp.values, dtype=np.float64)[n - 1::n]
    ok = (np.array(resp.numerator.count, dtype=np.float64)[n - 1::n] > 0) & np.isfinite(last)
    groups = resp.groups
    # Group labels come sorted by name: with all of them present, take the values by position.
    names = sorted(set(by))
    where = [names.index(k) for k in by]
    for g, value in zip(np.flatnonzero(ok).tolist(), last[ok].tolist(), strict=True):
        labels = groups[g].labels
        if len(labels) == len(names):
            values = [lab.value for lab in labels]
            out[tuple(values[i] for i in where)] = value
        else:
            have = {lab.name: lab.value for lab in labels}
            out[tuple(have.get(k, "") for k in by)] = value
    return out


def _meta(name: str, at_ms: int, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["creationTimestamp"] = rfc3339(at_ms)
    return meta


def _usage(cpu_cores: float, memory_bytes: float) -> dict[str, str]:
    return {"cpu": nano_quantity(max(0.0, cpu_cores)), "memory": binary_quantity(max(0, int(memory_bytes)))}


def pod_items(cpu: Values, memory: Values, at_ms: int, window_ms: int) -> list[dict[str, Any]]:
    """PodMetrics objects, sorted by namespace then name; keys are (namespace, pod, container)."""
    pods: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for key in sorted(cpu.keys() & memory.keys()):
        ns, pod, container = key
        if ns and pod:
            pods.setdefault((ns, pod), []).append({"name": container, "usage": _usage(cpu[key], memory[key])})
    return [{"metadata": _meta(pod, at_ms, ns), "timestamp": rfc3339(at_ms), "window": go_duration(window_ms),
             "containers": containers} for (ns, pod), containers in pods.items()]


def node_items(cpu: Values, memory: Values, at_ms: int, window_ms: int) -> list[dict[str, Any]]:
    """NodeMetrics objects, sorted by name; keys are (node,)."""
    return [{"metadata": _meta(key[0], at_ms), "timestamp": rfc3339(at_ms), "window": go_duration(window_ms),
             "usage": _usage(cpu[key], memory[key])} for key in sorted(cpu.keys() & memory.keys()) if key[0]]


def pod_metrics_list(items: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return {"kind": f"{kind}List", "apiVersion": METRICS.group_version, "metadata": {}, "items": items}


def single(item: dict[str, Any], kind: str) -> dict[str, Any]:
    return {"kind": kind, "apiVersion": METRICS.group_version, **item}


class ResourceMetrics:
    """Sends the requests above to a backend (a store or a proxy) and maps the answers."""

    def __init__(self, backend: MetricsBackend, window_ms: int = 60_000, names: Names | None = None) -> None:
        self.backend = backend
        self.window_ms = window_ms
        self.names = names or Names()

    async def _values(self, req: pb.AggregateRequest) -> Values:
        return values_of(req, await self.backend.aggregate(req))

    async def pods(self, at_ms: int, namespace: str | None = None, pod: str | None = None,
                   selector: Sequence[Matcher] = ()) -> list[dict[str, Any]]:
        n, w = self.names, self.window_ms
        cpu = await self._values(container_request(n.container_cpu, True, w, at_ms, namespace, pod,
                                                   selector=selector))
        memory = await self._values(container_request(n.container_memory, False, w, at_ms, namespace, pod,
                                                      selector=selector))
        return pod_items(cpu, memory, at_ms, w)

    async def nodes(self, at_ms: int, node: str | None = None) -> list[dict[str, Any]]:
        n, w = self.names, self.window_ms
        cpu = await self._values(node_request(n.node_cpu, True, w, at_ms, node))
        memory = await self._values(node_request(n.node_memory, False, w, at_ms, node))
        # Nodes without node-level series: the sum of their containers.
        sum_cpu = await self._values(container_request(n.container_cpu, True, w, at_ms, node=node, by=("node",)))
        sum_memory = await self._values(container_request(n.container_memory, False, w, at_ms, node=node,
                                                          by=("node",)))
        for own, summed in ((cpu, sum_cpu), (memory, sum_memory)):
            for key, value in summed.items():
                own.setdefault(key, value)
        return node_items(cpu, memory, at_ms, w)
