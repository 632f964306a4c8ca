"""The node itself: its capacity (from /proc) and its own CPU and memory use.

A kubelet reports capacity and allocatable in the Node object; an agent on a node without a
kubelet, or one that does not read the Node, takes capacity from /proc and treats all of it as
allocatable unless told otherwise. Readers never raise: an unusable file becomes a FileProblem.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from metricsd.agent.cgroup import FileProblem, read_flat_keyed

__all__ = [
    "NodeInfo",
    "NodeUsage",
    "parse_cpuinfo",
    "parse_meminfo",
    "parse_proc_stat_cpu_seconds",
    "read_local_node_info",
    "read_node_usage",
]

# USER_HZ, the unit of /proc/stat: 100 on every Linux ABI Kubernetes runs on.
_USER_HZ = 100


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """Capacity and allocatable in base units (cores, bytes); allocatable None means = capacity."""

    name: str
    cpu_cores: float
    memory_bytes: float
    allocatable_cpu_cores: float | None = None
    allocatable_memory_bytes: float | None = None

    @property
    def allocatable_cpu(self) -> float:
        return self.cpu_cores if self.allocatable_cpu_cores is None else self.allocatable_cpu_cores

    @property
    def allocatable_memory(self) -> float:
        return self.memory_bytes if self.allocatable_memory_bytes is None else self.allocatable_memory_bytes


@dataclass(frozen=True, slots=True)
class NodeUsage:
    cpu_seconds: float | None  # a counter since boot
    memory_working_set_bytes: float | None


def parse_cpuinfo(text: str) -> int:
    """The number of logical CPUs: one ``processor`` line each (the same on x86 and arm64)."""
    return sum(1 for line in text.splitlines() if line.split(":", 1)[0].strip() == "processor")


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo in bytes: ``MemTotal:  24683656 kB`` -> {"MemTotal": 25276063744}."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not parts or not parts[0].isdigit():
            continue
        scale = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
        out[key.strip()] = int(parts[0]) * scale
    return out


def parse_proc_stat_cpu_seconds(text: str) -> float | None:
    """Busy CPU seconds since boot from the aggregate ``cpu`` line of /proc/stat: every field but
    idle and iowait (guest time is already inside user and nice, so it is not added twice)."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            try:
                fields = [int(p) for p in parts[1:9]]
            except ValueError:
                return None
            if len(fields) < 4:
                return None
            fields += [0] * (8 - len(fields))
            user, nice, system, _idle, _iowait, irq, softirq, steal = fields
            return (user + nice + system + irq + softirq + steal) / _USER_HZ
    return None


def _read(path: Path, problems: list[FileProblem]) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        problems.append(FileProblem(str(path), "missing"))
    except PermissionError:
        problems.append(FileProblem(str(path), "permission"))
    except (OSError, UnicodeDecodeError) as e:
        problems.append(FileProblem(str(path), "io_error", str(e)))
    return None


def read_local_node_info(
    name: str,
    proc_root: Path = Path("/proc"),
    *,
    allocatable_cpu_cores: float | None = None,
    allocatable_memory_bytes: float | None = None,
    problems: list[FileProblem] | None = None,
) -> NodeInfo:
    """Capacity of the machine we run on. A count that cannot be read is reported as 0 (and the
    problem appended) rather than guessed."""
    sink: list[FileProblem] = [] if problems is None else problems
    cpuinfo = _read(proc_root / "cpuinfo", sink)
    meminfo = _read(proc_root / "meminfo", sink)
    cores = parse_cpuinfo(cpuinfo) if cpuinfo is not None else 0
    mem = parse_meminfo(meminfo).get("MemTotal", 0) if meminfo is not None else 0
    return NodeInfo(name, float(cores), float(mem), allocatable_cpu_cores, allocatable_memory_bytes)


def read_node_usage(cgroup_root: Path | None, proc_root: Path, problems: list[FileProblem]) -> NodeUsage:
    """The whole node's CPU and memory, as the kubelet computes them on cgroup v2.

    CPU: the root cgroup's ``cpu.stat`` usage_usec, else /proc/stat. Memory: the root cgroup has
    no memory.current, so (as cAdvisor does) usage is MemTotal - MemFree and the working set
    subtracts Inactive(file), floored at 0.
    """
    cpu: float | None = None
    if cgroup_root is not None:
        stat = read_flat_keyed(cgroup_root / "cpu.stat", ("usage_usec",), problems)
        if stat is not None:
            cpu = stat["usage_usec"] / 1e6
    if cpu is None:
        text = _read(proc_root / "stat", problems)
        if text is not None:
            cpu = parse_proc_stat_cpu_seconds(text)
            if cpu is None:
                problems.append(FileProblem(str(proc_root / "stat"), "garbage", "no cpu line"))
    memory: float | None = None
    text = _read(proc_root / "meminfo", problems)
    if text is not None:
        info = parse_meminfo(text)
        if all(k in info for k in ("MemTotal", "MemFree", "Inactive(file)")):
            memory = float(max(0, info["MemTotal"] - info["MemFree"] - info["Inactive(file)"]))
        else:
            problems.append(FileProblem(str(proc_root / "meminfo"), "missing_key"))
    return NodeUsage(cpu, memory)
