"""The Kubernetes side of the colocation plan: a node's state as a label and two NoSchedule taints,
and what happens to the pods on it.

    Online            label <state>=Online            no colocation taint
    OnlineToOffline   label <state>=OnlineToOffline    <lent>:NoSchedule  (new online pods stay off)
    Offline           label <state>=Offline            <lent>:NoSchedule  (offline pods tolerate it)
    OfflineToOnline   label <state>=OfflineToOnline    <lent> + <returning>:NoSchedule (no new offline pods)

Offline pods are the ones that tolerate the lent taint. When a node starts draining, its online
pods get the pod-deletion-cost annotation, so that a scale-down of their workload removes them
before pods on dedicated nodes (the practice of mixed clusters); with `drain: evict` they are
evicted through the Eviction API, which honours PodDisruptionBudgets. A drain that ends back
online takes the annotation off again. When the notice of a return runs out, the offline pods
still there are evicted.

The taints are written with the node's resourceVersion, so a concurrent change to the node's
taints makes the patch fail (HTTP 409) instead of being overwritten; the controller retries.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import quote

from metricsd.consumers.actuators.base import NodeChange

__all__ = ["Call", "apply_node_change", "node_patch", "tolerates"]

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
MERGE_PATCH = "application/merge-patch+json"

Call = Callable[..., Awaitable[dict[str, Any]]]


def node_patch(node: Mapping[str, Any], change: NodeChange) -> dict[str, Any]:
    """The merge patch that marks `node` (the API object as read) for change.dst; other taints stay."""
    ours = {change.lent_taint, change.return_taint}
    taints = [t for t in node.get("spec", {}).get("taints") or [] if t.get("key") not in ours]
    if change.dst != "Online":
        taints.append({"key": change.lent_taint, "effect": "NoSchedule"})
    if change.dst == "OfflineToOnline":
        taints.append({"key": change.return_taint, "effect": "NoSchedule"})
    meta = node.get("metadata", {})
    patch: dict[str, Any] = {"metadata": {"labels": {change.state_label: change.dst}}, "spec": {"taints": taints}}
    if meta.get("resourceVersion"):
        patch["metadata"]["resourceVersion"] = meta["resourceVersion"]
    return patch


def tolerates(pod: Mapping[str, Any], taint_key: str) -> bool:
    """Whether the pod tolerates a NoSchedule taint with this key (an offline pod does)."""
    for tol in pod.get("spec", {}).get("tolerations") or []:
        effect = tol.get("effect")
        if effect not in (None, "", "NoSchedule"):
            continue
        if tol.get("key") == taint_key or (not tol.get("key") and tol.get("operator") == "Exists"):
            return True
    return False


def _daemon(pod: Mapping[str, Any]) -> bool:
    return any(o.get("kind") == "DaemonSet" for o in pod.get("metadata", {}).get("ownerReferences") or [])


async def apply_node_change(call: Call, change: NodeChange, deletion_cost: int) -> list[str]:
    """Patch the node, then annotate or evict its pods as the move asks; returns the pods acted on."""
    path = f"/api/v1/nodes/{quote(change.node)}"
    node = await call("GET", path)
    await call("PATCH", path, node_patch(node, change), MERGE_PATCH)
    draining = change.dst == "OnlineToOffline"
    cancelled = change.src == "OnlineToOffline" and change.dst == "Online"
    if not (draining or cancelled or change.evict_offline):
        return []
    listing = await call("GET", "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={change.node}"})
    acted: list[str] = []
    for pod in sorted(listing.get("items", []), key=lambda p: (p["metadata"].get("namespace", ""),
                                                                p["metadata"]["name"])):
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") or _daemon(pod):
            continue
        ns, name = meta.get("namespace", "default"), meta["name"]
        pod_path = f"/api/v1/namespaces/{quote(ns)}/pods/{quote(name)}"
        offline = tolerates(pod, change.lent_taint)
        if draining and not offline:
            await call("PATCH", pod_path, {"metadata": {"annotations": {DELETION_COST: str(deletion_cost)}}},
                       MERGE_PATCH)
            if change.evict_online:
                await _evict(call, ns, name)
            acted.append(f"{ns}/{name}")
        elif cancelled and not offline and (meta.get("annotations") or {}).get(DELETION_COST) == str(deletion_cost):
            await call("PATCH", pod_path, {"metadata": {"annotations": {DELETION_COST: None}}}, MERGE_PATCH)
            acted.append(f"{ns}/{name}")
        elif change.evict_offline and offline:
            await _evict(call, ns, name)
            acted.append(f"{ns}/{name}")
    return acted


async def _evict(call: Call, ns: str, name: str) -> None:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns}}
    await call("POST", f"/api/v1/namespaces/{quote(ns)}/pods/{quote(name)}/eviction", body, "application/json")
