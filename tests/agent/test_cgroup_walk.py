"""The kubepods tree walk and the kernel file parsers, on fixture trees in both kubelet layouts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cgroup_fixture_tree import (
    BATCH_UID,
    DB_POSTGRES,
    DB_SANDBOX,
    DB_UID,
    EXPORTER_UID,
    UNKNOWN_UID,
    WEB_APP,
    WEB_SIDECAR,
    WEB_UID,
    FixturePod,
    Stats,
    build_tree,
    container_dir,
    cpu_stat_text,
    memory_stat_text,
    pod_dir,
    standard_pods,
    write_container,
)

from metricsd.agent import cgroup
from metricsd.agent.cgroup import (
    FileProblem,
    find_cgroup2_root,
    find_kubepods,
    parse_flat_keyed,
    parse_single_int,
    read_container_stats,
    walk_kubepods,
)


@pytest.mark.parametrize("layout", ["systemd", "cgroupfs", "kind"])
def test_walk_finds_every_pod_with_its_qos_and_containers(tmp_path: Path, layout: str) -> None:
    build_tree(tmp_path, layout, standard_pods())
    walk = walk_kubepods(tmp_path)
    assert walk.kubepods is not None
    by_uid = {p.uid: p for p in walk.pods}
    assert set(by_uid) == {WEB_UID, DB_UID, EXPORTER_UID, BATCH_UID, UNKNOWN_UID}
    assert by_uid[WEB_UID].qos == "burstable"
    assert by_uid[DB_UID].qos == "guaranteed"
    assert by_uid[EXPORTER_UID].qos == "besteffort"
    assert {c.container_id for c in by_uid[WEB_UID].containers} >= {WEB_APP, WEB_SIDECAR}
    assert {c.container_id for c in by_uid[DB_UID].containers} == {DB_POSTGRES, DB_SANDBOX}
    expected_runtime = "" if layout == "cgroupfs" else "cri-containerd"
    assert {c.runtime for c in by_uid[DB_UID].containers} == {expected_runtime}


def test_systemd_uid_underscores_become_dashes(tmp_path: Path) -> None:
    build_tree(tmp_path, "systemd", [FixturePod(WEB_UID, "burstable", {WEB_APP: Stats(1)})])
    slice_name = pod_dir(tmp_path, "systemd", WEB_UID, "burstable").name
    assert slice_name == f"kubepods-burstable-pod{WEB_UID.replace('-', '_')}.slice"
    assert [p.uid for p in walk_kubepods(tmp_path).pods] == [WEB_UID]


@pytest.mark.parametrize("runtime", ["docker", "crio", "cri-containerd"])
def test_every_runtime_scope_prefix_is_a_container(tmp_path: Path, runtime: str) -> None:
    build_tree(tmp_path, "systemd", [FixturePod(DB_UID, "guaranteed", {DB_POSTGRES: Stats(1)})], runtime)
    (pod,) = walk_kubepods(tmp_path).pods
    assert [(c.container_id, c.runtime) for c in pod.containers] == [(DB_POSTGRES, runtime)]


def test_crio_conmon_scopes_are_not_containers(tmp_path: Path) -> None:
    build_tree(tmp_path, "systemd", [FixturePod(DB_UID, "guaranteed", {DB_POSTGRES: Stats(1)})], "crio")
    pod_path = pod_dir(tmp_path, "systemd", DB_UID, "guaranteed")
    write_container(pod_path / f"crio-conmon-{DB_POSTGRES}.scope", Stats(1))
    walk = walk_kubepods(tmp_path)
    assert [c.container_id for c in walk.pods[0].containers] == [DB_POSTGRES]
    assert walk.conmon_skipped == 1


def test_a_tree_without_a_kubelet_has_no_pods(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    write_container(tmp_path / "system.slice" / "sshd.service", Stats(1))
    walk = walk_kubepods(tmp_path)
    assert walk.kubepods is None and walk.pods == []


def test_cgroup2_root_in_unified_and_hybrid_mounts(tmp_path: Path) -> None:
    assert find_cgroup2_root(tmp_path) is None
    (tmp_path / "unified").mkdir()
    (tmp_path / "unified" / "cgroup.controllers").write_text("\n")
    assert find_cgroup2_root(tmp_path) == tmp_path / "unified"
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    assert find_cgroup2_root(tmp_path) == tmp_path


def test_kubepods_is_found_under_a_cgroup_root_prefix(tmp_path: Path) -> None:
    build_tree(tmp_path, "kind", [])
    (tmp_path / "kubelet.slice" / "kubelet-kubepods.slice").mkdir(parents=True, exist_ok=True)
    assert find_kubepods(tmp_path) == str(tmp_path / "kubelet.slice" / "kubelet-kubepods.slice")


def test_container_stats_read_from_kernel_formats(tmp_path: Path) -> None:
    s = Stats(usage_usec=1_234_567, nr_throttled=3, throttled_usec=4_000, memory_current=10_000,
              anon=6_000, inactive_file=2_500, oom_kill=2)
    write_container(tmp_path / "c", s)
    problems: list[FileProblem] = []
    stats = read_container_stats(tmp_path / "c", problems)
    assert problems == []
    assert stats.cpu_usage_usec == 1_234_567
    assert (stats.cpu_nr_throttled, stats.cpu_throttled_usec) == (3, 4_000)
    assert (stats.memory_current, stats.memory_anon, stats.memory_inactive_file) == (10_000, 6_000, 2_500)
    assert stats.working_set == 7_500
    assert stats.oom_kill == 2


def test_working_set_floors_at_zero(tmp_path: Path) -> None:
    write_container(tmp_path / "c", Stats(usage_usec=1, memory_current=100, inactive_file=500))
    stats = read_container_stats(tmp_path / "c", [])
    assert stats.working_set == 0


def test_cpu_stat_without_the_cpu_controller_has_no_throttling(tmp_path: Path) -> None:
    # Where the cpu controller is not enabled the kernel writes only the usage lines.
    write_container(tmp_path / "c", Stats(usage_usec=5))
    (tmp_path / "c" / "cpu.stat").write_text("usage_usec 5000\nuser_usec 4000\nsystem_usec 1000\n")
    problems: list[FileProblem] = []
    stats = read_container_stats(tmp_path / "c", problems)
    assert problems == []
    assert (stats.cpu_usage_usec, stats.cpu_nr_throttled, stats.cpu_throttled_usec) == (5000, None, None)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("", "empty"),
        ("\n", "empty"),
        ("usage_usec 12345\nuser_usec 12", "truncated"),
        ("usage_usec 12", "truncated"),
        ("usage_usec twelve\n", "garbage"),
        ("usage_usec\n", "garbage"),
        ("usage_usec 1 2\n", "garbage"),
        ("\x00\x00\x00\n", "garbage"),
        ("usage_usec 1\n\nuser_usec 2\n", "garbage"),
    ],
)
def test_flat_keyed_rejects_bad_files_with_a_reason(text: str, kind: str) -> None:
    values, problem = parse_flat_keyed(text, "/x/cpu.stat")
    assert values == {}
    assert problem is not None and problem.kind == kind and problem.reason == f"cpu.stat:{kind}"


def test_flat_keyed_reads_real_files() -> None:
    values, problem = parse_flat_keyed(cpu_stat_text(Stats(usage_usec=99, nr_throttled=2, throttled_usec=5)))
    assert problem is None
    assert values["usage_usec"] == 99 and values["nr_throttled"] == 2 and values["throttled_usec"] == 5
    values, problem = parse_flat_keyed(memory_stat_text(Stats(1, anon=10, inactive_file=20)))
    assert problem is None and values["anon"] == 10 and values["inactive_file"] == 20 and len(values) == 40


@pytest.mark.parametrize(
    ("text", "value", "kind"),
    [
        ("123456\n", 123456, None),
        ("0\n", 0, None),
        ("", None, "empty"),
        ("1234", None, "truncated"),
        ("max\n", None, "garbage"),
        ("-5\n", None, "garbage"),
        ("12\n34\n", None, "garbage"),
        ("12 34\n", None, "garbage"),
    ],
)
def test_single_int_files(text: str, value: int | None, kind: str | None) -> None:
    got, problem = parse_single_int(text, "/x/memory.current")
    assert got == value
    assert (problem.kind if problem else None) == kind


def test_missing_and_unreadable_files_are_problems_not_exceptions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = tmp_path / "c"
    write_container(c, Stats(usage_usec=1, memory_current=10, anon=5, inactive_file=1))
    (c / "memory.events").unlink()
    (c / "memory.current").unlink()
    (c / "memory.current").mkdir()  # reading a directory fails with EISDIR
    real_open = open

    def deny_cpu_stat(path: object, *args: object, **kwargs: object) -> object:
        if str(path).endswith("cpu.stat"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(cgroup, "open", deny_cpu_stat, raising=False)
    problems: list[FileProblem] = []
    stats = read_container_stats(c, problems)
    assert sorted(p.reason for p in problems) == [
        "cpu.stat:permission",
        "memory.current:io_error",
        "memory.events:missing",
    ]
    assert stats.cpu_usage_usec is None and stats.memory_current is None and stats.oom_kill is None
    assert stats.memory_anon == 5  # memory.stat was fine and is still used
    assert stats.working_set is None


def test_memory_stat_missing_a_key_is_counted(tmp_path: Path) -> None:
    c = tmp_path / "c"
    write_container(c, Stats(usage_usec=1))
    (c / "memory.stat").write_text("anon 5\nfile 7\n")
    problems: list[FileProblem] = []
    stats = read_container_stats(c, problems)
    assert [p.reason for p in problems] == ["memory.stat:missing_key"]
    assert "inactive_file" in problems[0].detail
    assert stats.memory_anon is None


def test_a_pod_removed_while_walking_is_not_a_fault(tmp_path: Path) -> None:
    pods = standard_pods()
    build_tree(tmp_path, "cgroupfs", pods)
    gone = container_dir(pod_dir(tmp_path, "cgroupfs", WEB_UID, "burstable"), "cgroupfs", WEB_APP)
    shutil.rmtree(gone)
    problems: list[FileProblem] = []
    stats = read_container_stats(gone, problems)
    assert stats.cpu_usage_usec is None
    assert {p.kind for p in problems} == {"missing"}
