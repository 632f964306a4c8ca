"""The webhook and Kubernetes backends against real aiohttp servers on 127.0.0.1.

The Kubernetes fixture stands in for the API server's HTTP surface over HTTPS (a self-signed
certificate made with the openssl command): it records each request, and the tests assert the
exact method, path, query, content type, bearer token and body the backend sent.
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from metricsd.consumers.actuators import (
    ActuatorError,
    KubernetesActuator,
    KubernetesSettings,
    ResourceUpdate,
    ScaleRequest,
    WebhookActuator,
    WebhookSettings,
    WorkloadRef,
)
from metricsd.consumers.actuators.kubernetes import DELETION_COST

REF = WorkloadRef("shop", "Deployment", "web")


@dataclass
class Recorder:
    requests: list[dict[str, Any]] = field(default_factory=list)
    replies: list[tuple[int, Any]] = field(default_factory=list)  # popped per request; empty: 200 {}

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests.append({
            "method": request.method, "path": request.path, "query": dict(request.query),
            "content_type": request.headers.get("Content-Type"), "auth": request.headers.get("Authorization"),
            "body": json.loads(body) if body else None,
        })
        status, doc = self.replies.pop(0) if self.replies else (200, {})
        return web.json_response(doc, status=status)


async def serve(handler: Callable[..., Any], port: int, ssl_context: ssl.SSLContext | None = None
                ) -> web.AppRunner:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl_context).start()
    return runner


# --- webhook ---------------------------------------------------------------------------------


async def no_sleep(_: float) -> None:
    return None


async def test_a_decision_is_posted_as_json(port: int) -> None:
    rec = Recorder()
    runner = await serve(rec.handle, port)
    hook = WebhookActuator(WebhookSettings(f"http://127.0.0.1:{port}/hook"), sleep=no_sleep)
    try:
        await hook.scale(ScaleRequest(REF, 4, 8, {"rule": "DesiredWithinRange", "ratio": float("nan")}))
    finally:
        await hook.close()
        await runner.cleanup()
    (req,) = rec.requests
    assert (req["method"], req["path"], req["content_type"]) == ("POST", "/hook", "application/json")
    assert req["body"] == {
        "kind": "hpa.scale",
        "decision": {"rule": "DesiredWithinRange", "ratio": None},
        "target": {"namespace": "shop", "kind": "Deployment", "name": "web", "api_version": "apps/v1"},
        "action": {"currentReplicas": 4, "desiredReplicas": 8},
    }


async def test_a_failing_receiver_is_retried_then_reported(port: int) -> None:
    rec = Recorder(replies=[(503, {}), (500, {}), (200, {})])
    runner = await serve(rec.handle, port)
    waits: list[float] = []

    async def sleep(s: float) -> None:
        waits.append(s)

    hook = WebhookActuator(WebhookSettings(f"http://127.0.0.1:{port}/", retries=3, backoff_s=0.5), sleep=sleep)
    try:
        await hook.publish("overcommit.advice", {"message": "m"})
        assert len(rec.requests) == 3 and waits == [0.5, 1.0]
        rec.replies = [(400, {"error": "bad"})]
        with pytest.raises(ActuatorError, match="HTTP 400"):
            await hook.publish("hpa.alert", {"message": "m"})
        assert len(rec.requests) == 4  # a 4xx is the receiver's answer: not retried
    finally:
        await hook.close()
        await runner.cleanup()


async def test_an_unreachable_receiver_fails_after_the_retries(free_ports: Callable[[], int]) -> None:
    hook = WebhookActuator(WebhookSettings(f"http://127.0.0.1:{free_ports()}/", retries=2, timeout_s=1.0),
                           sleep=no_sleep)
    try:
        with pytest.raises(ActuatorError, match="failed"):
            await hook.publish("hpa.alert", {})
    finally:
        await hook.close()
    assert hook.failed == 1


# --- kubernetes ------------------------------------------------------------------------------


@pytest.fixture
def tls(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make a test certificate")
    cert, key = tmp_path / "ca.crt", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out",
                    str(cert)], check=True, capture_output=True)
    return cert, key


@pytest.fixture
async def apiserver(tls: tuple[Path, Path], port: int, tmp_path: Path) -> AsyncIterator[tuple[Recorder,
                                                                                            KubernetesActuator]]:
    cert, key = tls
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    rec = Recorder()
    runner = await serve(rec.handle, port, ctx)
    token = tmp_path / "token"
    token.write_text("sa-token-1\n")
    kube = KubernetesActuator(KubernetesSettings(f"https://127.0.0.1:{port}", token_file=token, ca_file=cert,
                                                 colocation_node_selector="pool=colo",
                                                 colocation_deletion_cost=-500))
    yield rec, kube
    await kube.close()
    await runner.cleanup()


async def test_the_scale_subresource_is_read_and_merge_patched(apiserver: tuple[Recorder, Any]) -> None:
    rec, kube = apiserver
    rec.replies = [(200, {"kind": "Scale", "spec": {"replicas": 6}})]
    assert await kube.get_scale(REF) == 6
    await kube.scale(ScaleRequest(REF, 6, 9))
    get, patch = rec.requests
    assert (get["method"], get["path"], get["auth"]) == ("GET", "/apis/apps/v1/namespaces/shop/deployments/web/scale",
                                                         "Bearer sa-token-1")
    assert (patch["method"], patch["path"], patch["content_type"], patch["body"]) == (
        "PATCH", "/apis/apps/v1/namespaces/shop/deployments/web/scale", "application/merge-patch+json",
        {"spec": {"replicas": 9}})


async def test_a_scale_down_first_marks_pods_on_the_colocation_pool(apiserver: tuple[Recorder, Any]) -> None:
    rec, kube = apiserver
    pods = [("web-a", "colo-1"), ("web-b", "online-1"), ("web-c", "colo-2"), ("web-d", "colo-1")]
    rec.replies = [
        (200, {"items": [{"metadata": {"name": "colo-1"}}, {"metadata": {"name": "colo-2"}}]}),
        (200, {"spec": {"selector": {"matchLabels": {"app": "web", "tier": "front"}}}}),
        (200, {"items": [{"metadata": {"name": n}, "spec": {"nodeName": node}} for n, node in pods]}),
    ]
    await kube.scale(ScaleRequest(REF, 6, 4))
    nodes, workload, listed, mark1, mark2, scale = rec.requests
    assert (nodes["path"], nodes["query"]) == ("/api/v1/nodes", {"labelSelector": "pool=colo"})
    assert workload["path"] == "/apis/apps/v1/namespaces/shop/deployments/web"
    assert listed["path"] == "/api/v1/namespaces/shop/pods"
    assert listed["query"] == {"labelSelector": "app=web,tier=front"}
    for mark, pod in ((mark1, "web-a"), (mark2, "web-c")):
        assert (mark["method"], mark["path"], mark["content_type"]) == (
            "PATCH", f"/api/v1/namespaces/shop/pods/{pod}", "application/merge-patch+json")
        assert mark["body"] == {"metadata": {"annotations": {DELETION_COST: "-500"}}}
    assert scale["body"] == {"spec": {"replicas": 4}}


async def test_a_vpa_update_strategic_merge_patches_the_pod_template(apiserver: tuple[Recorder, Any]) -> None:
    rec, kube = apiserver
    containers = {"app": {"requests": {"cpu": 0.35, "memory": 512 * 2**20}, "limits": {"cpu": 0.7}}}
    await kube.update_resources(ResourceUpdate(REF, "Auto", containers))
    await kube.update_resources(ResourceUpdate(REF, "Off", containers))  # Off changes nothing
    (req,) = rec.requests
    assert (req["method"], req["path"], req["content_type"]) == (
        "PATCH", "/apis/apps/v1/namespaces/shop/deployments/web", "application/strategic-merge-patch+json")
    assert req["body"] == {"spec": {"template": {"spec": {"containers": [
        {"name": "app", "resources": {"limits": {"cpu": "700m"}, "requests": {"cpu": "350m", "memory": "512Mi"}}}]}}}}


async def test_an_api_error_names_the_call_and_the_server_message(apiserver: tuple[Recorder, Any]) -> None:
    rec, kube = apiserver
    rec.replies = [(403, {"kind": "Status", "message": "deployments.apps \"web\" is forbidden"})]
    with pytest.raises(ActuatorError, match=r"GET /apis/apps/v1/namespaces/shop/deployments/web/scale: HTTP 403: "
                                            r"deployments.apps \"web\" is forbidden"):
        await kube.get_scale(REF)


async def test_a_server_outside_the_ca_is_refused(tls: tuple[Path, Path], port: int, tmp_path: Path) -> None:
    cert, key = tls
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    rec = Recorder()
    runner = await serve(rec.handle, port, ctx)
    kube = KubernetesActuator(KubernetesSettings(f"https://127.0.0.1:{port}", token_file=None, ca_file=None))
    try:
        with pytest.raises(ActuatorError, match=r"CERTIFICATE_VERIFY_FAILED|certificate"):
            await kube.get_scale(REF)
    finally:
        await kube.close()
        await runner.cleanup()
    assert rec.requests == []
