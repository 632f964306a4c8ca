"""The colocation moves through the Kubernetes and webhook backends, against real HTTP(S) servers on
127.0.0.1 that record each request (the fixtures of test_consumers_backends)."""

from __future__ import annotations

from typing import Any

import pytest
import test_consumers_backends as kb
from test_consumers_backends import Recorder, serve

from metricsd.consumers.actuators import ActuatorError, WebhookActuator, WebhookSettings
from metricsd.consumers.actuators.base import NodeChange
from metricsd.consumers.actuators.kubernetes import DELETION_COST

# The recording API server over HTTPS, and its certificate, as fixtures here too.
apiserver, tls = kb.apiserver, kb.tls
LENT, RETURNING, STATE = "example.com/lent", "example.com/returning", "example.com/state"
GPU = {"key": "gpu", "effect": "NoSchedule"}


def change(src: str, dst: str, reason: str = "Lend", **kw: Any) -> NodeChange:
    return NodeChange("colo-1", "shared", src, dst, reason, None, STATE, LENT, RETURNING, **kw)


def node(*taints: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "colo-1", "resourceVersion": "42"}, "spec": {"taints": list(taints)}}


PODS = {"items": [
    {"metadata": {"name": "web-a", "namespace": "shop"}, "spec": {}},
    {"metadata": {"name": "job-a", "namespace": "batch"},
     "spec": {"tolerations": [{"key": LENT, "operator": "Exists", "effect": "NoSchedule"}]}},
    {"metadata": {"name": "agent-x", "namespace": "kube-system", "ownerReferences": [{"kind": "DaemonSet"}]},
     "spec": {}},
    {"metadata": {"name": "web-old", "namespace": "shop", "deletionTimestamp": "2024-01-01T00:00:00Z"}, "spec": {}},
]}


async def test_a_lend_taints_the_node_marks_its_online_pods_and_evicts_them(apiserver: tuple[Recorder, Any]) -> None:
    rec, kube = apiserver
    rec.replies = [(200, node(GPU)), (200, {}), (200, PODS)]
    await kube.set_node(change("Online", "OnlineToOffline", evict_online=True))
    get, patch, pods, mark, evict = rec.requests
    assert (get["method"], get["path"]) == ("GET", "/api/v1/nodes/colo-1")
    assert (patch["method"], patch["content_type"]) == ("PATCH", "application/merge-patch+json")
    assert patch["body"] == {"metadata": {"labels": {STATE: "OnlineToOffline"}, "resourceVersion": "42"},
                             "spec": {"taints": [GPU, {"key": LENT, "effect": "NoSchedule"}]}}
    assert (pods["path"], pods["query"]) == ("/api/v1/pods", {"fieldSelector": "spec.nodeName=colo-1"})
    assert (mark["path"], mark["body"]) == ("/api/v1/namespaces/shop/pods/web-a",
                                            {"metadata": {"annotations": {DELETION_COST: "-500"}}})
    assert (evict["method"], evict["path"]) == ("POST", "/api/v1/namespaces/shop/pods/web-a/eviction")
    assert evict["body"]["kind"] == "Eviction" and evict["body"]["metadata"] == {"name": "web-a", "namespace": "shop"}


async def test_a_wait_drain_only_marks_and_a_return_adds_the_returning_taint(apiserver: tuple[Recorder, Any]) -> None:
    rec, kube = apiserver
    rec.replies = [(200, node()), (200, {}), (200, PODS)]
    await kube.set_node(change("Online", "OnlineToOffline"))
    assert [r["method"] for r in rec.requests] == ["GET", "PATCH", "GET", "PATCH"]  # no eviction
    rec.requests.clear()
    rec.replies = [(200, node(GPU, {"key": LENT, "effect": "NoSchedule"})), (200, {})]
    await kube.set_node(change("Offline", "OfflineToOnline", "Forecast"))
    _, patch = rec.requests  # no pod is touched: offline schedulers were told, their pods leave
    assert patch["body"]["spec"]["taints"] == [GPU, {"key": LENT, "effect": "NoSchedule"},
                                               {"key": RETURNING, "effect": "NoSchedule"}]
    assert patch["body"]["metadata"]["labels"] == {STATE: "OfflineToOnline"}


async def test_a_return_timeout_clears_the_taints_and_evicts_the_offline_pods(apiserver: tuple[Recorder, Any]) -> None:
    rec, kube = apiserver
    both = node(GPU, {"key": LENT, "effect": "NoSchedule"}, {"key": RETURNING, "effect": "NoSchedule"})
    rec.replies = [(200, both), (200, {}), (200, PODS)]
    await kube.set_node(change("OfflineToOnline", "Online", "ReturnTimeout", evict_offline=True))
    _, patch, _, evict = rec.requests
    assert patch["body"]["spec"]["taints"] == [GPU] and patch["body"]["metadata"]["labels"] == {STATE: "Online"}
    assert evict["path"] == "/api/v1/namespaces/batch/pods/job-a/eviction"


async def test_a_cancelled_drain_takes_the_deletion_cost_off_again(apiserver: tuple[Recorder, Any]) -> None:
    rec, kube = apiserver
    marked = {"items": [{"metadata": {"name": "web-a", "namespace": "shop", "annotations": {DELETION_COST: "-500"}},
                         "spec": {}},
                        {"metadata": {"name": "web-b", "namespace": "shop", "annotations": {DELETION_COST: "7"}},
                         "spec": {}}]}
    rec.replies = [(200, node({"key": LENT, "effect": "NoSchedule"})), (200, {}), (200, marked)]
    await kube.set_node(change("OnlineToOffline", "Online", "Surge"))
    _, patch, _, unmark = rec.requests  # web-b's cost was set by someone else: left alone
    assert patch["body"]["spec"]["taints"] == []
    assert (unmark["path"], unmark["body"]) == ("/api/v1/namespaces/shop/pods/web-a",
                                                {"metadata": {"annotations": {DELETION_COST: None}}})


async def test_a_concurrent_change_to_the_node_fails_the_move(apiserver: tuple[Recorder, Any]) -> None:
    rec, kube = apiserver
    rec.replies = [(200, node()), (409, {"kind": "Status", "message": "the object has been modified"})]
    with pytest.raises(ActuatorError, match="PATCH /api/v1/nodes/colo-1: HTTP 409: the object has been modified"):
        await kube.set_node(change("Online", "OnlineToOffline"))


async def test_the_webhook_posts_the_move(port: int) -> None:
    rec = Recorder()
    runner = await serve(rec.handle, port)
    hook = WebhookActuator(WebhookSettings(f"http://127.0.0.1:{port}/hook"))
    try:
        await hook.set_node(NodeChange("colo-1", "shared", "Offline", "OfflineToOnline", "Surge", 1_000, STATE, LENT,
                                       RETURNING, decision={"message": "m"}))
    finally:
        await hook.close()
        await runner.cleanup()
    (req,) = rec.requests
    assert req["body"] == {"kind": "colocation.node", "decision": {"message": "m"}, "action": {
        "node": "colo-1", "pool": "shared", "from": "Offline", "to": "OfflineToOnline", "reason": "Surge",
        "deadlineMs": 1_000, "evictOnline": False, "evictOffline": False}}
