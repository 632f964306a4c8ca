"""Builds cgroup v2 trees and /proc files in a temporary directory, in the kernel's own formats.

The pods match tests/agent/data/kubelet_pods.json: same UIDs, same container ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

PODS_JSON = Path(__file__).parent / "data" / "kubelet_pods.json"

WEB_UID = "e6ad2b47-524d-5472-b6fd-cd5deeb0e561"
DB_UID = "f4e2b41a-8589-5dac-abeb-5439ed42d10a"
EXPORTER_UID = "8683adea-a445-598d-89db-04bc27c8debe"
BATCH_UID = "4aa9792e-831e-5eab-aa1d-72eaff8de30e"
UNKNOWN_UID = "d18202fd-4cdf-5bca-89d0-e4c14d7d3a3e"  # in the tree, not in the pod list

WEB_APP = "a7a1d1b1b26d8785d3cae7a3b8b137b8f08991a2412713846e58baaba5683a4c"
WEB_SIDECAR = "7828cedae08e1c7f556ea42668f0c7cda7677e178258302551a40cf4d0db1c82"
WEB_SANDBOX = "9ec75e384b0c69031d9f288a010b65ada11d7886fcf167caf7e397edd8a2cbd6"
DB_POSTGRES = "8afd82ab54277fdf5ee452fd7cd1dd888278aad5cabff20ac0fc88e8d783a1b0"
DB_SANDBOX = "09ebb9fa8c69a7e131f4c937a43013142c59f0386140735b24903017a3d36a7e"
EXPORTER = "7c23ef2bf1852a6a1528202bb4c649e52cf83f135c84eceefee9d8a46ba9104c"
EXPORTER_SANDBOX = "743606bd35aeb45ed70cbdc4b79220b4e410055a7143eb36860ced415d2b7c46"
BATCH_WORKER = "dd4680cdcd113bcd22342799213fc821b058a12bb38922bea46da3485c799839"
BATCH_SANDBOX = "36871a0056a7e134f47e7f1f55f205ea7316d4b5144cf2587a93079418506498"
UNKNOWN_CONTAINER = "bec79779b47b9e9d0636bf9152bd44fe49adefd5ccd894e73b06309c4e8851bf"


@dataclass(frozen=True)
class Stats:
    usage_usec: int
    nr_throttled: int = 0
    throttled_usec: int = 0
    memory_current: int = 0
    anon: int = 0
    inactive_file: int = 0
    oom_kill: int = 0


@dataclass
class FixturePod:
    uid: str
    qos: str  # guaranteed, burstable, besteffort
    containers: dict[str, Stats] = field(default_factory=dict)  # container id -> stats


def cpu_stat_text(s: Stats) -> str:
    user = s.usage_usec * 3 // 4
    return (
        f"usage_usec {s.usage_usec}\n"
        f"user_usec {user}\n"
        f"system_usec {s.usage_usec - user}\n"
        "core_sched.force_idle_usec 0\n"
        f"nr_periods {s.nr_throttled * 10 + 100}\n"
        f"nr_throttled {s.nr_throttled}\n"
        f"throttled_usec {s.throttled_usec}\n"
        "nr_bursts 0\n"
        "burst_usec 0\n"
    )


def memory_stat_text(s: Stats) -> str:
    file = s.inactive_file * 2
    active_anon = s.anon // 3
    fields = [
        ("anon", s.anon),
        ("file", file),
        ("kernel", 1486848),
        ("kernel_stack", 163840),
        ("pagetables", 462848),
        ("sec_pagetables", 0),
        ("percpu", 5056),
        ("sock", 0),
        ("vmalloc", 8192),
        ("shmem", 0),
        ("zswap", 0),
        ("zswapped", 0),
        ("file_mapped", 4096),
        ("file_dirty", 0),
        ("file_writeback", 0),
        ("swapcached", 0),
        ("anon_thp", 0),
        ("file_thp", 0),
        ("shmem_thp", 0),
        ("inactive_anon", s.anon - active_anon),
        ("active_anon", active_anon),
        ("inactive_file", s.inactive_file),
        ("active_file", file - s.inactive_file),
        ("unevictable", 0),
        ("slab_reclaimable", 200704),
        ("slab_unreclaimable", 470776),
        ("slab", 671480),
        ("workingset_refault_anon", 0),
        ("workingset_refault_file", 12),
        ("workingset_activate_anon", 0),
        ("workingset_activate_file", 3),
        ("workingset_restore_anon", 0),
        ("workingset_restore_file", 0),
        ("workingset_nodereclaim", 0),
        ("pgscan", 0),
        ("pgsteal", 0),
        ("pgfault", 48213),
        ("pgmajfault", 7),
        ("thp_fault_alloc", 0),
        ("thp_collapse_alloc", 0),
    ]
    return "".join(f"{k} {v}\n" for k, v in fields)


def memory_events_text(s: Stats) -> str:
    return f"low 0\nhigh 0\nmax {s.oom_kill * 3}\noom {s.oom_kill}\noom_kill {s.oom_kill}\noom_group_kill 0\n"


def write_container(path: Path, s: Stats) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "cpu.stat").write_text(cpu_stat_text(s))
    (path / "memory.current").write_text(f"{s.memory_current}\n")
    (path / "memory.stat").write_text(memory_stat_text(s))
    (path / "memory.events").write_text(memory_events_text(s))
    (path / "cgroup.procs").write_text("4242\n")


def pod_dir(root: Path, layout: str, uid: str, qos: str) -> Path:
    """Where the kubelet puts a pod cgroup for ``layout``: systemd, cgroupfs, or kind (systemd
    with --cgroup-root=/kubelet)."""
    if layout == "cgroupfs":
        base = root / "kubepods"
        return base / f"pod{uid}" if qos == "guaranteed" else base / qos / f"pod{uid}"
    prefix = "kubelet-kubepods" if layout == "kind" else "kubepods"
    base = root / "kubelet.slice" / "kubelet-kubepods.slice" if layout == "kind" else root / "kubepods.slice"
    escaped = uid.replace("-", "_")
    if qos == "guaranteed":
        return base / f"{prefix}-pod{escaped}.slice"
    return base / f"{prefix}-{qos}.slice" / f"{prefix}-{qos}-pod{escaped}.slice"


def container_dir(pod_path: Path, layout: str, container_id: str, runtime: str = "cri-containerd") -> Path:
    if layout == "cgroupfs":
        return pod_path / container_id
    return pod_path / f"{runtime}-{container_id}.scope"


def build_tree(root: Path, layout: str, pods: list[FixturePod], runtime: str = "cri-containerd") -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    (root / "cpu.stat").write_text(
        "usage_usec 987654321\nuser_usec 700000000\nsystem_usec 287654321\n"
        "core_sched.force_idle_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n"
        "nr_bursts 0\nburst_usec 0\n"
    )
    # Unrelated system cgroups the walk must leave alone.
    write_container(root / "system.slice" / "containerd.service", Stats(usage_usec=5))
    write_container(root / "user.slice", Stats(usage_usec=6))
    for pod in pods:
        p = pod_dir(root, layout, pod.uid, pod.qos)
        write_container(p, Stats(usage_usec=1))  # the pod cgroup has its own files too
        for cid, stats in pod.containers.items():
            write_container(container_dir(p, layout, cid, runtime), stats)


def build_proc(proc: Path, cpus: int = 4, mem_total_kb: int = 16_384_000) -> None:
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "cpuinfo").write_text(
        "".join(
            f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: Fixture CPU @ 2.00GHz\n"
            f"cpu MHz\t\t: 2000.000\ncache size\t: 32768 KB\n\n"
            for i in range(cpus)
        )
    )
    (proc / "meminfo").write_text(
        f"MemTotal:       {mem_total_kb} kB\n"
        "MemFree:         8000000 kB\n"
        "MemAvailable:   12000000 kB\n"
        "Buffers:          100000 kB\n"
        "Cached:          4000000 kB\n"
        "SwapCached:            0 kB\n"
        "Active:          3000000 kB\n"
        "Inactive:        2500000 kB\n"
        "Active(anon):    1000000 kB\n"
        "Inactive(anon):   500000 kB\n"
        "Active(file):    2000000 kB\n"
        "Inactive(file):  2000000 kB\n"
        "HugePages_Total:       0\n"
        "Hugepagesize:       2048 kB\n"
    )
    (proc / "stat").write_text(
        "cpu  10000 50 3000 900000 200 0 150 25 0 0\n"
        "cpu0 5000 25 1500 450000 100 0 75 12 0 0\n"
        "cpu1 5000 25 1500 450000 100 0 75 13 0 0\n"
        "intr 12345 0 0\nctxt 987654\nbtime 1714550000\n"
    )


def standard_pods() -> list[FixturePod]:
    """The pods of kubelet_pods.json as they run on the node, plus a pod the list does not know."""
    return [
        FixturePod(
            WEB_UID,
            "burstable",
            {
                WEB_APP: Stats(
                    usage_usec=12_500_000,
                    nr_throttled=7,
                    throttled_usec=350_000,
                    memory_current=200_000_000,
                    anon=150_000_000,
                    inactive_file=30_000_000,
                    oom_kill=1,
                ),
                WEB_SIDECAR: Stats(usage_usec=2_000_000, memory_current=40_000_000, anon=30_000_000,
                                   inactive_file=5_000_000),
                WEB_SANDBOX: Stats(usage_usec=10_000, memory_current=400_000, anon=300_000),
            },
        ),
        FixturePod(
            DB_UID,
            "guaranteed",
            {
                # More inactive page cache than current usage: the working set floors at 0.
                DB_POSTGRES: Stats(usage_usec=3_600_000_000, memory_current=1_000_000, anon=500_000,
                                   inactive_file=2_000_000),
                DB_SANDBOX: Stats(usage_usec=20_000, memory_current=300_000, anon=200_000),
            },
        ),
        FixturePod(
            EXPORTER_UID,
            "besteffort",
            {
                EXPORTER: Stats(usage_usec=900_000, memory_current=20_000_000, anon=15_000_000,
                                inactive_file=1_000_000),
                EXPORTER_SANDBOX: Stats(usage_usec=5_000, memory_current=200_000),
            },
        ),
        FixturePod(
            BATCH_UID,
            "burstable",
            {
                BATCH_WORKER: Stats(usage_usec=45_000_000, nr_throttled=120, throttled_usec=9_500_000,
                                    memory_current=700_000_000, anon=650_000_000, inactive_file=20_000_000),
                BATCH_SANDBOX: Stats(usage_usec=4_000, memory_current=250_000),
            },
        ),
        FixturePod(UNKNOWN_UID, "besteffort", {UNKNOWN_CONTAINER: Stats(usage_usec=77)}),
    ]
