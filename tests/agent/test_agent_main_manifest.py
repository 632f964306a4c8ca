"""The DaemonSet manifest agrees with the agent's flags and the issue's requirements."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from metricsd.cmd.agent import add_arguments, options_from_args

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "agent-daemonset.yaml"


def daemonset() -> dict[str, Any]:
    docs = list(yaml.safe_load_all(MANIFEST.read_text()))
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    return ds


def test_the_manifest_args_are_flags_the_agent_accepts() -> None:
    spec = daemonset()["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["command"] == ["metricsd", "agent"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env == {"NODE_NAME": "spec.nodeName", "NODE_IP": "status.hostIP", "POD_IP": "status.podIP"}
    argv = [a.replace("$(NODE_NAME)", "node-a").replace("$(NODE_IP)", "10.0.0.7").replace("$(POD_IP)", "10.1.0.9")
            for a in c["args"]]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    opts = options_from_args(parser.parse_args(argv))
    assert opts.node_name == "node-a" and opts.kubelet_url == "https://10.0.0.7:10250/pods"
    assert str(opts.token_file).endswith("serviceaccount/token")
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["cgroup"]["hostPath"]["path"] == "/sys/fs/cgroup" and mounts["cgroup"]["readOnly"] is True
    assert str(opts.cgroup_root) == mounts["cgroup"]["mountPath"]
    assert str(opts.buffer_dir) == mounts["spool"]["mountPath"]
    port = {p["name"]: p["containerPort"] for p in c["ports"]}["metrics"]
    assert opts.metrics_port == port
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics", "scheme": "HTTPS"}
    assert opts.metrics_tls is not None and str(opts.metrics_tls[0]).startswith(mounts["tls"]["mountPath"])
    assert opts.security is not None and str(opts.security.token_file).endswith("serviceaccount/token")
    assert set(c["resources"]) == {"requests", "limits"}
