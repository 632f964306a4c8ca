"""The consumers' ClusterRole (deploy/kubernetes/consumers.yaml) is derived from what the Kubernetes
backend really calls: every operation of the actuator is run against the recording HTTPS API server
of test_consumers_backends, each request is turned into the RBAC verb and resource the API server
would check, and the role must grant exactly those (nothing missing, nothing unused)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import test_consumers_backends as kb
import yaml
from test_consumers_backends import Recorder

from metricsd.consumers.actuators import ResourceUpdate, ScaleRequest, WorkloadRef
from metricsd.consumers.actuators.base import NodeChange

apiserver, tls = kb.apiserver, kb.tls
MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "consumers.yaml"
Permission = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)


def permission(method: str, path: str) -> Permission:
    """What the API server's authorizer checks for one request (its request-info rules)."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        group, rest = parts[1], parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource, name, sub = rest[0], rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
    verb = {"GET": "get" if name else "list", "PATCH": "patch", "POST": "create", "PUT": "update",
            "DELETE": "delete"}[method]
    return group, f"{resource}/{sub}" if sub else resource, verb


@pytest.mark.parametrize(("method", "path", "want"), [
    ("GET", "/apis/apps/v1/namespaces/a/deployments/w/scale", ("apps", "deployments/scale", "get")),
    ("GET", "/api/v1/nodes", ("", "nodes", "list")),
    ("GET", "/api/v1/nodes/n1", ("", "nodes", "get")),
    ("GET", "/api/v1/namespaces/a/pods", ("", "pods", "list")),
    ("POST", "/api/v1/namespaces/a/pods/p/eviction", ("", "pods/eviction", "create")),
])
def test_a_request_maps_to_the_permission_the_authorizer_checks(method: str, path: str, want: Permission) -> None:
    assert permission(method, path) == want


def granted() -> set[Permission]:
    role = next(d for d in yaml.safe_load_all(MANIFEST.read_text())
                if d and d["kind"] == "ClusterRole" and d["metadata"]["name"] == "metricsd-consumers")
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


async def test_the_consumers_role_grants_exactly_what_the_kubernetes_backend_calls(
        apiserver: tuple[Recorder, Any]) -> None:
    rec, kube = apiserver
    node = {"metadata": {"name": "colo-1", "resourceVersion": "1"}, "spec": {}}
    pods = {"items": [{"metadata": {"name": "web-a", "namespace": "shop"}, "spec": {"nodeName": "colo-1"}}]}
    for kind in ("Deployment", "StatefulSet"):  # the workload kinds an HPA or VPA spec targets
        ref = WorkloadRef("shop", kind, "web")
        rec.replies = [(200, {"spec": {"replicas": 3}}), (200, {"items": [{"metadata": {"name": "colo-1"}}]}),
                       (200, {"spec": {"selector": {"matchLabels": {"app": "web"}}}}), (200, pods)]
        await kube.get_scale(ref)
        await kube.scale(ScaleRequest(ref, 3, 2))  # a scale-down marks pods on the colocation pool first
        await kube.update_resources(ResourceUpdate(ref, "Auto", {"app": {"requests": {"cpu": 0.5}}}))
    for src, dst, kw in (("Online", "OnlineToOffline", {"evict_online": True}),
                         ("OfflineToOnline", "Online", {"evict_offline": True})):
        rec.replies = [(200, node), (200, {}), (200, pods)]
        await kube.set_node(NodeChange("colo-1", "shared", src, dst, "test", None, "s", "l", "r", **kw))
    used = {permission(r["method"], r["path"]) for r in rec.requests}
    assert used == granted()
