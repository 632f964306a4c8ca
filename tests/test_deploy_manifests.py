"""deploy/kubernetes/ against the real CLI: every metricsd container's flags parse with the command's
own argparse parser, and ports, probes, Services and addresses agree with each other."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from metricsd.cmd.main import build_parser

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"
NAMESPACE = "metricsd"
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")
CLUSTER_SCOPED = ("Namespace", "ClusterRole", "ClusterRoleBinding", "APIService")
# The one object outside metricsd's namespace: reading the front proxy's CA needs a RoleBinding
# beside the Role it binds.
ELSEWHERE = {("RoleBinding", "metricsd-k8s-api-auth-reader"): "kube-system"}


def parser() -> argparse.ArgumentParser:
    """The ``metricsd`` command's own parser, every subcommand as the modules register it."""
    return build_parser()


def documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        with open(path) as f:
            docs += [d for d in yaml.safe_load_all(f) if d is not None]
    return docs


def workloads() -> list[dict[str, Any]]:
    return [d for d in documents() if d["kind"] in WORKLOADS]


def containers() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(w, c) for w in workloads() for c in w["spec"]["template"]["spec"]["containers"]]


def metricsd_containers() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(w, c) for w, c in containers() if c.get("command", [None])[0] == "metricsd"]


def expand(text: str, container: dict[str, Any]) -> str:
    """Kubernetes' $(VAR) substitution, with a plausible value per variable the container defines."""
    defined = {e["name"] for e in container.get("env", [])}

    def value(m: re.Match[str]) -> str:
        name = m.group(1)
        assert name in defined, f"container {container['name']} uses $({name}) without defining it"
        return {"POD_NAME": "metricsd-store-0", "NODE_NAME": "node-1", "NODE_IP": "10.0.0.1",
                "POD_IP": "10.1.0.7"}.get(name, "x")

    return re.sub(r"\$\(([A-Z_]+)\)", value, text)


def parse(container: dict[str, Any]) -> argparse.Namespace:
    argv = [*container["command"][1:], *(expand(a, container) for a in container.get("args", []))]
    try:
        return parser().parse_args(argv)
    except (argparse.ArgumentError, SystemExit) as e:
        raise AssertionError(f"container {container['name']}: {argv} does not parse: {e}") from e


def ports_of(container: dict[str, Any]) -> dict[str | int, int]:
    out: dict[str | int, int] = {}
    for p in container.get("ports", []):
        out[p["containerPort"]] = p["containerPort"]
        if "name" in p:
            out[p["name"]] = p["containerPort"]
    return out


def services() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in documents() if d["kind"] == "Service"}


def service_port(address: str) -> tuple[dict[str, Any], int]:
    """The Service an in-cluster address ``name.namespace.svc:port`` names, and the port."""
    host, _, port = address.rpartition(":")
    labels = host.split(".")
    assert labels[1:3] == [NAMESPACE, "svc"], f"{address}: want <service>.{NAMESPACE}.svc:<port>"
    svc = services().get(labels[0])
    assert svc is not None, f"{address}: no Service {labels[0]}"
    assert int(port) in [p["port"] for p in svc["spec"]["ports"]], f"{address}: Service has no port {port}"
    return svc, int(port)


def test_every_manifest_parses_and_lives_in_the_metricsd_namespace() -> None:
    docs = documents()
    assert {d["kind"] for d in docs} >= {"Namespace", "Service", "StatefulSet", "Deployment", "DaemonSet"}
    assert any(d["kind"] == "Namespace" and d["metadata"]["name"] == NAMESPACE for d in docs)
    for d in docs:
        assert d.get("apiVersion") and d["metadata"].get("name")
        if d["kind"] not in CLUSTER_SCOPED:
            want = ELSEWHERE.get((d["kind"], d["metadata"]["name"]), NAMESPACE)
            assert d["metadata"].get("namespace") == want, d["metadata"]["name"]


def test_the_roles_are_all_deployed_as_the_cluster_issue_asks() -> None:
    by_command = {(w["kind"], c["command"][1]): w for w, c in metricsd_containers()}
    assert set(by_command) == {("StatefulSet", "store"), ("Deployment", "proxy"),
                               ("Deployment", "config-server"), ("DaemonSet", "agent"), ("Deployment", "k8s-api"),
                               ("Deployment", "hpa"), ("Deployment", "vpa")}
    etcd = next(w for w in workloads() if w["metadata"]["name"] == "metricsd-etcd")
    assert etcd["kind"] == "StatefulSet" and etcd["spec"]["replicas"] == 3
    image = etcd["spec"]["template"]["spec"]["containers"][0]["image"]
    assert re.search(r"etcd:v3\.5\.\d+$", image), image


@pytest.mark.parametrize("container", [c for _, c in metricsd_containers()], ids=lambda c: c["name"])
def test_metricsd_flags_parse_with_the_real_parser_and_ports_are_declared(container: dict[str, Any]) -> None:
    args = parse(container)
    declared = ports_of(container)
    for flag in ("grpc_port", "http_port", "metrics_port", "port"):
        value = getattr(args, flag, None)
        if value is not None and value >= 0:
            assert value in declared, f"{container['name']}: --{flag.replace('_', '-')}={value} not a containerPort"
    for kind in ("readinessProbe", "livenessProbe"):
        probe = container.get(kind)
        assert probe is not None, f"{container['name']} has no {kind}"
        handler = probe.get("grpc") or probe.get("httpGet")
        assert handler is not None and handler["port"] in declared, f"{container['name']} {kind}"
        if "grpc" in probe:  # the kubelet's grpc probes speak plaintext only: the health port under TLS
            health_port = getattr(args, "health_port", -1)
            expected = health_port if health_port >= 0 else args.grpc_port
            assert probe["grpc"]["port"] == expected, f"{container['name']} {kind}"
            assert health_port in declared or health_port < 0
            assert probe["grpc"].get("service", "") in ("", "readiness", "liveness")
            if getattr(args, "tls_cert", None) is not None:
                assert health_port >= 0, f"{container['name']} serves TLS but probes its TLS port"
        if "httpGet" in probe and getattr(args, "tls_cert", None) is not None:
            assert probe["httpGet"].get("scheme") == "HTTPS", f"{container['name']} {kind}"
    if getattr(args, "etcd", None):
        svc, _ = service_port(args.etcd)
        assert svc["metadata"]["name"] == "metricsd-etcd"
    if getattr(args, "host", None) is not None and args.command != "agent":
        assert args.host == "0.0.0.0", f"{container['name']} must bind all interfaces in a pod"


def test_every_data_listener_in_a_pod_has_tls_and_tokens_and_the_files_are_mounted() -> None:
    """What `require_secure_or_loopback` demands at start-up, checked here so that the manifests
    cannot describe a process that would refuse to start; and every file flag points into a
    mounted volume."""
    for workload, container in metricsd_containers():
        args = parse(container)
        listens_off_loopback = getattr(args, "http_host", "127.0.0.1") != "127.0.0.1"
        if args.command in ("store", "proxy") or (args.command in ("hpa", "vpa") and listens_off_loopback):
            assert args.tls_cert and args.tls_key and (args.tokens_file or args.tokenreview), container["name"]
            assert not args.insecure
        if args.command == "k8s-api":  # the aggregator's front proxy is told apart by its CA
            assert args.tls_cert and args.tls_key and not args.insecure
            assert args.requestheader_from_cluster or args.requestheader_client_ca_file
        mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
        volumes = {v["name"] for v in workload["spec"]["template"]["spec"].get("volumes", [])}
        volumes |= {c["metadata"]["name"] for c in workload["spec"].get("volumeClaimTemplates", [])}
        assert {m["name"] for m in container.get("volumeMounts", [])} <= volumes, container["name"]
        for flag in ("tls_cert", "tls_key", "tls_client_ca", "tls_ca", "rules", "requestheader_client_ca_file",
                     "spec"):
            path = getattr(args, flag, None)
            if path is not None:
                assert any(str(path).startswith(m + "/") for m in mounts), f"{container['name']}: {path} not mounted"
        if getattr(args, "tokenreview", False):
            sa = workload["spec"]["template"]["spec"].get("serviceAccountName")
            assert sa and any(d["kind"] == "ServiceAccount" and d["metadata"]["name"] == sa for d in documents())


def test_the_tls_secret_names_the_addresses_that_components_dial() -> None:
    cert = next(d for d in documents() if d["kind"] == "Certificate" and d["metadata"]["name"] == "metricsd-tls")
    assert cert["spec"]["secretName"] == "metricsd-tls"
    assert "metricsd-proxy.metricsd.svc" in cert["spec"]["dnsNames"]
    assert "*.metricsd-store.metricsd.svc" in cert["spec"]["dnsNames"]  # --advertise names of the stores
    assert set(cert["spec"]["usages"]) == {"server auth", "client auth"}  # mutual TLS


def test_a_store_advertises_its_own_pod_dns_name_and_port() -> None:
    (sts, container), = [(w, c) for w, c in metricsd_containers() if c["command"][1] == "store"]
    args = parse(container)
    host, _, port = args.advertise.rpartition(":")
    assert int(port) == args.grpc_port
    assert host == f"{args.member_id}.{sts['spec']['serviceName']}.{NAMESPACE}.svc"
    assert services()[sts["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"
    assert args.data_dir is not None and any(
        m["mountPath"] == str(args.data_dir) for m in container["volumeMounts"])


def test_agents_push_to_the_proxy_service_on_its_grpc_port() -> None:
    (_, agent), = [(w, c) for w, c in metricsd_containers() if c["command"][1] == "agent"]
    (_, proxy), = [(w, c) for w, c in metricsd_containers() if c["command"][1] == "proxy"]
    targets = parse(agent).targets.split(",")
    assert targets == ["metricsd-proxy.metricsd.svc:7401"]
    svc, port = service_port(targets[0])
    target = next(p["targetPort"] for p in svc["spec"]["ports"] if p["port"] == port)
    assert ports_of(proxy)[target] == parse(proxy).grpc_port


def test_every_service_selects_pods_that_declare_its_target_ports() -> None:
    for name, svc in services().items():
        selector = svc["spec"]["selector"]
        pods = [w for w in workloads()
                if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert pods, f"Service {name} selects no workload"
        for w in pods:
            declared: dict[str | int, int] = {}
            for c in w["spec"]["template"]["spec"]["containers"]:
                declared.update(ports_of(c))
            for p in svc["spec"]["ports"]:
                assert p["targetPort"] in declared, f"Service {name}: targetPort {p['targetPort']} not in " \
                                                    f"{w['metadata']['name']}"


def test_the_statefulsets_name_existing_headless_services() -> None:
    for w in workloads():
        if w["kind"] == "StatefulSet":
            svc = services().get(w["spec"]["serviceName"])
            assert svc is not None and svc["spec"].get("clusterIP") == "None", w["metadata"]["name"]
            assert w["spec"]["selector"]["matchLabels"].items() <= w["spec"]["template"]["metadata"]["labels"].items()


# --- the Kubernetes metrics APIs (deploy/kubernetes/k8s-api.yaml) ---------------------------------


def k8s_api() -> tuple[dict[str, Any], dict[str, Any], argparse.Namespace]:
    (workload, container), = [(w, c) for w, c in metricsd_containers() if c["command"][1] == "k8s-api"]
    return workload, container, parse(container)


def test_an_apiservice_per_group_points_at_the_k8s_api_port_with_the_tls_ca_injected() -> None:
    from metricsd.k8sapi.discovery import GROUPS

    _, container, args = k8s_api()
    apis = {d["metadata"]["name"]: d for d in documents() if d["kind"] == "APIService"}
    assert set(apis) == {f"{g.version}.{g.name}" for g in GROUPS}
    cert = next(d for d in documents() if d["kind"] == "Certificate" and d["metadata"]["name"] == "metricsd-tls")
    for g in GROUPS:
        spec = apis[f"{g.version}.{g.name}"]["spec"]
        assert (spec["group"], spec["version"]) == (g.name, g.version)
        assert spec.get("insecureSkipTLSVerify") is False and spec["groupPriorityMinimum"] > 0
        svc_ref = spec["service"]
        svc = services()[svc_ref["name"]]
        assert svc_ref["namespace"] == NAMESPACE == svc["metadata"]["namespace"]
        target = next(p["targetPort"] for p in svc["spec"]["ports"] if p["port"] == svc_ref["port"])
        assert ports_of(container)[target] == args.port
        # the aggregator checks the serving certificate against the APIService's caBundle,
        # injected by cert-manager from the Certificate the container serves
        inject = apis[f"{g.version}.{g.name}"]["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        assert inject == f"{NAMESPACE}/{cert['metadata']['name']}"
        assert f"{svc_ref['name']}.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
    assert any(v.get("secret", {}).get("secretName") == cert["spec"]["secretName"]
               for v in k8s_api()[0]["spec"]["template"]["spec"]["volumes"])


def test_the_k8s_api_may_delegate_auth_read_the_front_proxy_ca_and_query_the_proxy() -> None:
    workload, _, args = k8s_api()
    sa = workload["spec"]["template"]["spec"]["serviceAccountName"]
    subject = {"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}

    def bound(kind: str, role: str, namespace: str | None = None) -> bool:
        return any(d["kind"] == kind and d["roleRef"]["name"] == role and subject in d["subjects"]
                   and d["metadata"].get("namespace") == namespace for d in documents())

    assert bound("ClusterRoleBinding", "system:auth-delegator")
    assert bound("RoleBinding", "extension-apiserver-authentication-reader", "kube-system")
    assert args.requestheader_from_cluster
    # its queries go to the proxy's gRPC port, which must give its ServiceAccount the read role
    svc, port = service_port(args.addr)
    assert svc["metadata"]["name"] == "metricsd-proxy"
    (_, proxy), = [(w, c) for w, c in metricsd_containers() if c["command"][1] == "proxy"]
    proxy_args = parse(proxy)
    assert port == proxy_args.grpc_port and args.tls_ca and args.auth_token_file
    assert f"system:serviceaccount:{NAMESPACE}:{sa}=read" in proxy_args.tokenreview_role


def test_kubectl_top_is_granted_to_the_view_role() -> None:
    reader = next(d for d in documents() if d["kind"] == "ClusterRole"
                  and d["metadata"]["name"] == "metricsd:aggregated-metrics-reader")
    assert reader["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    metrics = next(r for r in reader["rules"] if r["apiGroups"] == ["metrics.k8s.io"])
    assert set(metrics["resources"]) == {"pods", "nodes"} and {"get", "list"} <= set(metrics["verbs"])


def test_the_rules_configmap_loads_with_the_real_rule_parser() -> None:
    from metricsd.k8sapi.rules import load_rules

    workload, container, args = k8s_api()
    mount = next(m for m in container["volumeMounts"] if str(args.rules).startswith(m["mountPath"] + "/"))
    volume = next(v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    cm = next(d for d in documents() if d["kind"] == "ConfigMap"
              and d["metadata"]["name"] == volume["configMap"]["name"])
    rules = load_rules(cm["data"][args.rules.name], "k8s-api.yaml")
    assert rules.custom and rules.external
