"""`metricsd k8s-api` as the API server's aggregator calls it: real HTTPS against a real
`metricsd store` process fed with samples, the front proxy's client certificate and headers, and
the JSON compared field by field with what metrics-server and prometheus-adapter return."""

from __future__ import annotations

import asyncio
import re
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from processes import stop_process
from writes import write_request

from metricsd.cluster.etcd_server import free_port
from metricsd.model import Labels, make_labels
from metricsd.rpc.client import MetricsClient
from metricsd.security.certs import LocalPKI, create_local_pki, issue_certificate
from metricsd.security.tokens import hash_token

pytestmark = pytest.mark.slow





RULES = """
rules:
- seriesQuery: '{__name__=~"^http_.*_total$",namespace!="",pod!=""}'
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
      workload: {group: apps, resource: deployment}
  name: {matches: "^(.*)_total$", as: "${1}_per_second"}
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[1m])) by (<<.GroupBy>>)'
externalRules:
- seriesQuery: 'queue_depth{namespace!=""}'
  resources: {overrides: {namespace: {resource: namespace}}}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (queue)'
"""
QUANTITY = re.compile(r"^(\d+)(n|u|m|k|M|G|Ki|Mi|Gi|)$")
SCALE = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
         "k": Fraction(1000), "M": Fraction(10**6), "G": Fraction(10**9), "Ki": Fraction(1024),
         "Mi": Fraction(1024**2), "Gi": Fraction(1024**3)}
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def value(q: str) -> float:
    m = QUANTITY.match(q)
    assert m, f"{q!r} is not a canonical quantity"
    return float(int(m.group(1)) * SCALE[m.group(2)])


@dataclass
class Api:
    url: str
    server_ca: Path
    front: tuple[Path, Path]  # the front proxy's certificate and key
    intruder: tuple[Path, Path]  # signed by the front proxy CA, another common name
    stranger: tuple[Path, Path]  # signed by another CA
    now_ms: int

    def ssl(self, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.server_ca))
        if cert is not None:
            ctx.load_cert_chain(*cert)
        return ctx

    async def get(self, path: str, cert: tuple[Path, Path] | None = None, headers: dict[str, str] | None = None,
                  **params: str) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as s, s.get(self.url + path, ssl=self.ssl(cert), headers=headers,
                                                       params=params or None) as r:
            body = await r.json() if r.content_type == "application/json" else await r.text()
            return r.status, body

    async def front_get(self, path: str, **params: str) -> tuple[int, Any]:
        return await self.get(path, self.front, {"X-Remote-User": "system:serviceaccount:kube-system:hpa",
                                                 "X-Remote-Group": "system:serviceaccounts"}, **params)


def _front_proxy_pki(directory: Path) -> tuple[tuple[Path, Path], tuple[Path, Path], Path]:
    pki = create_local_pki(directory, days=1)
    ca = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), None)
    out = []
    for cn in ("front-proxy-client", "intruder"):
        pair = (directory / f"{cn}.crt", directory / f"{cn}.key")
        issue_certificate(ca, key, cn, ["127.0.0.1"], *pair, days=1)  # type: ignore[arg-type]
        out.append(pair)
    return out[0], out[1], pki.ca


def _start(argv: list[str], log: Path, banner: str) -> subprocess.Popen[str]:
    with open(log, "w") as err:  # the child keeps its own descriptor
        proc = subprocess.Popen([sys.executable, "-m", "metricsd", *argv], stdout=subprocess.PIPE, stderr=err,
                                text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if banner not in line:
        proc.kill()
        raise AssertionError(f"{argv[0]} did not start: {line!r}\n{log.read_text()}")
    return proc


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for p in reversed(procs):
        stop_process(p, 10)


async def _feed(addr: str, now_ms: int) -> None:
    """Five minutes at 10 s: CPU counters at known rates, working sets, HTTP counters, a gauge."""
    ts = [now_ms - 300_000 + 10_000 * i for i in range(31)]
    series: dict[Labels, tuple[list[int], list[float]]] = {}

    def add(name: str, labels: dict[str, str], per_s: float | None, constant: float | None = None) -> None:
        vals = [per_s * (t - ts[0]) / 1000 if per_s is not None else float(constant or 0) for t in ts]
        series[make_labels(name, labels)] = (ts, vals)

    for pod, node, cores, mem in (("web-1", "n1", 0.25, 4096 * 1000), ("web-2", "n2", 0.5, 1024**3)):
        base = {"namespace": "shop", "pod": pod, "node": node, "workload": "web"}
        for container in ("app", "sidecar"):
            add("container_cpu_usage_seconds_total", {**base, "container": container}, cores)
            add("container_memory_working_set_bytes", {**base, "container": container}, None, mem)
        add("container_cpu_usage_seconds_total", {**base, "container": "POD"}, 5.0)  # the pause container: left out
        add("http_requests_total", {**base, "verb": "GET"}, 2.0 if pod == "web-1" else 3.0)
    add("node_cpu_usage_seconds_total", {"namespace": "kube-system", "pod": "node-n1", "node": "n1"}, 1.5)
    node = {"namespace": "kube-system", "pod": "node-n1", "node": "n1"}
    add("node_memory_working_set_bytes", node, None, 2 * 1024**3)
    add("container_cpu_usage_seconds_total", {"namespace": "other", "pod": "db-0", "node": "n1", "container": "db"}, 1)
    add("container_memory_working_set_bytes", {"namespace": "other", "pod": "db-0", "node": "n1", "container": "db"},
        None, 1024**2)
    for queue, depth in (("orders", 7.0), ("billing", 3.5)):
        add("queue_depth", {"namespace": "shop", "pod": "broker-0", "queue": queue}, None, depth)
    async with MetricsClient(addr, 10.0) as client:
        resp = await client.write(write_request(series))
        assert not resp.unknown_ids


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("k8sapi")
    server = create_local_pki(tmp / "server", days=1)
    front, intruder, front_ca = _front_proxy_pki(tmp / "front")
    stranger: LocalPKI = create_local_pki(tmp / "stranger", days=1)
    (tmp / "rules.yaml").write_text(RULES)
    (tmp / "tokens").write_text(f"grafana read {hash_token('reader')}\nagent write {hash_token('writer')}\n")
    grpc_port, https_port = free_port(), free_port()
    procs = [_start(["store", "--grpc-port", str(grpc_port)], tmp / "store.log", "serving gRPC")]
    try:
        now_ms = int(time.time() * 1000)
        asyncio.run(_feed(f"127.0.0.1:{grpc_port}", now_ms))
        procs.append(_start(["k8s-api", "--addr", f"127.0.0.1:{grpc_port}", "--port", str(https_port),
                             "--tls-cert", str(server.cert), "--tls-key", str(server.key),
                             "--requestheader-client-ca-file", str(front_ca),
                             "--requestheader-allowed-names", "front-proxy-client",
                             "--tokens-file", str(tmp / "tokens"), "--rules", str(tmp / "rules.yaml")],
                            tmp / "k8sapi.log", "serving metrics.k8s.io"))
        yield Api(f"https://127.0.0.1:{https_port}", server.ca, front, intruder, (stranger.cert, stranger.key),
                  now_ms)
    finally:
        _stop(procs)


# --- discovery ---------------------------------------------------------------------------------


async def test_discovery_documents(api: Api) -> None:
    code, doc = await api.get("/apis")
    assert code == 200 and doc["kind"] == "APIGroupList" and doc["apiVersion"] == "v1"
    assert [g["name"] for g in doc["groups"]] == ["metrics.k8s.io", "custom.metrics.k8s.io",
                                                  "external.metrics.k8s.io"]
    assert doc["groups"][0] == {"name": "metrics.k8s.io",
                                "versions": [{"groupVersion": "metrics.k8s.io/v1beta1", "version": "v1beta1"}],
                                "preferredVersion": {"groupVersion": "metrics.k8s.io/v1beta1", "version": "v1beta1"}}
    code, doc = await api.get("/apis/metrics.k8s.io")
    assert code == 200 and doc["kind"] == "APIGroup" and doc["preferredVersion"]["version"] == "v1beta1"
    code, doc = await api.get("/apis/metrics.k8s.io/v1beta1")
    assert code == 200 and doc == {
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "metrics.k8s.io/v1beta1",
        "resources": [{"name": "nodes", "singularName": "", "namespaced": False, "kind": "NodeMetrics",
                       "verbs": ["get", "list"]},
                      {"name": "pods", "singularName": "", "namespaced": True, "kind": "PodMetrics",
                       "verbs": ["get", "list"]}]}
    code, doc = await api.get("/apis/custom.metrics.k8s.io/v1beta2")
    assert code == 200 and doc["groupVersion"] == "custom.metrics.k8s.io/v1beta2"
    assert {(r["name"], r["namespaced"], r["kind"], tuple(r["verbs"])) for r in doc["resources"]} == {
        ("pods/http_requests_per_second", True, "MetricValueList", ("get",)),
        ("namespaces/http_requests_per_second", False, "MetricValueList", ("get",)),
        ("deployments/http_requests_per_second", True, "MetricValueList", ("get",))}
    code, doc = await api.get("/apis/external.metrics.k8s.io/v1beta1")
    assert code == 200 and doc["resources"] == [{"name": "queue_depth", "singularName": "", "namespaced": True,
                                                 "kind": "ExternalMetricValueList", "verbs": ["get"]}]
    assert (await api.get("/apis/custom.metrics.k8s.io/v1beta1"))[0] == 404
    for probe in ("/healthz", "/livez", "/readyz"):
        assert await api.get(probe) == (200, "ok")
    code, doc = await api.get("/openapi/v2")
    assert code == 200 and doc["swagger"] == "2.0"


# --- who may call ------------------------------------------------------------------------------


async def test_only_the_front_proxy_or_a_token_holder_is_served(api: Api) -> None:
    path = "/apis/metrics.k8s.io/v1beta1/pods"
    as_user = {"X-Remote-User": "admin", "X-Remote-Group": "system:masters"}
    code, doc = await api.get(path, headers=as_user)  # headers without the front proxy's certificate
    assert code == 401 and doc["kind"] == "Status" and doc["reason"] == "Unauthorized" and doc["code"] == 401
    assert (await api.get(path, api.intruder, as_user))[0] == 401  # the CA signed it, but not that name
    with pytest.raises(aiohttp.ClientError):  # a certificate of another CA fails the handshake
        await api.get(path, api.stranger, as_user)
    assert (await api.get(path, api.front, {"X-Remote-Group": "g"}))[0] == 401  # no user named
    assert (await api.front_get(path))[0] == 200
    assert (await api.get(path, headers={"Authorization": "Bearer reader"}))[0] == 200
    code, doc = await api.get(path, headers={"Authorization": "Bearer writer"})
    assert code == 403 and doc["reason"] == "Forbidden" and "needs role read" in doc["message"]


# --- metrics.k8s.io ----------------------------------------------------------------------------


def _check_pod(item: dict[str, Any], kind: str | None = None) -> None:
    want = {"metadata", "timestamp", "window", "containers"} | ({"kind", "apiVersion"} if kind else set())
    assert set(item) == want
    if kind:
        assert (item["kind"], item["apiVersion"]) == (kind, "metrics.k8s.io/v1beta1")
    assert set(item["metadata"]) == {"name", "namespace", "creationTimestamp"}
    assert TIME.match(item["timestamp"]) and TIME.match(item["metadata"]["creationTimestamp"])
    assert item["window"] == "1m0s"
    for c in item["containers"]:
        assert set(c) == {"name", "usage"} and set(c["usage"]) == {"cpu", "memory"}


async def test_pod_metrics_as_metrics_server_returns_them(api: Api) -> None:
    code, doc = await api.front_get("/apis/metrics.k8s.io/v1beta1/namespaces/shop/pods")
    assert code == 200
    assert (doc["kind"], doc["apiVersion"], doc["metadata"]) == ("PodMetricsList", "metrics.k8s.io/v1beta1", {})
    assert [p["metadata"]["name"] for p in doc["items"]] == ["web-1", "web-2"]
    for item in doc["items"]:
        _check_pod(item)
        assert item["metadata"]["namespace"] == "shop"
        assert [c["name"] for c in item["containers"]] == ["app", "sidecar"]  # not POD
    web1, web2 = doc["items"]
    for c in web1["containers"]:
        assert c["usage"]["cpu"] == "250m" or abs(value(c["usage"]["cpu"]) - 0.25) < 1e-6
        assert c["usage"]["memory"] == "4000Ki"
    for c in web2["containers"]:
        assert abs(value(c["usage"]["cpu"]) - 0.5) < 1e-6 and c["usage"]["memory"] == "1Gi"
    stamp = time.mktime(time.strptime(web1["timestamp"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    assert api.now_ms / 1000 - 5 <= stamp <= time.time() + 1

    code, doc = await api.front_get("/apis/metrics.k8s.io/v1beta1/pods")
    assert code == 200 and [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in doc["items"]] == [
        ("other", "db-0"), ("shop", "web-1"), ("shop", "web-2")]

    code, one = await api.front_get("/apis/metrics.k8s.io/v1beta1/namespaces/shop/pods/web-2")
    assert code == 200
    _check_pod(one, "PodMetrics")
    assert one["metadata"]["name"] == "web-2"

    code, missing = await api.front_get("/apis/metrics.k8s.io/v1beta1/namespaces/shop/pods/nope")
    assert code == 404 and missing == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": 'podmetrics.metrics.k8s.io "shop/nope" not found', "reason": "NotFound",
        "details": {"name": "shop/nope", "group": "metrics.k8s.io", "kind": "pods"}, "code": 404}


async def test_label_selectors_on_pod_metrics(api: Api) -> None:
    # the HPA's pod selector: keys metricsd holds no label for are ignored (the HPA matches pods itself)
    code, doc = await api.front_get("/apis/metrics.k8s.io/v1beta1/namespaces/shop/pods", labelSelector="app=web")
    assert code == 200 and len(doc["items"]) == 2
    code, doc = await api.front_get("/apis/metrics.k8s.io/v1beta1/namespaces/shop/pods", labelSelector="app in web")
    assert code == 400 and doc["reason"] == "BadRequest" and "expected '('" in doc["message"]


async def test_node_metrics_as_metrics_server_returns_them(api: Api) -> None:
    code, doc = await api.front_get("/apis/metrics.k8s.io/v1beta1/nodes")
    assert code == 200 and doc["kind"] == "NodeMetricsList" and doc["metadata"] == {}
    assert [n["metadata"]["name"] for n in doc["items"]] == ["n1", "n2"]
    for n in doc["items"]:
        assert set(n) == {"metadata", "timestamp", "window", "usage"} and set(n["metadata"]) == {
            "name", "creationTimestamp"}
    n1, n2 = doc["items"]
    assert abs(value(n1["usage"]["cpu"]) - 1.5) < 1e-6 and n1["usage"]["memory"] == "2Gi"  # the node's own series
    assert abs(value(n2["usage"]["cpu"]) - 1.0) < 1e-6 and n2["usage"]["memory"] == "2Gi"  # its containers' sum
    code, one = await api.front_get("/apis/metrics.k8s.io/v1beta1/nodes/n2")
    assert code == 200 and one["kind"] == "NodeMetrics" and one["metadata"]["name"] == "n2"
    code, missing = await api.front_get("/apis/metrics.k8s.io/v1beta1/nodes/n9")
    assert code == 404 and missing["message"] == 'nodemetrics.metrics.k8s.io "n9" not found'


# --- custom.metrics.k8s.io and external.metrics.k8s.io -------------------------------------------


def _described(item: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(item["describedObject"].items())


async def test_custom_metrics_per_pod_per_object_and_per_namespace(api: Api) -> None:
    base = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/shop"
    code, doc = await api.front_get(f"{base}/pods/*/http_requests_per_second")
    assert code == 200 and (doc["kind"], doc["apiVersion"], doc["metadata"]) == (
        "MetricValueList", "custom.metrics.k8s.io/v1beta2", {})
    assert [_described(i) for i in doc["items"]] == [
        (("kind", "Pod"), ("namespace", "shop"), ("name", "web-1"), ("apiVersion", "/v1")),
        (("kind", "Pod"), ("namespace", "shop"), ("name", "web-2"), ("apiVersion", "/v1"))]
    for item, rate in zip(doc["items"], (2.0, 3.0), strict=True):
        assert set(item) == {"describedObject", "metric", "timestamp", "value"}
        assert item["metric"] == {"name": "http_requests_per_second", "selector": None}
        assert TIME.match(item["timestamp"]) and abs(value(item["value"]) - rate) <= 0.001

    code, doc = await api.front_get(f"{base}/pods/web-2/http_requests_per_second", metricSelector="verb=GET")
    assert code == 200 and len(doc["items"]) == 1
    assert doc["items"][0]["metric"] == {"name": "http_requests_per_second",
                                         "selector": {"matchLabels": {"verb": "GET"}}}
    code, doc = await api.front_get(f"{base}/pods/web-2/http_requests_per_second", metricSelector="verb=PUT")
    assert code == 404 and doc["reason"] == "NotFound"

    code, doc = await api.front_get(f"{base}/deployments/web/http_requests_per_second")
    assert code == 200 and _described(doc["items"][0]) == (
        ("kind", "Deployment"), ("namespace", "shop"), ("name", "web"), ("apiVersion", "apps/v1"))
    assert abs(value(doc["items"][0]["value"]) - 5.0) <= 0.001

    code, doc = await api.front_get(f"{base}/metrics/http_requests_per_second")
    assert code == 200 and _described(doc["items"][0]) == (
        ("kind", "Namespace"), ("name", "shop"), ("apiVersion", "/v1"))
    assert abs(value(doc["items"][0]["value"]) - 5.0) <= 0.001

    assert (await api.front_get(f"{base}/pods/*/nonexistent_metric"))[0] == 404
    assert (await api.front_get(f"{base}/services/*/http_requests_per_second"))[0] == 404


async def test_external_metrics(api: Api) -> None:
    path = "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/queue_depth"
    code, doc = await api.front_get(path)
    assert code == 200 and (doc["kind"], doc["apiVersion"], doc["metadata"]) == (
        "ExternalMetricValueList", "external.metrics.k8s.io/v1beta1", {})
    assert [(i["metricName"], i["metricLabels"], i["value"]) for i in doc["items"]] == [
        ("queue_depth", {"queue": "billing"}, "3500m"), ("queue_depth", {"queue": "orders"}, "7")]
    assert all(set(i) == {"metricName", "metricLabels", "timestamp", "value"} for i in doc["items"])
    code, doc = await api.front_get(path, labelSelector="queue=orders")
    assert code == 200 and [i["metricLabels"] for i in doc["items"]] == [{"queue": "orders"}]
    code, doc = await api.front_get("/apis/external.metrics.k8s.io/v1beta1/namespaces/other/queue_depth")
    assert code == 200 and doc["items"] == []


# --- start-up ----------------------------------------------------------------------------------


def test_a_bad_rules_file_stops_the_process_naming_the_field(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(RULES.replace("by (<<.GroupBy>>)", "by (pod) + 1"))
    proc = subprocess.run([sys.executable, "-m", "metricsd", "k8s-api", "--port", "0", "--rules",
                           str(tmp_path / "rules.yaml")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.startswith("metricsd k8s-api: rules[0].metricsQuery: "), proc.stderr
    assert "pushed-down" in proc.stderr


def test_off_loopback_without_a_front_proxy_ca_or_tokens_it_refuses_to_start(pki: LocalPKI) -> None:
    proc = subprocess.run([sys.executable, "-m", "metricsd", "k8s-api", "--host", "0.0.0.0", "--port", "0",
                           "--tls-cert", str(pki.cert), "--tls-key", str(pki.key)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "--requestheader-client-ca-file" in proc.stderr, proc.stderr
