"""Kubernetes quantities, workloads, QoS classes and the kubelet's pod list."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cgroup_fixture_tree import BATCH_UID, DB_UID, EXPORTER_UID, PODS_JSON, WEB_APP, WEB_SIDECAR, WEB_UID
from hypothesis import given
from hypothesis import strategies as st

from metricsd.agent.pods import (
    ContainerSpec,
    PodListError,
    load_pod_list,
    parse_pod_list,
    parse_pod_list_json,
    parse_quantity,
    qos_class,
    workload_of,
)

Ki, Mi, Gi = 1024, 1024**2, 1024**3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100m", 0.1),
        ("250m", 0.25),
        ("1m", 0.001),
        ("1500m", 1.5),
        ("0.5", 0.5),
        (".5", 0.5),
        ("5.", 5.0),
        ("1", 1.0),
        ("0", 0.0),
        ("2", 2.0),
        ("+3", 3.0),
        ("-1", -1.0),
        ("128Mi", 128 * Mi),
        ("1Ki", Ki),
        ("1.5Gi", 1.5 * Gi),
        ("4Gi", 4 * Gi),
        ("1Ti", 1024**4),
        ("1Pi", 1024**5),
        ("1Ei", 1024**6),
        ("1k", 1e3),
        ("1M", 1e6),
        ("1G", 1e9),
        ("2T", 2e12),
        ("1P", 1e15),
        ("1E", 1e18),
        ("500u", 0.0005),
        ("100n", 1e-7),
        ("1e3", 1e3),
        ("1E3", 1e3),
        ("1e-3", 1e-3),
        ("1.5e+2", 150.0),
        ("12e6", 12e6),
        ("0001", 1.0),
        (" 64Mi ", 64 * Mi),
    ],
)
def test_parse_quantity(text: str, expected: float) -> None:
    assert parse_quantity(text) == pytest.approx(expected, rel=1e-12, abs=0)


@pytest.mark.parametrize(
    "text", ["", " ", "m", "Mi", ".", "1K", "1KiB", "1 Gi", "1e", "1e3.5", "1.2.3", "abc", "1mm", "1Ki5", "0x10", "--1"]
)
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(text)


def test_parse_quantity_is_exact_for_milli_cores() -> None:
    # Decimal arithmetic: 3 * 100m is exactly 0.3 as a float, not 0.30000000000000004.
    assert parse_quantity("300m") == 0.3
    assert parse_quantity("1100m") == 1.1


@pytest.mark.parametrize(
    ("owners", "labels", "expected"),
    [
        ([{"kind": "ReplicaSet", "name": "web-7d4b9c8f6d", "controller": True}],
         {"pod-template-hash": "7d4b9c8f6d"}, ("Deployment", "web")),
        ([{"kind": "ReplicaSet", "name": "my-api-server-5c9f8d7b6b", "controller": True}],
         {"pod-template-hash": "5c9f8d7b6b"}, ("Deployment", "my-api-server")),
        # No pod-template-hash label: the suffix is stripped only if it looks like a hash.
        ([{"kind": "ReplicaSet", "name": "web-5c9f8d7b6b", "controller": True}], {}, ("Deployment", "web")),
        ([{"kind": "ReplicaSet", "name": "my-app-db", "controller": True}], {}, ("ReplicaSet", "my-app-db")),
        # A hand-made ReplicaSet whose label does not match its name stays a ReplicaSet.
        ([{"kind": "ReplicaSet", "name": "frontend", "controller": True}],
         {"pod-template-hash": "abc"}, ("ReplicaSet", "frontend")),
        ([{"kind": "StatefulSet", "name": "db", "controller": True}], {}, ("StatefulSet", "db")),
        ([{"kind": "DaemonSet", "name": "node-exporter", "controller": True}], {}, ("DaemonSet", "node-exporter")),
        ([{"kind": "Job", "name": "batch-28391234", "controller": True}], {}, ("Job", "batch-28391234")),
        ([{"kind": "Node", "name": "worker-1", "controller": True}], {}, ("", "")),
        ([], {}, ("", "")),
        # The controller reference wins over other owners.
        ([{"kind": "ConfigMap", "name": "x"}, {"kind": "StatefulSet", "name": "s", "controller": True}],
         {}, ("StatefulSet", "s")),
    ],
)
def test_workload_of(owners: list[dict[str, object]], labels: dict[str, str], expected: tuple[str, str]) -> None:
    assert workload_of({"ownerReferences": owners, "labels": labels}) == expected


@pytest.mark.parametrize(
    ("containers", "expected"),
    [
        ((ContainerSpec("a"),), "BestEffort"),
        ((ContainerSpec("a", {"cpu": 1.0, "memory": 1.0}, {"cpu": 1.0, "memory": 1.0}),), "Guaranteed"),
        ((ContainerSpec("a", {}, {"cpu": 1.0, "memory": 1.0}),), "Guaranteed"),  # requests default to limits
        ((ContainerSpec("a", {"cpu": 0.5}, {"cpu": 1.0, "memory": 1.0}),), "Burstable"),
        ((ContainerSpec("a", {"cpu": 0.5}),), "Burstable"),
        ((ContainerSpec("a", {}, {"cpu": 1.0, "memory": 1.0}), ContainerSpec("b")), "Burstable"),
    ],
)
def test_qos_class(containers: tuple[ContainerSpec, ...], expected: str) -> None:
    assert qos_class(containers) == expected


def test_pod_list_fixture_parses() -> None:
    index = load_pod_list(PODS_JSON)
    assert len(index) == 5 and not index.skipped
    web = index.pods[WEB_UID]
    assert (web.namespace, web.name, web.workload_kind, web.workload) == (
        "shop", "web-7d4b9c8f6d-x2x9p", "Deployment", "web"
    )
    assert web.qos == "Burstable" and web.node == "worker-1"
    assert web.container_ids == {WEB_APP: "app", WEB_SIDECAR: "sidecar"}  # lastState ids are not current
    app = web.containers[0]
    assert app.requests == {"cpu": 0.25, "memory": 128 * Mi}
    assert app.limits == {"cpu": 1.0, "memory": 256 * Mi}
    assert web.containers[1].limits == {}
    assert index.pods[DB_UID].workload == "db" and index.pods[DB_UID].qos == "Guaranteed"
    assert index.pods[EXPORTER_UID].containers[0].requests == {}
    batch = index.pods[BATCH_UID]
    assert batch.qos == "Burstable"  # no status.qosClass: computed from the spec
    assert batch.containers[0].requests == {"cpu": 0.5, "memory": 1e9}
    assert batch.containers[0].limits == {"memory": 1e9}


def test_bad_pods_are_skipped_and_counted() -> None:
    data = json.loads(PODS_JSON.read_text())
    data["items"].append("not a pod")
    data["items"].append({"metadata": {"name": "no-uid"}})
    bad_quantity = json.loads(json.dumps(data["items"][1]))
    bad_quantity["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"
    bad_quantity["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "two"
    data["items"].append(bad_quantity)
    index = parse_pod_list(data)
    assert len(index) == 6
    assert index.skipped == {"not_an_object": 1, "no_uid_or_name": 1, "bad_quantity": 1}
    assert index.pods["00000000-0000-0000-0000-000000000001"].containers[0].requests == {"memory": 4 * Gi}


def test_numbers_in_hand_written_pod_lists_are_accepted() -> None:
    pod = {"metadata": {"uid": "U-1", "name": "p"}, "spec": {"containers": [
        {"name": "c", "resources": {"requests": {"cpu": 0.5, "memory": 1048576}}}]}}
    index = parse_pod_list({"items": [pod]})
    info = index.pods["u-1"]
    assert info.namespace == "default"
    assert info.containers[0].requests == {"cpu": 0.5, "memory": 1048576.0}


@pytest.mark.parametrize("text", ["", "{", "[]", '{"items": 3}', "null"])
def test_a_pod_list_that_is_no_pod_list_raises(text: str) -> None:
    with pytest.raises(PodListError):
        parse_pod_list_json(text)


def test_missing_pod_list_file_raises_pod_list_error(tmp_path: Path) -> None:
    with pytest.raises(PodListError, match="cannot read pod list"):
        load_pod_list(tmp_path / "nope.json")


async def test_fetch_pod_list_sends_the_token_and_parses_the_answer(tmp_path: Path) -> None:
    from aiohttp import web

    from metricsd.agent.pods import fetch_pod_list

    seen: list[str] = []

    async def pods(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != "Bearer s3cret":
            return web.Response(status=401, text="Unauthorized")
        return web.Response(body=PODS_JSON.read_bytes(), content_type="application/json")

    app = web.Application()
    app.router.add_get("/pods", pods)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        token = tmp_path / "token"
        token.write_text("s3cret\n")
        index = await fetch_pod_list(f"http://127.0.0.1:{port}/pods", token, None)
        assert len(index) == 5 and index.pods[WEB_UID].workload == "web"
        token.write_text("rotated\n")  # read on every call: rotated tokens are picked up
        with pytest.raises(PodListError, match="HTTP 401"):
            await fetch_pod_list(f"http://127.0.0.1:{port}/pods", token, None)
        assert seen == ["Bearer s3cret", "Bearer rotated"]
        with pytest.raises(PodListError, match="cannot read service-account token"):
            await fetch_pod_list(f"http://127.0.0.1:{port}/pods", tmp_path / "none", None)
    finally:
        await runner.cleanup()
    with pytest.raises(PodListError, match="cannot reach kubelet"):
        await fetch_pod_list(f"http://127.0.0.1:{port}/pods", None, None, timeout_s=2.0)


@given(
    n=st.integers(min_value=0, max_value=10**12),
    suffix=st.sampled_from(["", "m", "k", "M", "G", "Ki", "Mi", "Gi", "e3", "E-2", "n", "u"]),
)
def test_parse_quantity_matches_decimal_arithmetic(n: int, suffix: str) -> None:
    from decimal import Decimal

    scale = {"": "1", "m": "0.001", "k": "1e3", "M": "1e6", "G": "1e9", "Ki": "1024", "Mi": "1048576",
             "Gi": "1073741824", "e3": "1e3", "E-2": "0.01", "n": "1e-9", "u": "1e-6"}
    assert parse_quantity(f"{n}{suffix}") == float(Decimal(n) * Decimal(scale[suffix]))
