"""CPU seconds and RSS of a process from /proc (Linux), for benchmarks of server processes."""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def status_kib(pid: int, keys: tuple[str, ...]) -> dict[str, int]:
    """Fields of /proc/<pid>/status given in kB (e.g. RssAnon, RssFile, RssShmem), in KiB; 0 if absent."""
    out = dict.fromkeys(keys, 0)
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in out:
            out[key] = int(line.split()[1])
    return out


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0
