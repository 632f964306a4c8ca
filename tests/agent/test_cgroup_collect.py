"""Collection passes over fixture trees: the right series, values, stale markers and skip counts."""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
from pathlib import Path

import pytest
from cgroup_fixture_tree import (
    BATCH_WORKER,
    DB_UID,
    PODS_JSON,
    WEB_APP,
    WEB_UID,
    build_proc,
    build_tree,
    container_dir,
    pod_dir,
    standard_pods,
)

from metricsd.agent.collect import (
    SKIP_NO_POD_LIST,
    SKIP_SANDBOX,
    SKIP_UNKNOWN_POD,
    Collection,
    Collector,
    CollectorSettings,
)
from metricsd.agent.node import NodeInfo
from metricsd.agent.pods import load_pod_list
from metricsd.model import Labels, is_stale, metric_name, validate_labels

Mi, Gi = 1024**2, 1024**3
T0 = 1_714_550_400_000


def make(tmp_path: Path, layout: str = "systemd", **kw: object) -> tuple[Collector, Path]:
    root = tmp_path / "cgroup"
    build_tree(root, layout, standard_pods())
    build_proc(tmp_path / "proc")
    settings = CollectorSettings(node_name="worker-1", cgroup_base=root, proc_root=tmp_path / "proc", **kw)  # type: ignore[arg-type]
    return Collector(settings), root


def find(c: Collection, name: str, **labels: str) -> list[tuple[Labels, float]]:
    out = []
    for lab, value in c.samples:
        d = dict(lab)
        if metric_name(lab) == name and all(d.get(k) == v for k, v in labels.items()):
            out.append((lab, value))
    return out


def value(c: Collection, name: str, **labels: str) -> float:
    hits = find(c, name, **labels)
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} series"
    return hits[0][1]


@pytest.mark.parametrize("layout", ["systemd", "cgroupfs"])
def test_pods_containers_and_values(tmp_path: Path, layout: str) -> None:
    collector, _ = make(tmp_path, layout)
    c = collector.collect(T0, load_pod_list(PODS_JSON))
    st = c.status
    assert (st.state, st.pods_in_tree, st.pods_mapped, st.containers_mapped, st.sandboxes_skipped) == (
        "partial", 5, 4, 5, 4
    )
    assert collector.skipped[SKIP_UNKNOWN_POD] == 1 and collector.skipped[SKIP_SANDBOX] == 4
    pods = {(dict(lab)["namespace"], dict(lab)["pod"], dict(lab)["container"])
            for lab, _ in find(c, "container_cpu_usage_seconds_total")}
    assert pods == {
        ("shop", "web-7d4b9c8f6d-x2x9p", "app"),
        ("shop", "web-7d4b9c8f6d-x2x9p", "sidecar"),
        ("shop", "db-0", "postgres"),
        ("monitoring", "node-exporter-abcde", "exporter"),
        ("jobs", "batch-28391234-q7x8z", "worker"),
    }
    app = {"pod": "web-7d4b9c8f6d-x2x9p", "container": "app"}
    assert value(c, "container_cpu_usage_seconds_total", **app) == 12.5
    assert value(c, "container_cpu_cfs_throttled_periods_total", **app) == 7
    assert value(c, "container_cpu_cfs_throttled_seconds_total", **app) == 0.35
    assert value(c, "container_memory_usage_bytes", **app) == 200_000_000
    assert value(c, "container_memory_working_set_bytes", **app) == 170_000_000
    assert value(c, "container_memory_rss", **app) == 150_000_000
    assert value(c, "container_oom_events_total", **app) == 1
    assert value(c, "container_cpu_usage_seconds_total", container="postgres") == 3600.0
    assert value(c, "container_memory_working_set_bytes", container="postgres") == 0  # floored
    assert value(c, "container_cpu_cfs_throttled_seconds_total", container="worker") == 9.5
    for lab, _ in c.samples:
        validate_labels(lab)


def test_labels_name_the_workload_and_node(tmp_path: Path) -> None:
    collector, _ = make(tmp_path, cluster="prod-eu")
    c = collector.collect(T0, load_pod_list(PODS_JSON))
    (lab, _) = find(c, "container_cpu_usage_seconds_total", container="app")[0]
    assert lab == (
        ("__name__", "container_cpu_usage_seconds_total"),
        ("cluster", "prod-eu"),
        ("container", "app"),
        ("namespace", "shop"),
        ("node", "worker-1"),
        ("pod", "web-7d4b9c8f6d-x2x9p"),
        ("workload", "web"),
    )
    workloads = {dict(lab)["container"]: dict(lab)["workload"] for lab, _ in find(c, "container_memory_rss")}
    assert workloads == {"app": "web", "sidecar": "web", "postgres": "db", "exporter": "node-exporter",
                         "worker": "batch-28391234"}


def test_requests_and_limits_per_container(tmp_path: Path) -> None:
    collector, _ = make(tmp_path)
    c = collector.collect(T0, load_pod_list(PODS_JSON))
    req, lim = "kube_pod_container_resource_requests", "kube_pod_container_resource_limits"
    assert value(c, req, container="app", resource="cpu", unit="core") == 0.25
    assert value(c, req, container="app", resource="memory", unit="byte") == 128 * Mi
    assert value(c, lim, container="app", resource="cpu", unit="core") == 1.0
    assert value(c, lim, container="app", resource="memory", unit="byte") == 256 * Mi
    assert value(c, req, container="sidecar", resource="cpu") == 0.05
    assert find(c, lim, container="sidecar") == []
    assert value(c, req, container="postgres", resource="memory") == 4 * Gi
    assert value(c, lim, container="postgres", resource="cpu") == 2.0
    assert value(c, req, container="worker", resource="memory") == 1e9
    assert find(c, req, container="exporter") == []
    # The pending pod has no cgroup on this node yet: no series for it.
    assert find(c, req, pod="pending-5c9f8d7b6b-zzzzz") == []
    assert {dict(lab)["workload"] for lab, _ in find(c, req, container="app")} == {"web"}


def test_node_series(tmp_path: Path) -> None:
    collector, _ = make(tmp_path)
    c = collector.collect(T0, load_pod_list(PODS_JSON))
    node = {"namespace": "kube-system", "pod": "node-worker-1", "node": "worker-1"}
    assert value(c, "kube_node_status_capacity", resource="cpu", unit="core", **node) == 4
    assert value(c, "kube_node_status_capacity", resource="memory", unit="byte", **node) == 16_384_000 * 1024
    assert value(c, "kube_node_status_allocatable", resource="cpu", **node) == 4
    assert value(c, "node_cpu_usage_seconds_total", **node) == 987.654321  # root cgroup cpu.stat
    # MemTotal - MemFree - Inactive(file), from /proc/meminfo
    assert value(c, "node_memory_working_set_bytes", **node) == (16_384_000 - 8_000_000 - 2_000_000) * 1024


def test_given_allocatable_and_proc_stat_fallback(tmp_path: Path) -> None:
    collector, root = make(tmp_path)
    (root / "cpu.stat").unlink()
    node = NodeInfo("worker-1", 8, 32 * Gi, allocatable_cpu_cores=7.5, allocatable_memory_bytes=30 * Gi)
    collector = Collector(collector.settings, node=node)
    c = collector.collect(T0, None)
    assert value(c, "kube_node_status_capacity", resource="cpu") == 8
    assert value(c, "kube_node_status_allocatable", resource="cpu") == 7.5
    assert value(c, "kube_node_status_allocatable", resource="memory") == 30 * Gi
    # /proc/stat: user + nice + system + irq + softirq + steal jiffies at USER_HZ=100
    assert value(c, "node_cpu_usage_seconds_total") == (10000 + 50 + 3000 + 0 + 150 + 25) / 100
    assert collector.skipped["cpu.stat:missing"] == 1


def test_a_removed_pod_gets_one_stale_marker_per_series_then_disappears(tmp_path: Path) -> None:
    collector, root = make(tmp_path)
    pods = load_pod_list(PODS_JSON)
    first = collector.collect(T0, pods)
    web_series = {lab for lab, _ in first.samples if dict(lab).get("pod") == "web-7d4b9c8f6d-x2x9p"}
    # 2 containers x 7 usage series + app's 4 + sidecar's 2 request/limit series
    assert len(web_series) == 2 * 7 + 4 + 2
    shutil.rmtree(pod_dir(root, "systemd", WEB_UID, "burstable"))

    second = collector.collect(T0 + 10_000, pods)
    stale = [(lab, v) for lab, v in second.samples if is_stale(v)]
    assert {lab for lab, _ in stale} == web_series
    assert len(stale) == len(web_series) == second.status.stale_markers
    live = {lab for lab, v in second.samples if not is_stale(v)}
    assert not live & web_series
    assert find(second, "container_cpu_usage_seconds_total", pod="db-0")  # others carry on

    third = collector.collect(T0 + 20_000, pods)
    assert not [v for _, v in third.samples if math.isnan(v)]
    assert not {lab for lab, _ in third.samples} & web_series


def test_a_removed_container_ends_only_its_own_series(tmp_path: Path) -> None:
    collector, root = make(tmp_path, "cgroupfs")
    pods = load_pod_list(PODS_JSON)
    collector.collect(T0, pods)
    shutil.rmtree(container_dir(pod_dir(root, "cgroupfs", WEB_UID, "burstable"), "cgroupfs", WEB_APP))
    c = collector.collect(T0 + 10_000, pods)
    stale = {lab for lab, v in c.samples if is_stale(v)}
    assert len(stale) == 7
    assert {dict(lab)["container"] for lab in stale} == {"app"}
    # The pod lives on, so app's requests and limits are still reported.
    assert value(c, "kube_pod_container_resource_requests", container="app", resource="cpu") == 0.25


def test_a_bad_file_skips_its_metrics_without_ending_the_series(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    collector, root = make(tmp_path, log_interval_ms=60_000)
    pods = load_pod_list(PODS_JSON)
    collector.collect(T0, pods)
    worker = container_dir(pod_dir(root, "systemd", "4aa9792e-831e-5eab-aa1d-72eaff8de30e", "burstable"),
                           "systemd", BATCH_WORKER)
    (worker / "cpu.stat").write_text("usage_usec 45000000\nuser_usec 3")  # truncated mid-line
    (worker / "memory.stat").write_bytes(b"\x7fELF\x02\x01\x01\x00garbage\n")
    (worker / "memory.events").unlink()
    caplog.set_level(logging.WARNING, logger="metricsd.agent.collect")
    for i in range(1, 4):
        c = collector.collect(T0 + i * 10_000, pods)
        assert c.status.file_problems == 3
        assert not [v for _, v in c.samples if is_stale(v)]
        assert value(c, "container_memory_usage_bytes", container="worker") == 700_000_000
        for name in ("container_cpu_usage_seconds_total", "container_memory_rss", "container_oom_events_total",
                     "container_memory_working_set_bytes"):
            assert find(c, name, container="worker") == []
    assert collector.skipped["cpu.stat:truncated"] == 3
    assert collector.skipped["memory.stat:garbage"] == 3
    assert collector.skipped["memory.events:missing"] == 3
    # Rate-limited: one line per reason in 30 s of passes, naming the file.
    lines = [r.getMessage() for r in caplog.records if ": skipped " in r.getMessage()]
    assert len(lines) == 3
    assert any(line.startswith("cpu.stat:truncated") and str(worker / "cpu.stat") in line for line in lines)
    c = collector.collect(T0 + 80_000, pods)
    lines = [r.getMessage() for r in caplog.records if ": skipped " in r.getMessage()]
    assert len(lines) == 6 and "2 more since the last report" in lines[-1]

    # Once the pod goes, its series (including those unreadable lately) end exactly once.
    shutil.rmtree(worker.parent)
    c = collector.collect(T0 + 90_000, pods)
    ended = {dict(lab)["__name__"] for lab, v in c.samples if is_stale(v) and dict(lab).get("container") == "worker"}
    assert "container_cpu_usage_seconds_total" in ended and "container_oom_events_total" in ended


def test_without_a_pod_list_only_the_node_is_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    collector, _ = make(tmp_path)
    caplog.set_level(logging.WARNING, logger="metricsd.agent.collect")
    c = collector.collect(T0, None)
    assert c.status.state == "no_pod_list" and c.status.pods_mapped == 0 and c.status.pods_in_tree == 5
    assert {dict(lab)["pod"] for lab, _ in c.samples} == {"node-worker-1"}
    assert collector.skipped[SKIP_NO_POD_LIST] == 5
    assert any("no pod list" in r.getMessage() for r in caplog.records)


def test_a_missing_pod_list_reuses_the_last_one(tmp_path: Path) -> None:
    collector, _ = make(tmp_path)
    first = collector.collect(T0, load_pod_list(PODS_JSON))
    second = collector.collect(T0 + 10_000, None)
    assert second.status.pod_list_stale and second.status.stale_markers == 0
    assert {lab for lab, _ in second.samples} == {lab for lab, _ in first.samples}
    assert "reusing the last one" in second.status.message


def test_a_pod_dropped_from_the_pod_list_ends_its_series(tmp_path: Path) -> None:
    collector, _ = make(tmp_path)
    pods = load_pod_list(PODS_JSON)
    collector.collect(T0, pods)
    del pods.pods[DB_UID]
    c = collector.collect(T0 + 10_000, pods)
    stale = {dict(lab)["pod"] for lab, v in c.samples if is_stale(v)}
    assert stale == {"db-0"}
    assert c.status.pods_mapped == 3 and collector.skipped[SKIP_UNKNOWN_POD] == 1 + 2


def test_no_cgroup2_hierarchy_still_reports_the_node(tmp_path: Path) -> None:
    build_proc(tmp_path / "proc")
    collector = Collector(CollectorSettings("n", cgroup_base=tmp_path / "none", proc_root=tmp_path / "proc"))
    c = collector.collect(T0, load_pod_list(PODS_JSON))
    assert c.status.state == "no_cgroup2" and "no cgroup v2 hierarchy" in c.status.message
    assert value(c, "node_cpu_usage_seconds_total") == 132.25
    assert len(c.samples) == 6


def test_real_sys_fs_cgroup_does_not_raise(caplog: pytest.LogCaptureFixture) -> None:
    """Smoke test on this machine's own tree: there may be no kubelet at all."""
    caplog.set_level(logging.INFO, logger="metricsd.agent.collect")
    collector = Collector(CollectorSettings(node_name="smoke"))
    for i in range(2):
        c = collector.collect(T0 + i * 10_000, None)
        st = c.status
        assert st.state in {"no_cgroup2", "no_kubepods", "no_pod_list", "partial", "ok"}
        assert st.message
        assert find(c, "kube_node_status_capacity", resource="cpu", pod="node-smoke")
        assert not [v for _, v in c.samples if is_stale(v)]
        for lab, _ in c.samples:
            validate_labels(lab)
    if st.pods_mapped == 0:
        assert any("no pods mapped" in r.getMessage() for r in caplog.records)


def test_a_statefulset_pod_replaced_under_the_same_name_continues_its_series(tmp_path: Path) -> None:
    collector, root = make(tmp_path)
    pods = load_pod_list(PODS_JSON)
    first = collector.collect(T0, pods)
    db_series = {lab for lab, _ in first.samples if dict(lab).get("pod") == "db-0"}
    # db-0 is deleted and recreated: a new UID, the same name and container names.
    new_uid = "0f0f0f0f-1111-2222-3333-444444444444"
    old_dir = pod_dir(root, "systemd", DB_UID, "guaranteed")
    old_dir.rename(pod_dir(root, "systemd", new_uid, "guaranteed"))
    old = pods.pods.pop(DB_UID)
    pods.pods[new_uid] = dataclasses.replace(old, uid=new_uid)
    second = collector.collect(T0 + 10_000, pods)
    assert not [lab for lab, v in second.samples if is_stale(v)]
    assert {lab for lab, _ in second.samples if dict(lab).get("pod") == "db-0"} == db_series
