"""The kubelet's cgroup v2 tree: where pods and containers live in it, and how its files read.

The kubelet lays pods out in one of two ways, depending on its cgroup driver:

- systemd: ``kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_with_underscores>.slice/
  cri-containerd-<id>.scope`` (also ``docker-<id>.scope``, ``crio-<id>.scope``); Guaranteed pods sit
  directly under ``kubepods.slice`` as ``kubepods-pod<uid>.slice``. With ``--cgroup-root`` set (kind,
  some managed nodes) every name gains a prefix: ``kubelet-kubepods-burstable-pod<uid>.slice``.
- cgroupfs: ``kubepods/<qos>/pod<uid>/<id>``; Guaranteed pods as ``kubepods/pod<uid>/<id>``.

Reading never raises: a file that is missing, unreadable or malformed becomes a ``FileProblem``
that the caller counts and logs, and the metrics that depended on it are left out of the pass.
Everything here is a function of the paths and texts given; nothing keeps state.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

__all__ = [
    "ContainerCgroup",
    "ContainerStats",
    "FileProblem",
    "PodCgroup",
    "TreeWalk",
    "find_cgroup2_root",
    "find_kubepods",
    "parse_flat_keyed",
    "parse_single_int",
    "read_container_stats",
    "read_flat_keyed",
    "read_single_int",
    "walk_kubepods",
]

QOS_GUARANTEED = "guaranteed"
QOS_BURSTABLE = "burstable"
QOS_BESTEFFORT = "besteffort"

# The kubelet's names for the kubepods cgroup, with and without a --cgroup-root prefix.
_KUBEPODS_RE = re.compile(r"^(?:[\w.-]+-)?kubepods(?:\.slice)?$")
_QOS_RE = re.compile(r"^(?:[\w.-]*kubepods-)?(burstable|besteffort)(?:\.slice)?$")
# pod<uid>: the systemd driver escapes '-' in the UID as '_'. Static pods have 32-hex UIDs.
_POD_RE = re.compile(r"^(?:[\w.-]*-)?pod([0-9a-fA-F_-]{8,64})(?:\.slice)?$")
# The flat keyed format, whole: "<key> <integer>\n" lines and nothing else.
_FLAT_KEYED_RE = re.compile(r"(?:[!-~]+ -?[0-9]+\n)+")
# A container: a runtime prefix (systemd driver) or a bare id (cgroupfs driver).
_CONTAINER_RE = re.compile(r"^(?:(cri-containerd|containerd|docker|crio|cri-o)-)?([0-9a-f]{12,128})(?:\.scope)?$")
# CRI-O's monitor process: a sibling of the container, never one itself.
_CONMON_RE = re.compile(r"^crio-conmon-[0-9a-f]+(?:\.scope)?$")

# Paths are handled as strings on the hot path: pathlib costs more than reading the files.
StrPath: TypeAlias = "str | os.PathLike[str]"

# How deep under the cgroup v2 root the kubepods cgroup may sit (kind nests it under kubelet.slice).
_KUBEPODS_SEARCH_DEPTH = 3


@dataclass(frozen=True, slots=True)
class FileProblem:
    """One cgroup file that could not be used this pass. ``kind`` is a short, countable reason:
    missing, permission, io_error, empty, truncated, garbage, missing_key."""

    path: str
    kind: str
    detail: str = ""

    @property
    def file(self) -> str:
        return os.path.basename(self.path)

    @property
    def reason(self) -> str:
        """The counter key: which file and what was wrong with it, e.g. ``cpu.stat:garbage``."""
        return f"{self.file}:{self.kind}"


@dataclass(frozen=True, slots=True)
class ContainerCgroup:
    container_id: str
    runtime: str  # "cri-containerd", "docker", "crio", ... or "" for a bare cgroupfs id
    path: str


@dataclass(slots=True)
class PodCgroup:
    uid: str  # with dashes, as in the pod's metadata.uid
    qos: str  # guaranteed, burstable or besteffort, from where the pod sits in the tree
    path: str
    containers: list[ContainerCgroup] = field(default_factory=list)


@dataclass(slots=True)
class TreeWalk:
    """What one walk of the kubepods tree found. ``kubepods`` is None when there is no kubelet."""

    kubepods: str | None
    pods: list[PodCgroup] = field(default_factory=list)
    conmon_skipped: int = 0
    vanished: int = 0  # directories that disappeared while being listed: normal churn, not a fault


@dataclass(slots=True)
class ContainerStats:
    """One container's counters and gauges, each None when its file could not be used."""

    cpu_usage_usec: int | None = None
    cpu_nr_throttled: int | None = None
    cpu_throttled_usec: int | None = None
    memory_current: int | None = None
    memory_inactive_file: int | None = None
    memory_anon: int | None = None
    oom_kill: int | None = None

    @property
    def working_set(self) -> int | None:
        """cAdvisor's working set: usage minus the page cache the kernel can drop first, at least 0."""
        if self.memory_current is None or self.memory_inactive_file is None:
            return None
        return max(0, self.memory_current - self.memory_inactive_file)


def find_cgroup2_root(base: Path) -> Path | None:
    """The cgroup v2 hierarchy at ``base`` (unified mode) or at ``base/unified`` (hybrid mode)."""
    for candidate in (base, base / "unified"):
        if (candidate / "cgroup.controllers").is_file():
            return candidate
    return None


def find_kubepods(root: StrPath) -> str | None:
    """The kubelet's kubepods cgroup under a cgroup v2 root, searched breadth-first a few levels deep."""
    level = [os.fspath(root)]
    for _ in range(_KUBEPODS_SEARCH_DEPTH):
        nxt: list[str] = []
        for directory in level:
            for name, path in _subdirs(directory):
                if _KUBEPODS_RE.match(name):
                    return path
                nxt.append(path)
        level = nxt
    return None


def walk_kubepods(root: StrPath, kubepods_hint: str | None = None) -> TreeWalk:
    """Every pod cgroup and its container cgroups under a cgroup v2 root; never raises.

    A QoS cgroup (burstable, besteffort) holds pod cgroups; a pod cgroup directly under kubepods
    is Guaranteed. Anything else in the tree (system slices, conmon scopes) is left alone.
    ``kubepods_hint``, the ``kubepods`` of an earlier walk, saves searching for it again while it
    still exists.
    """
    if kubepods_hint is not None and os.path.isdir(kubepods_hint):
        kubepods: str | None = kubepods_hint
    else:
        kubepods = find_kubepods(root)
    walk = TreeWalk(kubepods=kubepods)
    if kubepods is None:
        return walk
    top = _subdirs(kubepods, walk)
    for name, path in top:
        qos_match = _QOS_RE.match(name)
        if qos_match:
            for pod_name, pod_path in _subdirs(path, walk):
                _add_pod(walk, pod_name, pod_path, qos_match.group(1))
        else:
            _add_pod(walk, name, path, QOS_GUARANTEED)
    return walk


def _add_pod(walk: TreeWalk, name: str, path: str, qos: str) -> None:
    m = _POD_RE.match(name)
    if not m:
        return
    pod = PodCgroup(uid=m.group(1).replace("_", "-").lower(), qos=qos, path=path)
    for child, child_path in _subdirs(path, walk):
        if _CONMON_RE.match(child):
            walk.conmon_skipped += 1
            continue
        cm = _CONTAINER_RE.match(child)
        if cm:
            pod.containers.append(ContainerCgroup(cm.group(2), cm.group(1) or "", child_path))
    walk.pods.append(pod)


def _subdirs(directory: str, walk: TreeWalk | None = None) -> list[tuple[str, str]]:
    try:
        with os.scandir(directory) as it:
            out = []
            for entry in it:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        out.append((entry.name, entry.path))
                except OSError:
                    continue
            out.sort()
            return out
    except OSError:
        # The pod ended between listing its parent and listing it, or we may not read it.
        if walk is not None:
            walk.vanished += 1
        return []


# --- file formats --------------------------------------------------------------------------------


def parse_flat_keyed(text: str, path: str = "") -> tuple[dict[str, int], FileProblem | None]:
    """Parse the kernel's flat keyed format (``cpu.stat``, ``memory.stat``, ``memory.events``).

    Each line is ``<key> <integer>\\n``. The kernel always ends the file with a newline, so a file
    without one is a truncated read (its last number may be cut short); any bad line is garbage.
    Either way the whole file is rejected: a half-understood file is worse than none.
    """
    if not text.strip():
        return {}, FileProblem(path, "empty")
    if not text.endswith("\n"):
        return {}, FileProblem(path, "truncated", f"no final newline after {text[-40:]!r}")
    if _FLAT_KEYED_RE.fullmatch(text):
        # Fast path (the common case): the whole file checked by one regex, then split in C.
        parts = text.split()
        return dict(zip(parts[0::2], map(int, parts[1::2]), strict=True)), None
    for i, line in enumerate(text[:-1].split("\n")):
        parts = line.split()
        if len(parts) != 2 or _to_int(parts[1]) is None:
            return {}, FileProblem(path, "garbage", f"line {i + 1}: {line[:60]!r}")
    # Every line looks right, yet the regex refused: odd whitespace, which the kernel never writes.
    return {}, FileProblem(path, "garbage", "unexpected whitespace")


def parse_single_int(text: str, path: str = "") -> tuple[int | None, FileProblem | None]:
    """Parse a one-value file such as ``memory.current``: a non-negative integer and a newline."""
    if not text.strip():
        return None, FileProblem(path, "empty")
    value = _to_int(text.strip())
    if value is not None and value >= 0 and text.endswith("\n") and text.count("\n") == 1:
        return value, None
    # Digits without the kernel's newline: the read stopped early and the number may be short.
    kind = "truncated" if value is not None and not text.endswith("\n") else "garbage"
    return None, FileProblem(path, kind, repr(text[:60]))


def _to_int(text: str) -> int | None:
    if not text or not (text.isdigit() or (text[0] == "-" and text[1:].isdigit())):
        return None
    return int(text)


def _read_text(path: str) -> tuple[str | None, FileProblem | None]:
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 16)
    except FileNotFoundError:
        return None, FileProblem(path, "missing")
    except PermissionError:
        return None, FileProblem(path, "permission")
    except OSError as e:
        kind = "missing" if e.errno in (errno.ENOENT, errno.ENODEV) else "io_error"
        return None, FileProblem(path, kind, e.strerror or "")
    try:
        return data.decode("ascii"), None
    except UnicodeDecodeError:
        return None, FileProblem(path, "garbage", "not ASCII")


def _read_noting(path: str, problems: list[FileProblem]) -> str | None:
    """The file's text, or None with the reason appended to ``problems``."""
    text, problem = _read_text(path)
    if text is None:
        assert problem is not None
        problems.append(problem)
    return text


def read_flat_keyed(
    path: StrPath, required: tuple[str, ...], problems: list[FileProblem]
) -> dict[str, int] | None:
    """Read and parse a flat keyed file; None (and a problem appended) unless all ``required`` keys
    are there."""
    path = os.fspath(path)
    text = _read_noting(path, problems)
    if text is None:
        return None
    values, problem = parse_flat_keyed(text, path)
    if problem is not None:
        problems.append(problem)
        return None
    absent = [k for k in required if k not in values]
    if absent:
        problems.append(FileProblem(path, "missing_key", ",".join(absent)))
        return None
    return values


def read_single_int(path: StrPath, problems: list[FileProblem]) -> int | None:
    path = os.fspath(path)
    text = _read_noting(path, problems)
    if text is None:
        return None
    value, problem = parse_single_int(text, path)
    if problem is not None:
        problems.append(problem)
    return value


def read_container_stats(path: StrPath, problems: list[FileProblem]) -> ContainerStats:
    """Read one container cgroup's files; each unusable file is appended to ``problems`` and only
    the metrics that needed it are missing from the result."""
    base = os.fspath(path)
    stats = ContainerStats()
    cpu = read_flat_keyed(os.path.join(base, "cpu.stat"), ("usage_usec",), problems)
    if cpu is not None:
        stats.cpu_usage_usec = cpu["usage_usec"]
        # nr_throttled and throttled_usec exist only where the cpu controller is enabled.
        stats.cpu_nr_throttled = cpu.get("nr_throttled")
        stats.cpu_throttled_usec = cpu.get("throttled_usec")
    stats.memory_current = read_single_int(os.path.join(base, "memory.current"), problems)
    mem = read_flat_keyed(os.path.join(base, "memory.stat"), ("anon", "inactive_file"), problems)
    if mem is not None:
        stats.memory_anon = mem["anon"]
        stats.memory_inactive_file = mem["inactive_file"]
    events = read_flat_keyed(os.path.join(base, "memory.events"), ("oom_kill",), problems)
    if events is not None:
        stats.oom_kill = events["oom_kill"]
    return stats
