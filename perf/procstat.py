"""CPU seconds and RSS of a process from /proc (Linux), for benchmarks of server processes."""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


def rss_bytes(pid: int) -> int:
    return status_kib(pid, ("VmRSS",))["VmRSS"] * 1024


def status_kib(pid: int, keys: tuple[str, ...]) -> dict[str, int]:
    """Fields of /proc/<pid>/status given in kB (e.g. RssAnon, RssFile, RssShmem), in KiB; 0 if absent."""
    out = dict.fromkeys(keys, 0)
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in out:
            out[key] = int(line.split()[1])
    return out


def peak_rss_bytes(pid: int) -> int:
    return status_kib(pid, ("VmHWM",))["VmHWM"] * 1024


def mappings_kib(pid: int) -> list[tuple[str, int]]:
    """Each mapping's resident KiB and name (its file, [heap], [stack], or [anon] for a nameless
    one) from /proc/<pid>/smaps, largest first."""
    out: list[tuple[str, int]] = []
    name = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        f = line.split()
        if f and "-" in f[0] and not f[0].endswith(":"):
            name = f[5] if len(f) >= 6 else "[anon]"
        elif f and f[0] == "Rss:":
            out.append((name, int(f[1])))
    return sorted(out, key=lambda m: -m[1])
