"""deploy/helm/metricsd rendered by Helm's own engine (helm-python-sdk binds Helm's Go SDK, so
no `helm` binary is needed): linted, every document parsed and checked field by field by kind,
every metricsd container's flags parsed by the command's own argparse parser, and the default
render compared object by object with deploy/kubernetes/, so the chart and the manifests stay
equivalent."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (the dev extra) renders the chart")

from test_deploy_manifests import documents as manifest_documents  # noqa: E402
from test_deploy_manifests import expand  # noqa: E402

from metricsd.cmd.main import build_parser  # noqa: E402

CHART = Path(__file__).resolve().parents[1] / "deploy" / "helm" / "metricsd"
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")
CLUSTER_SCOPED = ("ClusterRole", "ClusterRoleBinding", "APIService")
HELM_LABELS = ("app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "helm.sh/chart")
OVERRIDE = {"tls": {"certManager": {"enabled": False}}, "k8sApi": {"caBundle": "Q0EK"},
            "etcd": {"enabled": False, "externalEndpoint": "etcd.example:2379"},
            "agent": {"enabled": False}, "consumers": {"enabled": False},
            "auth": {"tokensSecret": "metricsd-tokens", "readers": ["grafana"]}, "store": {"replicas": 5}}


def render(values: dict[str, Any] | None = None, name: str = "metricsd", namespace: str = "metricsd"
           ) -> list[dict[str, Any]]:
    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(values or {}, name=name, namespace=namespace)
    docs: list[dict[str, Any]] = []
    for text in out.values():
        docs += [d for d in yaml.safe_load_all(text) if d is not None]
    return docs


def key(d: dict[str, Any]) -> tuple[str, str]:
    return d["kind"], d["metadata"]["name"]


def pod_spec(w: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = w["spec"]["template"]["spec"]
    return spec


def test_the_chart_lints_clean() -> None:
    result = helm.lint(str(CHART))
    assert result["errors"] == []
    assert [m for m in result["messages"] if m["severity"] > 1] == []  # 1: INFO (the icon)


@pytest.mark.parametrize("values", [{}, OVERRIDE], ids=["defaults", "override"])
def test_every_object_has_its_shape(values: dict[str, Any]) -> None:
    docs = render(values, name="prod", namespace="mon")
    assert len({key(d) for d in docs}) == len(docs), "two objects of one kind and name"
    by_key = {key(d): d for d in docs}
    for d in docs:
        assert d["apiVersion"] and (d["metadata"]["name"].startswith("prod")
                                 or d["kind"] == "APIService" or key(d) == ("Certificate", "metricsd-tls"))
        assert d["metadata"]["labels"]["app.kubernetes.io/instance"] == "prod", key(d)
        if d["kind"] not in CLUSTER_SCOPED:
            want = "kube-system" if key(d) == ("RoleBinding", "prod-k8s-api-auth-reader") else "mon"
            assert d["metadata"]["namespace"] == want, key(d)
    for w in (d for d in docs if d["kind"] in WORKLOADS):
        selector = w["spec"]["selector"]["matchLabels"]
        assert selector.items() <= w["spec"]["template"]["metadata"]["labels"].items(), key(w)
        spec = pod_spec(w)
        assert spec.get("securityContext", {}).get("seccompProfile") == {"type": "RuntimeDefault"}, key(w)
        sa = spec.get("serviceAccountName")
        assert sa is None or ("ServiceAccount", sa) in by_key, f"{key(w)}: no ServiceAccount {sa}"
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        volumes |= {c["metadata"]["name"]: c for c in w["spec"].get("volumeClaimTemplates", [])}
        for c in spec["containers"]:
            assert c["image"] and c["resources"]["requests"] and c["resources"]["limits"]["memory"], c["name"]
            assert c["readinessProbe"] and c["livenessProbe"], c["name"]
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc["capabilities"] == {"drop": ["ALL"]}, c["name"]
            non_root = sc.get("runAsNonRoot", spec["securityContext"].get("runAsNonRoot"))
            uid = sc.get("runAsUser", spec["securityContext"].get("runAsUser"))
            if c["name"] == "agent":  # root for the hostPath spool, without any capability (values.yaml)
                assert uid == 0
            else:
                assert non_root is True and uid != 0, c["name"]
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes, f"{c['name']}: no volume {m['name']}"
                cm = volumes[m["name"]].get("configMap")
                assert cm is None or ("ConfigMap", cm["name"]) in by_key, cm
            for kind in ("readinessProbe", "livenessProbe"):
                probe = c[kind]
                port = (probe.get("grpc") or probe.get("httpGet"))["port"]
                assert port in {p["containerPort"] for p in c["ports"]} | {p.get("name") for p in c["ports"]}
    for svc in (d for d in docs if d["kind"] == "Service"):
        matched = [w for w in docs if w["kind"] in WORKLOADS
                   and svc["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert matched, f"Service {svc['metadata']['name']} selects no workload"
        names = {p.get("name") for w in matched for c in pod_spec(w)["containers"] for p in c["ports"]}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= names, svc["metadata"]["name"]
    for pdb in (d for d in docs if d["kind"] == "PodDisruptionBudget"):
        assert ("minAvailable" in pdb["spec"]) != ("maxUnavailable" in pdb["spec"])
        sel = pdb["spec"]["selector"]["matchLabels"]
        matched = [w for w in docs if w["kind"] in WORKLOADS and w["spec"]["selector"]["matchLabels"] == sel]
        assert len(matched) == 1, pdb["metadata"]["name"]
    for b in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        ref = b["roleRef"]
        assert ref["name"].startswith("system:") or ref["name"] == "extension-apiserver-authentication-reader" \
            or (ref["kind"], ref["name"]) in by_key, f"{b['metadata']['name']}: no {ref['kind']} {ref['name']}"
        for s in b["subjects"]:
            assert s["kind"] == "ServiceAccount" and ("ServiceAccount", s["name"]) in by_key, s
            assert s["namespace"] == "mon"
    pdbs = {d["metadata"]["name"] for d in docs if d["kind"] == "PodDisruptionBudget"}
    assert {"prod-store", "prod-proxy"} <= pdbs
    assert ("prod-etcd" in pdbs) == ("etcd" not in values)


def metricsd_containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for w in docs if w["kind"] in WORKLOADS for c in pod_spec(w)["containers"]
            if c["command"][0] == "metricsd"]


def parse(container: dict[str, Any]) -> argparse.Namespace:
    argv = [*container["command"][1:], *(expand(a, container) for a in container.get("args", []))]
    try:
        return build_parser().parse_args(argv)
    except SystemExit as e:
        raise AssertionError(f"container {container['name']}: {argv} does not parse") from e


@pytest.mark.parametrize("values", [{}, OVERRIDE], ids=["defaults", "override"])
def test_every_flag_the_chart_passes_exists_in_the_commands_parser(values: dict[str, Any]) -> None:
    containers = metricsd_containers(render(values))
    commands = {c["command"][1] for c in containers}
    assert commands == ({"store", "proxy", "config-server", "k8s-api"} if values else
                        {"store", "proxy", "config-server", "k8s-api", "agent", "hpa", "vpa"})
    for c in containers:
        args = parse(c)
        if getattr(args, "host", None) == "0.0.0.0" and args.command != "config-server":
            assert args.tls_cert and not args.insecure, c["name"]


def test_the_override_reaches_the_flags() -> None:
    docs = render(OVERRIDE)
    by_command = {c["command"][1]: parse(c) for c in metricsd_containers(docs)}
    assert by_command["store"].etcd == by_command["proxy"].etcd == "etcd.example:2379"
    assert str(by_command["proxy"].tokens_file) == "/etc/metricsd/tokens/tokens"
    assert "grafana=read" in by_command["proxy"].tokenreview_role
    assert by_command["config-server"].min_members == 5
    assert not [d for d in docs if d["apiVersion"].startswith("cert-manager.io/")]
    assert {d["spec"]["caBundle"] for d in docs if d["kind"] == "APIService"} == {"Q0EK"}
    proxy = next(d for d in docs if key(d) == ("Deployment", "metricsd-proxy"))
    assert {"name": "tokens", "secret": {"secretName": "metricsd-tokens"}} in pod_spec(proxy)["volumes"]


@pytest.mark.parametrize(("values", "message"), [
    ({"tls": {"enabled": False}}, "tls.enabled=false: stores and proxies refuse"),
    ({"etcd": {"enabled": False}}, "etcd.externalEndpoint is required"),
    ({"tls": {"certManager": {"enabled": False}}}, "k8sApi.caBundle is required"),
])
def test_a_setting_that_cannot_run_is_refused_at_render_time(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError) as e:
        render(values)
    assert message in str(e.value)


def normalized(d: dict[str, Any]) -> dict[str, Any]:
    """The object without Helm's own labels, which the plain manifests do not carry."""
    def strip(labels: dict[str, str] | None) -> dict[str, str]:
        return {k: v for k, v in (labels or {}).items() if k not in HELM_LABELS}

    d = yaml.safe_load(yaml.safe_dump(d))
    d["metadata"]["labels"] = strip(d["metadata"].get("labels"))
    template = d.get("spec", {}).get("template") if isinstance(d.get("spec"), dict) else None
    if template is not None:
        template["metadata"]["labels"] = strip(template["metadata"].get("labels"))
    return d


def test_the_default_render_is_deploy_kubernetes_object_by_object() -> None:
    chart = {key(d): normalized(d) for d in render()}
    plain = {key(d): d for d in manifest_documents() if d["kind"] != "Namespace"}  # helm --create-namespace
    assert sorted(chart) == sorted(plain)
    for k, want in plain.items():
        got = chart[k]
        want = normalized(want)
        # the manifests label only some objects; every label they give must be in the chart's
        assert want["metadata"]["labels"].items() <= got["metadata"]["labels"].items(), k
        got["metadata"]["labels"] = want["metadata"]["labels"]
        assert got == want, k
