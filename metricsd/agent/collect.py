"""One collection pass: the cgroup tree and the pod list in, samples for one timestamp out.

The collector joins what the kernel knows (pod UIDs, container ids, counters) with what the
kubelet knows (names, workloads, requests) and remembers which series it emitted, so a pod or
container that disappears ends each of its series with exactly one stale marker, as Prometheus
does for a target that stops exposing a series.

Contract: ``collect`` never raises on what it reads. Unusable files, unknown pods and sandbox
cgroups are counted in ``Collector.skipped`` (a Counter by reason) and logged at most once per
reason per ``log_interval_ms`` of the timestamps passed in. Not safe to call concurrently.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from metricsd.agent.cgroup import (
    ContainerStats,
    FileProblem,
    TreeWalk,
    find_cgroup2_root,
    read_container_stats,
    walk_kubepods,
)
from metricsd.agent.node import NodeInfo, read_local_node_info, read_node_usage
from metricsd.agent.pods import PodIndex, PodInfo
from metricsd.model import Labels, make_labels, stale_marker

__all__ = ["CollectStatus", "Collection", "Collector", "CollectorSettings", "Sample", "node_pod_name"]

Sample = tuple[Labels, float]

# Skip reasons that are not file faults.
SKIP_UNKNOWN_POD = "unknown_pod"  # a pod cgroup whose UID is not in the pod list
SKIP_NO_POD_LIST = "no_pod_list"  # a pod cgroup seen while no pod list was ever available
SKIP_SANDBOX = "sandbox_or_unknown_container"  # the pause container, or a container not in status
SKIP_CONMON = "conmon"  # CRI-O's per-container monitor cgroup

_USAGE_METRICS = (
    # (metric, ContainerStats attribute, scale to base unit)
    ("container_cpu_usage_seconds_total", "cpu_usage_usec", 1e-6),
    ("container_cpu_cfs_throttled_periods_total", "cpu_nr_throttled", 1.0),
    ("container_cpu_cfs_throttled_seconds_total", "cpu_throttled_usec", 1e-6),
    ("container_memory_usage_bytes", "memory_current", 1.0),
    ("container_memory_working_set_bytes", "working_set", 1.0),
    ("container_memory_rss", "memory_anon", 1.0),
    ("container_oom_events_total", "oom_kill", 1.0),
)
_UNITS = {"cpu": "core", "memory": "byte"}

# What a series belongs to; when the owner goes, its series get their stale markers. The pod's
# names are part of the key, so a pod whose metadata changes ends its old series too.
OwnerKey = tuple[str, ...]


def node_pod_name(node: str) -> str:
    """Node series carry pod="node-<name>" in namespace kube-system: the store requires a pod."""
    return f"node-{node}"


@dataclass(frozen=True, slots=True)
class CollectorSettings:
    node_name: str
    cgroup_base: Path = Path("/sys/fs/cgroup")
    proc_root: Path = Path("/proc")
    cluster: str = ""  # added as label "cluster" when set
    log_interval_ms: int = 60_000  # per skip reason, at most one log line this often


@dataclass(slots=True)
class CollectStatus:
    """What one pass could and could not see; ``state`` is one word for dashboards and tests:
    no_cgroup2, no_kubepods, no_pod_list, partial or ok."""

    timestamp_ms: int
    state: str = "ok"
    message: str = ""
    cgroup_root: str | None = None
    kubepods: str | None = None
    pod_list_available: bool = False
    pod_list_stale: bool = False  # this pass reused the last pod list it was given
    pods_in_tree: int = 0
    pods_mapped: int = 0
    containers_in_tree: int = 0
    containers_mapped: int = 0
    sandboxes_skipped: int = 0
    file_problems: int = 0
    series: int = 0
    stale_markers: int = 0

    @property
    def pods_unmapped(self) -> int:
        return self.pods_in_tree - self.pods_mapped


@dataclass(slots=True)
class Collection:
    timestamp_ms: int
    samples: list[Sample]
    status: CollectStatus


@dataclass(slots=True)
class _RateLimitedLog:
    """At most one line per reason per interval, saying how many were held back meanwhile."""

    logger: logging.Logger
    interval_ms: int
    last_ms: dict[str, int] = field(default_factory=dict)
    held: Counter[str] = field(default_factory=Counter)

    def warn(self, now_ms: int, reason: str, text: str) -> None:
        last = self.last_ms.get(reason)
        if last is not None and last <= now_ms < last + self.interval_ms:
            self.held[reason] += 1
            return
        more = self.held.pop(reason, 0)
        suffix = f" ({more} more since the last report)" if more else ""
        self.logger.warning("%s: %s%s", reason, text, suffix)
        self.last_ms[reason] = now_ms


class Collector:
    """Collects a node's pod, container and node series, one pass per ``collect`` call.

    ``skipped`` counts, since construction, everything a pass had to leave out, by reason:
    ``<file>:<kind>`` for cgroup and /proc files (e.g. ``memory.stat:garbage``) and the SKIP_*
    reasons. ``status`` describes the last pass.
    """

    def __init__(
        self,
        settings: CollectorSettings,
        node: NodeInfo | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.settings = settings
        self.skipped: Counter[str] = Counter()
        self.status: CollectStatus | None = None
        self._node = node
        self._logger = logger or logging.getLogger("metricsd.agent.collect")
        self._log = _RateLimitedLog(self._logger, settings.log_interval_ms)
        self._emitted: dict[OwnerKey, set[Labels]] = {}
        # Labels are built once per series and reused every pass (sorting them is the costly part).
        self._label_cache: dict[OwnerKey, dict[tuple[str, ...], Labels]] = {}
        self._last_pods: PodIndex | None = None
        self._last_state = ""
        self._cgroup_root: Path | None = None
        self._cgroup_root_known = False
        self._kubepods: str | None = None

    # --- the pass ------------------------------------------------------------------------------

    def collect(self, timestamp_ms: int, pods: PodIndex | None = None) -> Collection:
        """One pass at ``timestamp_ms``. ``pods=None`` means the pod list is unavailable right now:
        the last one given is reused, so a kubelet hiccup does not end every series."""
        status = CollectStatus(timestamp_ms=timestamp_ms)
        if pods is not None:
            self._last_pods = pods
        elif self._last_pods is not None:
            pods, status.pod_list_stale = self._last_pods, True
        status.pod_list_available = pods is not None

        problems: list[FileProblem] = []
        series: dict[OwnerKey, list[Sample]] = {}
        root = self._root()
        status.cgroup_root = str(root) if root is not None else None
        self._collect_node(root, problems, series)
        if root is not None:
            walk = walk_kubepods(root, self._kubepods)
            self._kubepods = walk.kubepods
            status.kubepods = str(walk.kubepods) if walk.kubepods is not None else None
            self._collect_pods(walk, pods, status, problems, series, timestamp_ms)

        samples: list[Sample] = []
        for owner, owned in series.items():
            samples.extend(owned)
            self._emitted.setdefault(owner, set()).update(labels for labels, _ in owned)
        status.series = len(samples)
        gone = [o for o in self._emitted if o not in series]
        # A StatefulSet pod replaced by a new one of the same name (a new UID) continues its series:
        # only labels that nothing emitted this pass are ended.
        live = {labels for labels, _ in samples} if gone else set()
        for owner in gone:
            self._label_cache.pop(owner, None)
            for labels in sorted(self._emitted.pop(owner) - live):
                samples.append((labels, stale_marker()))
                status.stale_markers += 1

        status.file_problems = len(problems)
        for p in problems:
            self.skipped[p.reason] += 1
            self._log.warn(timestamp_ms, p.reason, f"skipped {p.path}{': ' + p.detail if p.detail else ''}")
        self._describe(status)
        self.status = status
        return Collection(timestamp_ms, samples, status)

    def _root(self) -> Path | None:
        # Looked up once: which hierarchy is mounted does not change while we run.
        if not self._cgroup_root_known:
            self._cgroup_root = find_cgroup2_root(self.settings.cgroup_base)
            self._cgroup_root_known = True
        return self._cgroup_root

    def _labels(self, name: str, **labels: str) -> Labels:
        if self.settings.cluster:
            labels["cluster"] = self.settings.cluster
        return make_labels(name, {k: v for k, v in labels.items() if v})

    def _owned_labels(self, owner: OwnerKey, name: str, base: dict[str, str], **extra: str) -> Labels:
        cache = self._label_cache.setdefault(owner, {})
        key = (name, *extra.values())
        labels = cache.get(key)
        if labels is None:
            labels = cache[key] = self._labels(name, **base, **extra)
        return labels

    def _collect_node(
        self, root: Path | None, problems: list[FileProblem], series: dict[OwnerKey, list[Sample]]
    ) -> None:
        node_name = self.settings.node_name
        if self._node is None:
            self._node = read_local_node_info(node_name, self.settings.proc_root, problems=problems)
        node = self._node
        base = {"namespace": "kube-system", "pod": node_pod_name(node.name), "node": node.name}
        owner = ("node", node.name)
        out: list[Sample] = []
        for metric, cpu, mem in (
            ("kube_node_status_capacity", node.cpu_cores, node.memory_bytes),
            ("kube_node_status_allocatable", node.allocatable_cpu, node.allocatable_memory),
        ):
            if cpu > 0:
                out.append((self._owned_labels(owner, metric, base, resource="cpu", unit="core"), float(cpu)))
            if mem > 0:
                out.append((self._owned_labels(owner, metric, base, resource="memory", unit="byte"), float(mem)))
        usage = read_node_usage(root, self.settings.proc_root, problems)
        if usage.cpu_seconds is not None:
            out.append((self._owned_labels(owner, "node_cpu_usage_seconds_total", base), usage.cpu_seconds))
        if usage.memory_working_set_bytes is not None:
            labels = self._owned_labels(owner, "node_memory_working_set_bytes", base)
            out.append((labels, usage.memory_working_set_bytes))
        series[owner] = out

    def _collect_pods(
        self,
        walk: TreeWalk,
        pods: PodIndex | None,
        status: CollectStatus,
        problems: list[FileProblem],
        series: dict[OwnerKey, list[Sample]],
        now_ms: int,
    ) -> None:
        if walk.conmon_skipped:
            self.skipped[SKIP_CONMON] += walk.conmon_skipped
        status.pods_in_tree = len(walk.pods)
        for pod_cg in walk.pods:
            status.containers_in_tree += len(pod_cg.containers)
            info = pods.get(pod_cg.uid) if pods is not None else None
            if info is None:
                reason = SKIP_UNKNOWN_POD if pods is not None else SKIP_NO_POD_LIST
                self.skipped[reason] += 1
                if pods is not None:
                    self._log.warn(now_ms, reason, f"pod cgroup {pod_cg.path} has a UID not in the pod list")
                continue
            status.pods_mapped += 1
            node = self.settings.node_name or info.node
            pod_base = {"namespace": info.namespace, "pod": info.name, "node": node, "workload": info.workload}
            pod_owner = ("pod", info.uid, info.namespace, info.name, info.workload)
            series[pod_owner] = self._pod_resources(pod_owner, info, pod_base)
            for cg in pod_cg.containers:
                name = info.container_ids.get(cg.container_id)
                if name is None:
                    status.sandboxes_skipped += 1
                    self.skipped[SKIP_SANDBOX] += 1
                    continue
                status.containers_mapped += 1
                stats = read_container_stats(cg.path, problems)
                owner = ("container", info.uid, info.namespace, info.name, info.workload, name)
                series[owner] = self._container_usage(owner, stats, pod_base, name)

    def _pod_resources(self, owner: OwnerKey, info: PodInfo, base: dict[str, str]) -> list[Sample]:
        out: list[Sample] = []
        for c in info.containers:
            for metric, values in (
                ("kube_pod_container_resource_requests", c.requests),
                ("kube_pod_container_resource_limits", c.limits),
            ):
                for resource, value in sorted(values.items()):
                    unit = _UNITS.get(resource, "")
                    labels = self._owned_labels(
                        owner, metric, base, container=c.name, resource=resource, unit=unit
                    )
                    out.append((labels, value))
        return out

    def _container_usage(
        self, owner: OwnerKey, stats: ContainerStats, base: dict[str, str], container: str
    ) -> list[Sample]:
        out: list[Sample] = []
        for metric, attr, scale in _USAGE_METRICS:
            raw = getattr(stats, attr)
            if raw is not None:
                out.append((self._owned_labels(owner, metric, base, container=container), raw * scale))
        return out

    def _describe(self, status: CollectStatus) -> None:
        """Say in one line what this pass could not do; log it when the situation changes."""
        base = self.settings.cgroup_base
        if status.cgroup_root is None:
            status.state = "no_cgroup2"
            status.message = (
                f"no cgroup v2 hierarchy at {base} or {base}/unified: no pods mapped; "
                "reporting node series from /proc only"
            )
        elif status.kubepods is None:
            status.state = "no_kubepods"
            status.message = (
                f"no kubelet cgroups (kubepods) under {status.cgroup_root}: no pods mapped; "
                "reporting node series only"
            )
        elif not status.pod_list_available and status.pods_in_tree:
            status.state = "no_pod_list"
            status.message = (
                f"{status.pods_in_tree} pod cgroups under {status.kubepods} but no pod list: "
                "no pods mapped; reporting node series only"
            )
        else:
            status.state = "partial" if status.pods_unmapped else "ok"
            status.message = (
                f"mapped {status.pods_mapped} of {status.pods_in_tree} pod cgroups and "
                f"{status.containers_mapped} containers ({status.sandboxes_skipped} sandbox or unknown "
                f"container cgroups skipped)"
            )
            if status.pod_list_stale:
                status.message += "; pod list unavailable, reusing the last one"
        if status.state != self._last_state:
            level = logging.INFO if status.state == "ok" else logging.WARNING
            self._logger.log(level, "collector: %s", status.message)
            self._last_state = status.state
